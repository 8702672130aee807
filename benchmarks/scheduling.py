"""Scheduling overhead and dispatch latency of the real runner with a stand-in launcher.

Many short experiments (benchmarks/standin.sh: sleeps a set time, writes a metrics file) run through the full
path: ledger (SQLite, synced), slot pool, dispatcher, one thread and one process group per attempt.

  python benchmarks/scheduling.py --experiments 500 --seconds 0.2 --slots 8

makespan/ideal: wall time of the sweep over (experiments x seconds / slots).
run overhead: mean time an attempt held its slot beyond its sleep (process start and exit, clean-up, judging).
dispatch latency: on each slot, from the moment the runner saw a process exit to the moment the next one on
that slot was started (process spawned), median and p99.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotuner import runner  # noqa: E402
from autotuner.cluster import Cluster  # noqa: E402
from autotuner.hostfile import localhost_hosts  # noqa: E402
from autotuner.ledger import Ledger  # noqa: E402
from autotuner.metrics import metric_named  # noqa: E402
from autotuner.spec import Experiment, Sweep  # noqa: E402
from autotuner.states import State  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def one_round(n: int, seconds: float, slots: int) -> dict[str, float]:
    os.environ["STANDIN_SECONDS"] = str(seconds)
    experiments = tuple(
        Experiment(name=f"e{i:05d}", ds_config={"train_micro_batch_size_per_gpu": 1}, num_gpus=1, num_nodes=1,
                   script=str(ROOT / "benchmarks" / "standin.sh"), args=(), timeout=None, env={}, source="bench")
        for i in range(n))
    sweep = Sweep(name="bench", experiments=experiments, metric=metric_named("throughput"), source="bench")
    hosts = localhost_hosts(slots)
    cluster = Cluster.of(hosts, {h: list(range(slots)) for h in hosts}, "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "sweep"
        runner.prepare(sweep, cluster, directory, launcher=["sh", str(ROOT / "benchmarks" / "standin.sh")])
        started = time.perf_counter()
        result = runner.execute(directory, runner.Options(grace=1.0))
        wall = time.perf_counter() - started
        ledger = Ledger.open(directory)
        attempts = ledger.latest()
        ledger.close()
    assert all(a.state == State.SUCCEEDED for a in attempts), result.snapshot.counts()
    gaps = []
    by_slot: dict[tuple, list] = {}
    for a in attempts:
        by_slot.setdefault(tuple((h, tuple(ids)) for h, ids in a.slots.items()), []).append(a)
    for runs in by_slot.values():
        runs.sort(key=lambda a: a.launched_at)
        gaps += [(b.launched_at - a.finished_at) * 1000 for a, b in zip(runs, runs[1:])]
    ideal = n * seconds / slots
    busy = statistics.mean(a.finished_at - a.launched_at for a in attempts) - seconds
    return {"wall_s": wall, "ideal_s": ideal, "ratio": wall / ideal, "run_overhead_ms": busy * 1000,
            "latency_median_ms": statistics.median(gaps), "latency_p99_ms": percentile(gaps, 0.99),
            "latency_max_ms": max(gaps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiments", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=0.2)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    results = []
    for i in range(opts.rounds):
        r = one_round(opts.experiments, opts.seconds, opts.slots)
        results.append(r)
        print(f"round {i + 1}: " + "  ".join(f"{k}={v:.3f}" for k, v in r.items()), flush=True)
    print(f"median of {opts.rounds} rounds ({opts.experiments} x {opts.seconds}s on {opts.slots} slots): " +
          "  ".join(f"{k}={statistics.median(r[k] for r in results):.3f}" for k in results[0]))


if __name__ == "__main__":
    main()
