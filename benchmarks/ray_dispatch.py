"""Dispatch on a Ray cluster: from a slot freed (an attempt's end, as the ledger records it) to the next
experiment's first command on its node, and the makespan of a sweep of short stand-in runs over the ideal (total
work / slots), against the same sweeps on this machine's own slots (the local backend). Interleaved rounds.

A real Ray cluster on this machine (tests/ray_lab.py's kind: raylets on loopback with fake GPUs): for the gaps a
one-node cluster with one GPU (every experiment waits for the one before it: each gap is one dispatch), for the
makespan a head and two workers with two GPUs each (6 slots).

  python benchmarks/ray_dispatch.py --experiments 20 --short 30 --rounds 2
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
sys.path.insert(0, str(ROOT / "tests"))

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read by Ray when it is imported: loopback only

from ray.cluster_utils import Cluster  # noqa: E402

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


def run_sweep(work: Path, n: int, seconds: float, env: dict[str, str], *where: str) -> Path:
    results = work / f"r-{time.monotonic_ns()}"
    launcher = work / "standin.sh"
    launcher.write_text(STANDIN)
    # The stand-in's seconds go in its own words: a Ray node's environment is its own, not the runner's.
    done = subprocess.run([sys.executable, "-m", "autotuner.cli", "run", str(sweep(work, n)), *where,
                           "--launcher", f"sh {launcher} {seconds:g}", "-o", str(results), "-q"],
                          env=env, capture_output=True, text=True, timeout=1800)
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


def summary(label: str, values: list[float], unit: str = "ms") -> str:
    ms = sorted(v * (1000 if unit == "ms" else 1) for v in values)
    return (f"{label:<34} n={len(ms):3}  median {statistics.median(ms):8.2f} {unit}  "
            f"p90 {ms[int(len(ms) * 0.9)]:8.2f} {unit}  max {ms[-1]:8.2f} {unit}")


def cluster(nodes: int, gpus: int) -> Cluster:
    lab = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": gpus,
                                                        "node_ip_address": "127.0.0.1"})
    for _ in range(nodes - 1):
        lab.add_node(num_cpus=2, num_gpus=gpus, node_ip_address="127.0.0.1")
    return lab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiments", type=int, default=20, help="one after another, for the gaps")
    parser.add_argument("--short", type=int, default=30, help="0.2 s runs on 6 slots, for the makespan")
    parser.add_argument("--rounds", type=int, default=2, help="sweeps per kind, interleaved")
    args = parser.parse_args()
    plain = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    found: dict[str, list[float]] = {"ray (autotune --ray)": [], "local slot (autotune --slots 1)": []}
    ratios: dict[str, list[float]] = {"ray, 6 GPUs on 3 nodes": [], "local, --slots 6": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        one = cluster(1, 1)
        try:
            env = {**plain, "RAY_ADDRESS": one.address, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
            time.sleep(5)  # the raylet registered
            for _ in range(args.rounds):
                found["ray (autotune --ray)"] += gaps(run_sweep(work, args.experiments, 0, env, "--ray"))
                found["local slot (autotune --slots 1)"] += gaps(run_sweep(work, args.experiments, 0, plain,
                                                                          "--slots", "1"))
        finally:
            one.shutdown()
        three = cluster(3, 2)
        try:
            env = {**plain, "RAY_ADDRESS": three.address, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
            time.sleep(10)
            for _ in range(args.rounds):
                ratios["ray, 6 GPUs on 3 nodes"].append(makespan_ratio(run_sweep(work, args.short, 0.2, env, "--ray"),
                                                                        0.2, 6))
                ratios["local, --slots 6"].append(makespan_ratio(run_sweep(work, args.short, 0.2, plain, "--slots",
                                                                           "6"), 0.2, 6))
        finally:
            three.shutdown()
    for label, values in found.items():
        print(summary(f"gap: {label}", values))
    for label, values in ratios.items():
        print(summary(f"makespan/ideal: {label}", values, unit="x"))


if __name__ == "__main__":
    main()
