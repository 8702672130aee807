"""Dispatch on a Ray cluster: from a slot freed (an attempt's end, as the ledger records it) to the next
experiment's first command on its node, and the makespan of a sweep of short stand-in runs over the ideal (total
work / slots), against the same sweeps on this machine's own slots (the local backend) and against Ray Tune
running the same stand-in as its trials on the same cluster. Interleaved rounds.

A real Ray cluster on this machine (tests/ray_lab.py's kind: raylets on loopback with fake GPUs): for the gaps a
one-node cluster with one GPU (every experiment waits for the one before it: each gap is one dispatch), for the
makespan one node with 8 GPUs (8 slots). Ray Tune runs in a process of its own (`--tune-child`), as a user's
script would: one trial per experiment, each asking for one GPU, running the stand-in as a command; its
makespan is from the first trial's command to the last one's end, as the trials record them. Ray Tune is given
`reuse_actors=True` (its default is False), as autotune reuses its leases.

  python benchmarks/ray_dispatch.py --experiments 20 --short 500 --slots 8 --rounds 3

Needs `ray[tune]` for the Ray Tune figure (`pip install 'ds-autotune[ray-bench]'`).
"""
from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read by Ray when it is imported: loopback only

from autotuner.ledger.store import Ledger  # noqa: E402

# Each experiment logs when its command started on the node, writes its metrics, then sleeps $1 seconds.
STANDIN = """#!/bin/sh
python3 -c 'import time; print(time.time())' > "$(dirname "$AUTOTUNE_METRICS_PATH")/began"
printf '{"throughput": 1.0}\\n' > "$AUTOTUNE_METRICS_PATH"
exec sleep "$1"
"""


def sweep(directory: Path, n: int) -> Path:
    (directory / "train.py").touch()
    path = directory / f"sweep{n}.hjson"
    path.write_text(f'{{"name": "d", "script": "train.py", "num_gpus": 1, '
                    f'"ds_config": {{"train_micro_batch_size_per_gpu": 1}}, "space": {{"x": {list(range(n))}}}}}\n')
    return path


def standin(work: Path) -> Path:
    launcher = work / "standin.sh"
    launcher.write_text(STANDIN)
    return launcher


