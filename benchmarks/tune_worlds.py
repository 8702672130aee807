"""`autotune tune --num_gpus 1,2,4 --num_nodes 1,2` (the best config at each world size) against the grid over
sizes, through the real runner, on the fake-GPU stand-in with a scaling curve (tests/oom_standin.sh,
OOM_STANDIN_SCALING="0.9 0.7": the throughput is the data-parallel GPUs' sum, each doubling of a node's GPUs
keeping 0.9 of it and each doubling of the nodes 0.7, raised to 1 + stage/2; ZeRO partitions the model over the
GPUs, so a larger world fits larger micro-batches at the higher stages).

  python benchmarks/tune_worlds.py --seconds 0.05 [--plot FRONT.png]

The model: 2e9 parameters in fp16 with Adam, 2e9 bytes of activations a sample, GPUs of 80e9 bytes. Two nodes of
4 slots, both this machine under two of its names (`localhost` and `127.0.0.1`: the runner starts the stand-in
launcher once per run on this machine, and the stand-in counts the nodes in the --include it is given), so a run
of 2 nodes pays the across-node term. The grid: every stage x the powers of two up to 64 x the 6 sizes (168
experiments). For each size: the tune's best against the rule's best over every micro-batch size that fits (not
only powers of two); for the training run (1e10 samples, 2.0 a GPU-hour, a 20-day deadline): the tune's fastest
and cheapest within the deadline against the rule's, over every size. --real: the same tune with real DeepSpeed on
1 and 2 CPU ranks.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import autotuner
from autotuner.views.cost import costing, goal_of

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "oom_standin.sh"
PARAMS, PER_SAMPLE, GPU = 2e9, 2e9, 80e9
STAGES, LARGEST = (0, 1, 2, 3), 64
GPUS, NODES = (1, 2, 4), (1, 2)
WORLDS = tuple((g, n) for n in NODES for g in GPUS)  # (GPUs a node, nodes), as the tune orders its sizes
WITHIN, ACROSS = 0.9, 0.7
SAMPLES, PRICE, DEADLINE = 10 ** 10, 2.0, 20.0
INFO = {"num_params": int(PARAMS), "activation_mem_per_gpu": int(PER_SAMPLE)}


def need(stage: int, mbs: int, world: int) -> float:
    """The stand-in's bytes of one GPU (oom_standin.sh's rule)."""
    weights = 2 * PARAMS / world if stage >= 3 else 2 * PARAMS
    grads = 2 * PARAMS / world if stage >= 2 else 2 * PARAMS
    adam = 12 * PARAMS / world if stage >= 1 else 12 * PARAMS
    return weights + grads + adam + PER_SAMPLE * mbs + 1.5e9


def samples(stage: int, mbs: int, size: tuple[int, int]) -> float:
    """The samples per second the stand-in's rule gives the whole world of `size` (GPUs a node, nodes)."""
    gpus, nodes = size
    value = mbs * 100 / (1 + mbs / 64) * (1 - 0.05 * stage)
    paid = WITHIN ** math.log2(gpus) * ACROSS ** math.log2(nodes)
    return value * gpus * nodes * paid ** (1 + 0.5 * stage)


def truth() -> tuple[dict[tuple[int, int], float], tuple[float, float], tuple[float, float]]:
    """The rule's best throughput at each size; (days, cost) of the fastest and of the cheapest in the deadline."""
    points = [(z, m, s) for s in WORLDS for z in STAGES for m in range(1, LARGEST + 1)
              if need(z, m, s[0] * s[1]) <= GPU]
    best = {s: max(samples(*p) for p in points if p[2] == s) for s in WORLDS}
    runs = [(SAMPLES / samples(*p) / 86400, SAMPLES / samples(*p) / 3600 * p[2][0] * p[2][1] * PRICE)
            for p in points]
    return best, min(runs), min((r for r in runs if r[0] <= DEADLINE), key=lambda r: r[1])


