"""Scheduling overhead and dispatch latency of the real runner with a stand-in launcher.

Many short experiments (benchmarks/standin.sh: sleeps a set time, writes a metrics file) run through the full
path: ledger (SQLite, synced), slot pool, dispatcher, one thread and one process group per attempt.

  python benchmarks/scheduling.py --experiments 500 --seconds 0.2 --slots 8

makespan/ideal: wall time of the sweep over (experiments x seconds / slots).
run overhead: mean time an attempt held its slot beyond its sleep (process start and exit, clean-up, judging).
dispatch latency: on each slot, from the moment the runner saw a process exit to the moment the next one on
that slot was started (process spawned), median and p99.
cpu: CPU seconds of this process (the runner: dispatcher, watching threads, ledger; not the stand-ins) per
second of the sweep. `--live` draws the live view meanwhile (rich.live on a terminal console that writes to
memory, 4 frames a second, as on a terminal): the two figures side by side are what the view costs.
"""
from __future__ import annotations

import argparse
import io
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

import autotuner  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def one_round(n: int, seconds: float, slots: int, live: bool = False) -> dict[str, float]:
    os.environ["STANDIN_SECONDS"] = str(seconds)
    experiments = tuple(
        autotuner.Experiment(name=f"e{i:05d}", ds_config={"train_micro_batch_size_per_gpu": 1}, num_gpus=1,
                             num_nodes=1, script=str(ROOT / "benchmarks" / "standin.sh"), source="bench")
        for i in range(n))
    sweep = autotuner.Sweep(name="bench", experiments=experiments, metric=autotuner.metric_named("throughput"),
                            source="bench")
    cluster = autotuner.load_cluster(slots=slots)
    with tempfile.TemporaryDirectory() as tmp:
        directory = autotuner.prepare(sweep, cluster, Path(tmp) / "sweep",
                                      launcher=["sh", str(ROOT / "benchmarks" / "standin.sh")])
        options = autotuner.Options(grace=1.0)
        console = Console(file=io.StringIO(), force_terminal=True, width=120, height=40) if live else None
        with autotuner.watching(directory, options.observers, live=live, console=console):
            cpu, started = time.process_time(), time.perf_counter()
            result = autotuner.execute(directory, options)
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        attempts = result.snapshot.attempts
    assert all(a.state == autotuner.State.SUCCEEDED for a in attempts), result.snapshot.counts()
    gaps = []
    by_slot: dict[tuple, list] = {}
    for a in attempts:
        by_slot.setdefault(tuple((h, tuple(ids)) for h, ids in a.slots.items()), []).append(a)
    for runs in by_slot.values():
        runs.sort(key=lambda a: a.launched_at)
        gaps += [(b.launched_at - a.finished_at) * 1000 for a, b in itertools.pairwise(runs)]
    ideal = n * seconds / slots
    busy = statistics.mean(a.finished_at - a.launched_at for a in attempts) - seconds
    return {"wall_s": wall, "ideal_s": ideal, "ratio": wall / ideal, "run_overhead_ms": busy * 1000,
            "latency_median_ms": statistics.median(gaps), "latency_p99_ms": percentile(gaps, 0.99),
            "latency_max_ms": max(gaps), "cpu_per_s": cpu / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiments", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=0.2)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--live", action="store_true", help="draw the live view meanwhile (see above)")
    opts = parser.parse_args()
    results = []
    for i in range(opts.rounds):
        r = one_round(opts.experiments, opts.seconds, opts.slots, opts.live)
        results.append(r)
        print(f"round {i + 1}: " + "  ".join(f"{k}={v:.3f}" for k, v in r.items()), flush=True)
    print(f"median of {opts.rounds} rounds ({opts.experiments} x {opts.seconds}s on {opts.slots} slots): " +
          "  ".join(f"{k}={statistics.median(r[k] for r in results):.3f}" for k in results[0]))


if __name__ == "__main__":
    main()