def run_sweep(work: Path, n: int, seconds: float, env: dict[str, str], *where: str) -> Path:
    results = work / f"r-{time.monotonic_ns()}"
    # The stand-in's seconds go in its own words: a Ray node's environment is its own, not the runner's.
    done = subprocess.run([sys.executable, "-m", "autotuner.cli", "run", str(sweep(work, n)), *where,
                           "--launcher", f"sh {standin(work)} {seconds:g}", "-o", str(results), "-q"],
                          env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    return results


def gaps(results: Path) -> list[float]:
    """Seconds from each attempt's recorded end to the next one's first command."""
    with Ledger.open(results) as ledger:
        runs = sorted(ledger.latest(), key=lambda a: a.started_at or 0)
    return [float((results / after.name / "began").read_text()) - (before.finished_at or 0)
            for before, after in itertools.pairwise(runs)]


def makespan_ratio(results: Path, seconds: float, slots: int) -> float:
    with Ledger.open(results) as ledger:
        runs = ledger.latest()
    span = max(a.finished_at or 0 for a in runs) - min(a.started_at or 0 for a in runs)
    return span / (len(runs) * seconds / slots)


def tune_ratio(work: Path, address: str, n: int, seconds: float, slots: int, env: dict[str, str]) -> float:
    """Ray Tune's makespan over the ideal, from a process of its own (`--tune-child`)."""
    done = subprocess.run([sys.executable, __file__, "--tune-child", address, str(work / f"t-{time.monotonic_ns()}"),
                           str(n), f"{seconds:g}", str(standin(work))], env=env, capture_output=True, text=True,
                          timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    span = float(done.stdout.strip().splitlines()[-1])
    return span / (n * seconds / slots)


def tune_child(address: str, work: Path, n: int, seconds: float, script: Path) -> None:
    """Ray Tune running the stand-in as `n` trials of one GPU each; prints the makespan the trials recorded."""
    import ray
    from ray import tune

    work.mkdir(parents=True)

    def trial(config: dict[str, int]) -> dict[str, float]:
        directory = work / f"trial{config['x']}"
        directory.mkdir()
        began = time.time()
        subprocess.run(["sh", str(script), f"{seconds:g}"], check=True,
                       env={**os.environ, "AUTOTUNE_METRICS_PATH": str(directory / "metrics.json")})
        return {"throughput": 1.0, "began": began, "ended": time.time()}

    ray.init(address=address, log_to_driver=False)
    tuner = tune.Tuner(tune.with_resources(trial, {"cpu": 0, "gpu": 1}),
                       param_space={"x": tune.grid_search(list(range(n)))},
                       tune_config=tune.TuneConfig(reuse_actors=True),  # its best case here: as autotune's leases
                       run_config=tune.RunConfig(storage_path=str(work / "tune"), verbose=0))
    frame = tuner.fit().get_dataframe()
    print(float(frame["ended"].max() - frame["began"].min()))


def summary(label: str, values: list[float], unit: str = "ms") -> str:
    ms = sorted(v * (1000 if unit == "ms" else 1) for v in values)
    return (f"{label:<44} n={len(ms):3}  median {statistics.median(ms):8.2f} {unit}  "
            f"p90 {ms[int(len(ms) * 0.9)]:8.2f} {unit}  max {ms[-1]:8.2f} {unit}")


def cluster(nodes: int, gpus: int):  # -> ray.cluster_utils.Cluster (Ray imported only here)
    from ray.cluster_utils import Cluster

    lab = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": gpus,
                                                        "node_ip_address": "127.0.0.1"})
    for _ in range(nodes - 1):
        lab.add_node(num_cpus=2, num_gpus=gpus, node_ip_address="127.0.0.1")
    return lab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiments", type=int, default=20, help="one after another, for the gaps")
    parser.add_argument("--short", type=int, default=500, help="0.2 s runs on --slots GPUs, for the makespan")
    parser.add_argument("--slots", type=int, default=8, help="GPUs of the one node for the makespan")
    parser.add_argument("--rounds", type=int, default=3, help="sweeps per kind, interleaved")
    parser.add_argument("--no-tune", action="store_true", help="leave Ray Tune out")
    parser.add_argument("--tune-child", nargs=5, metavar=("ADDRESS", "DIR", "N", "SECONDS", "SCRIPT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tune_child:
        address, work, n, seconds, script = args.tune_child
        tune_child(address, Path(work), int(n), float(seconds), Path(script))
        return
    plain = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    found: dict[str, list[float]] = {"ray (autotune --ray)": [], "local slot (autotune --slots 1)": []}
    ratios: dict[str, list[float]] = {f"autotune --ray, {args.slots} GPUs": [],
                                      f"autotune --slots {args.slots} (local)": [],
                                      f"Ray Tune, {args.slots} GPUs": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        one = cluster(1, 1)
        try:
            env = {**plain, "RAY_ADDRESS": one.address}
            time.sleep(5)  # the raylet registered
            for _ in range(args.rounds):
                found["ray (autotune --ray)"] += gaps(run_sweep(work, args.experiments, 0, env, "--ray"))
                found["local slot (autotune --slots 1)"] += gaps(run_sweep(work, args.experiments, 0, plain,
                                                                          "--slots", "1"))
        finally:
            one.shutdown()
        wide = cluster(1, args.slots)
        try:
            env = {**plain, "RAY_ADDRESS": wide.address}
            time.sleep(5)
            for _ in range(args.rounds):
                labels = iter(ratios)
                ratios[next(labels)].append(makespan_ratio(run_sweep(work, args.short, 0.2, env, "--ray"), 0.2,
                                                           args.slots))
                ratios[next(labels)].append(makespan_ratio(run_sweep(work, args.short, 0.2, plain, "--slots",
                                                                     str(args.slots)), 0.2, args.slots))
                if not args.no_tune:
                    ratios[next(labels)].append(tune_ratio(work, wide.address, args.short, 0.2, args.slots, env))
                print(f"round: {[f'{v[-1]:.2f}' for v in ratios.values() if v]}", file=sys.stderr, flush=True)
        finally:
            wide.shutdown()
    for label, values in found.items():
        print(summary(f"gap: {label}", values))
    for label, values in ratios.items():
        if values:
            print(summary(f"makespan/ideal: {label}", values, unit="x"))


if __name__ == "__main__":
    main()