def tune(work: Path, known: bool) -> autotuner.Snapshot:
    (work / "train.py").write_text("# stand-in: the launcher never runs it\n")
    autotuning: dict = {"enabled": True, "metric": "throughput", "max_train_micro_batch_size_per_gpu": LARGEST,
                        "train_samples": SAMPLES, "gpu_hour_cost": PRICE, "deadline_days": DEADLINE}
    if known:
        autotuning["model_info"] = INFO
    config = {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True}, "autotuning": autotuning,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-4}}, "zero_optimization": {"stage": list(STAGES)}}
    (work / "ds.json").write_text(json.dumps(config))
    typed = " gpu=A100-80GB" if known else ""
    (work / "hostfile").write_text(f"localhost slots=4{typed}\n127.0.0.1 slots=4{typed}\n")
    os.environ.update(OOM_STANDIN_LOG=str(work / "launches.log"), OOM_STANDIN_MODEL=f"{PARAMS} {PER_SAMPLE} {GPU}",
                      OOM_STANDIN_SCALING=f"{WITHIN} {ACROSS}")
    cluster = autotuner.load_cluster(hostfile=work / "hostfile")
    directory = autotuner.prepare_tune(str(work / "train.py"), ["--deepspeed_config", "ds.json"], cluster,
                                       work / "res", num_gpus=list(GPUS), num_nodes=list(NODES),
                                       launcher=["sh", str(STANDIN)], cwd=work)
    return autotuner.execute(directory, autotuner.Options(grace=1.0)).snapshot


def table(plot: Path | None) -> None:
    best, fastest, cheapest = truth()
    print(f"the real runner, 2 nodes x 4 slots, {os.environ['OOM_STANDIN_SECONDS']} s a run; grid: "
          f"{len(STAGES) * 7 * len(WORLDS)} experiments\n")
    sizes = " / ".join(f"{g}x{n}" for g, n in WORLDS)
    print(f"| GPU memory | experiments (OOM) | best at {sizes} (GPUs x nodes), against the rule's | fastest: days "
          "(rule's) | cheapest in 20 days: cost (rule's) | wall s |\n|---|---:|---|---|---|---:|")
    for known in (True, False):
        with tempfile.TemporaryDirectory() as tmp:
            snap = tune(Path(tmp), known)
            ran = [a for a in snap.attempts if a.started_at is not None and "_confirm" not in a.name]
            oom = sum(1 for a in ran if a.reason == "oom")
            priced = costing(snap, goal_of(snap))
            assert priced is not None
            found = {s: max((c.rate for c in priced.candidates if _size(snap, c.name) == s), default=0.0)
                     for s in WORLDS}
            ratios = " / ".join(f"{found[w] / best[w]:.3f}" for w in WORLDS)
            top = next(c for c in priced.candidates if c.name == priced.cheapest)
            wall = max(a.finished_at or 0 for a in snap.attempts) - min(a.started_at or 1e18 for a in ran)
            print(f"| {'known, model_info' if known else 'unknown (no gpu=)'} | {len(ran)} ({oom}) | {ratios} | "
                  f"{priced.fastest.days:.2f} ({fastest[0]:.2f}), {priced.fastest.name} | {top.cost:,.0f} "
                  f"({cheapest[1]:,.0f}), {top.name} | {wall:.1f} |", flush=True)
            if plot is not None and known:
                from autotuner.views.plots import front_figure  # matplotlib: only when a picture is asked for
                front_figure(priced).savefig(plot)


def _size(snap: autotuner.Snapshot, name: str) -> tuple[int, int]:
    """(GPUs a node, nodes) an experiment ran on."""
    slots = next(a.slots for a in snap.attempts if a.name == name)
    return max(len(ids) for ids in slots.values()), len(slots)


def real() -> None:
    """The same tune with real DeepSpeed on 1 and 2 CPU ranks (experiments/train.py, ds_tune.json)."""
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "res"
        environ = {**os.environ, "PYTHONPATH": str(ROOT)}
        run = subprocess.run([sys.executable, "-m", "autotuner.cli", "tune", "--slots", "2", "--num_gpus", "1,2",
                              "--confirm", "0", "--train-samples", "1e7", "--gpu-hour-cost", "1", "--deadline-days",
                              "1", "-o", str(results), "train.py", "--steps", "8", "--deepspeed_config",
                              "ds_tune.json"], capture_output=True, text=True, cwd=ROOT / "experiments", env=environ)
        print(run.stdout[-1500:] + run.stderr[-1000:])
        shown = subprocess.run([sys.executable, "-m", "autotuner.cli", "report", str(results), "--format", "md"],
                               capture_output=True, text=True, env=environ)
        print(shown.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=0.05)
    parser.add_argument("--plot", type=Path, help="Draw the front of the tune with model_info into this PNG.")
    parser.add_argument("--real", action="store_true", help="Only the tune with real DeepSpeed on CPU ranks.")
    opts = parser.parse_args()
    os.environ["OOM_STANDIN_SECONDS"] = str(opts.seconds)
    if opts.real:
        real()
        return
    table(opts.plot)


if __name__ == "__main__":
    main()
