"""`autotune plan`: how fast the simulator is at scale, and how close its predictions come to real sweeps.

  python benchmarks/plan.py scale     # 100,000 experiments, 1,024 simulated nodes x 8 GPUs, 1-64 GPUs each
  python benchmarks/plan.py accuracy  # a real stand-in sweep predicted from an earlier one, then run
  python benchmarks/plan.py eta       # the live view's ETA against simulated sweeps' truth, many of them
  python benchmarks/plan.py steps     # a longer profile predicted from the start-up and steps a sweep measured
  python benchmarks/plan.py all

scale: wall time of building the experiments and of the simulation; the median time of a decision (the queue
policy and the placement choosing what starts where: one `select` that starts something, per run started), and
of a whole placing step (the scheduler's `step` that starts something, per run started: the decision plus
recording the run that ended and the one that starts).

accuracy: sweep A (24 stand-in experiments of 1-6 s, seeded, on 4 slots) is run to measure durations; the plan
for the same experiments on 8 slots `--from A` is compared with sweep B, the same experiments really run on 8
slots (makespan from its first start to its last end). The live view's ETA during B (re-planned) is compared,
at a quarter, half and three quarters of the experiments done, with the time B really had left; the ETA the
view gave before (mean duration x work left / slots) is computed alongside.

steps: sweep A (16 configs of the steps stand-in, tests/steps_standin.py: a start-up of 0.8-1.2 s, then steps of
0.01 x micro-batch size s, 1-8, each written to the progress file; no `latency`, as a script's own metric) makes
6 steps a run (DeepSpeed's default profile) on 4 slots; the plan of the same configs making 30 steps
(end_profile_step 29) `--from A` is compared with sweep B, those really run on 4 slots. Before: the plan as the code
before read A (no measures: each config's whole run, "measured"); after: start-up + 30 steps x step time, and the
Monte Carlo P10-P90 of the measured spreads.

eta: the same comparison on simulated sweeps (24 experiments on 8 slots; durations uniform 1-6 s, or
log-normal with sigma 0.6), 100 of each per round: the truth is the simulated sweep's own end, and the ETA is
computed as the live view computes it (plan.time_left) from what was known at each moment.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import autotuner  # noqa: E402
from autotuner.core import BackfillQueue  # noqa: E402
from autotuner.planning.plan import plan_sweep  # noqa: E402
from autotuner.planning.simulate import simulate  # noqa: E402
from autotuner.spec import Experiment  # noqa: E402
from autotuner.states import State  # noqa: E402

STANDIN = ROOT / "benchmarks" / "standin.sh"
SHAPES = [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (4, 8), (8, 8)]  # (nodes, GPUs per node): 1 to 64 GPUs


class TimedQueue(BackfillQueue):
    """The runner's queue policy, timed: seconds per run started, of each select that starts something."""

    def __init__(self, max_bypass: int) -> None:
        super().__init__(max_bypass)
        self.decisions: list[float] = []

    def select(self, pool, placement):
        started_at = time.perf_counter()
        started = super().select(pool, placement)
        if started:
            self.decisions.append((time.perf_counter() - started_at) / len(started))
        return started


def scale(n: int, nodes: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    started = time.perf_counter()
    experiments = []
    for i in range(n):
        num_nodes, num_gpus = rng.choice(SHAPES)
        experiments.append(Experiment(name=f"e{i:06d}", ds_config={"train_micro_batch_size_per_gpu": 1},
                                      num_gpus=num_gpus, num_nodes=num_nodes, script="/x/train.py"))
    took = {e.name: rng.uniform(60, 3600) for e in experiments}
    built = time.perf_counter()
    slots = {f"node{i:04d}": list(range(8)) for i in range(nodes)}
    queues: list[TimedQueue] = []

    def queue(pool):  # the runner's default (default_queue), timed
        queues.append(TimedQueue(max(1, sum(pool.capacity(h) for h in pool.hosts))))
        return queues[-1]

    timeline = simulate(experiments, slots, lambda e: took[e.name], queue=queue, measure=True)
    done = time.perf_counter()
    assert len(timeline.played) == n
    decisions = sorted(queues[0].decisions)
    steps = sorted(timeline.decisions)
    return {"build_s": built - started, "simulate_s": done - built, "wall_s": done - started,
            "decision_median_us": statistics.median(decisions) * 1e6,
            "decision_p99_us": decisions[int(0.99 * (len(decisions) - 1))] * 1e6,
            "step_median_us": statistics.median(steps) * 1e6, "utilisation": timeline.utilisation}


def standin_sweep(n: int, seed: int) -> autotuner.Sweep:
    rng = random.Random(seed)
    experiments = tuple(
        autotuner.Experiment(name=f"s{i:02d}", ds_config={"train_micro_batch_size_per_gpu": 1}, num_gpus=1,
                             num_nodes=1, script=str(STANDIN), env={"STANDIN_SECONDS": f"{rng.uniform(1, 6):.2f}"},
                             source="bench")
        for i in range(n))
    return autotuner.Sweep(name="standin", experiments=experiments, metric=autotuner.metric_named("throughput"),
                           source="bench")


def run_sweep(sweep: autotuner.Sweep, slots: int, directory: Path, observers=()) -> autotuner.Result:
    cluster = autotuner.load_cluster(slots=slots)
    prepared = autotuner.prepare(sweep, cluster, directory, launcher=["sh", str(STANDIN)])
    return autotuner.execute(prepared, autotuner.Options(grace=1.0, observers=list(observers)))


def makespan(result: autotuner.Result) -> float:
    attempts = [a for a in result.snapshot.attempts if a.started_at is not None]
    return max(a.finished_at for a in attempts) - min(a.started_at for a in attempts)


def old_eta(state, now: float) -> float:
    """The live view's ETA before re-planning: mean duration x work left over the slots."""
    mean = state.mean_duration()
    queued = [name for name, s in state.states.items() if s == State.QUEUED]
    left = [max(mean - (now - r.started_at), 0.0) for r in state.running]
    work = sum(state.sizes.get(name, 1) for name in queued) * mean + sum(
        r.size * rest for r, rest in zip(state.running, left, strict=True))
    return max(work / state.capacity(), max(left, default=0.0), mean if queued else 0.0)


def accuracy(n: int, seed: int) -> dict[str, float]:
    from autotuner.views.live import LiveView
    from autotuner.views.snapshot import snapshot

    sweep = standin_sweep(n, seed)
    with tempfile.TemporaryDirectory() as tmp:
        first = run_sweep(sweep, 4, Path(tmp) / "a")
        assert all(a.state == State.SUCCEEDED for a in first.snapshot.attempts)
        plan = plan_sweep(sweep.experiments, {"localhost": list(range(8))}, past=Path(tmp) / "a")
        predicted = plan.policies[0].expected.makespan
        # B: the same sweep on 8 slots, watched by the live view; its ETA read as experiments end
        directory = Path(tmp) / "b"
        cluster = autotuner.load_cluster(slots=8)
        prepared = autotuner.prepare(sweep, cluster, directory, launcher=["sh", str(STANDIN)])
        view = LiveView(snapshot(prepared))
        readings: list[tuple[int, float, float, float]] = []  # (done, at, eta, old eta)
        done = [0]

        def watch(what, subject, outcome):
            if what == "finished":
                done[0] += 1
                if done[0] in (n // 4, n // 2, 3 * n // 4):
                    now = time.time()
                    state = view.state()
                    readings.append((done[0], now, state.eta(now), old_eta(state, now)))

        second = autotuner.execute(prepared, autotuner.Options(grace=1.0, observers=[view, watch]))
        measured = makespan(second)
        end = max(a.finished_at for a in second.snapshot.attempts)
    out = {"predicted_s": predicted, "measured_s": measured, "error_pct": 100 * (predicted - measured) / measured}
    for count, at, eta, before in readings:
        real = end - at
        out[f"eta_error_at_{count}_pct"] = 100 * (eta - real) / real
        out[f"old_eta_error_at_{count}_pct"] = 100 * (before - real) / real
    return out


STEPS_STANDIN = ROOT / "tests" / "steps_standin.py"


def steps_sweep(name: str, n: int, seed: int, end_profile_step: int) -> autotuner.Sweep:
    rng = random.Random(seed)
    experiments = tuple(
        autotuner.Experiment(name=f"s{i:02d}", num_gpus=1, num_nodes=1, script=str(STEPS_STANDIN), source="bench",
                             ds_config={"train_micro_batch_size_per_gpu": rng.choice([1, 2, 4, 8]),
                                        "autotuning": {"end_profile_step": end_profile_step}},
                             env={"STEPS_PROGRESS": "1", "STEPS_STARTUP": f"{rng.uniform(0.8, 1.2):.2f}",
                                  "STEPS_PER_SAMPLE": "0.01"})
        for i in range(n))
    return autotuner.Sweep(name=name, experiments=experiments, metric=autotuner.metric_named("throughput"),
                           source="bench")


def steps(n: int, seed: int) -> dict[str, float]:
    from unittest import mock

    from autotuner.ledger.store import Ledger

    slots = {"localhost": list(range(4))}
    longer = steps_sweep("long", n, seed, 29)
    with tempfile.TemporaryDirectory() as tmp:
        for name, sweep in (("a", steps_sweep("short", n, seed, 5)), ("b", longer)):
            prepared = autotuner.prepare(sweep, autotuner.load_cluster(slots=4), Path(tmp) / name,
                                         launcher=[sys.executable, str(STEPS_STANDIN)])
            if name == "b":
                with mock.patch.object(Ledger, "measures", lambda self: {}):  # what the code before read of A
                    before = plan_sweep(longer.experiments, slots, past=Path(tmp) / "a")
                after = plan_sweep(longer.experiments, slots, past=Path(tmp) / "a")
            result = autotuner.execute(prepared, autotuner.Options(grace=1.0))
            assert all(a.state == State.SUCCEEDED for a in result.snapshot.attempts)
        measured = makespan(result)
    was, now = before.policies[0].expected.makespan, after.policies[0]
    return {"measured_s": measured, "before_s": was, "before_error_pct": 100 * (was - measured) / measured,
            "after_s": now.expected.makespan, "after_error_pct": 100 * (now.expected.makespan - measured) / measured,
            "after_p10_s": now.percentile(10), "after_p90_s": now.percentile(90),
            "inside_p10_p90": float(now.percentile(10) <= measured <= now.percentile(90))}


def eta(seed: int, trials: int = 100, n: int = 24, slots: int = 8) -> dict[str, float]:
    from autotuner.planning.plan import Ongoing, time_left

    out: dict[str, float] = {}
    for dist in ("uniform", "lognormal"):
        errors: dict[int, list[float]] = {}
        old: dict[int, list[float]] = {}
        for trial in range(trials):
            rng = random.Random(seed * 100_000 + trial)
            exps = [Experiment(name=f"s{i:02d}", ds_config={}, num_gpus=1, num_nodes=1, script="/x")
                    for i in range(n)]
            took = {e.name: rng.uniform(1, 6) if dist == "uniform" else rng.lognormvariate(1, 0.6) for e in exps}
            truth = simulate(exps, {"h": list(range(slots))}, lambda e, took=took: took[e.name])
            by = {p.name: p for p in truth.played}
            ends = sorted(truth.played, key=lambda p: p.end)
            for k in (n // 4, n // 2, 3 * n // 4):
                now = ends[k - 1].end
                seen = [p.end - p.start for p in ends[:k]]
                running = [p for p in truth.played if p.start <= now < p.end]
                queued = [e for e in exps if by[e.name].start > now]
                ongoing = [Ongoing(e, by[e.name].slots, now - by[e.name].start) for e in exps
                           if by[e.name] in running]
                real = truth.makespan - now
                left = time_left({"h": list(range(slots))}, queued, ongoing, seen)
                errors.setdefault(k, []).append(100 * (left - real) / real)
                mean = statistics.fmean(seen)
                rests = [max(mean - o.elapsed, 0.0) for o in ongoing]
                before = max((len(queued) * mean + sum(rests)) / slots, max(rests, default=0.0),
                             mean if queued else 0.0)
                old.setdefault(k, []).append(100 * (before - real) / real)
        for k in errors:
            out[f"{dist}_at_{k}_median_abs_err_pct"] = statistics.median(abs(e) for e in errors[k])
            out[f"{dist}_at_{k}_median_err_pct"] = statistics.median(errors[k])
            out[f"{dist}_at_{k}_old_median_abs_err_pct"] = statistics.median(abs(e) for e in old[k])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["scale", "accuracy", "eta", "steps", "all"])
    parser.add_argument("--experiments", type=int, default=None)
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    os.environ.setdefault("STANDIN_THROUGHPUT", "1.0")
    for what in (["scale", "accuracy", "eta", "steps"] if opts.what == "all" else [opts.what]):
        results = []
        for i in range(opts.rounds):
            r = (scale(opts.experiments or 100_000, opts.nodes, seed=i) if what == "scale"
                 else accuracy(opts.experiments or 24, seed=i) if what == "accuracy"
                 else steps(opts.experiments or 16, seed=i) if what == "steps" else eta(seed=i))
            results.append(r)
            print(f"{what} round {i + 1}: " + "  ".join(f"{k}={v:.2f}" for k, v in r.items()), flush=True)
        keys = [k for k in results[0] if all(k in r for r in results)]
        print(f"{what}: median of {opts.rounds} rounds: " +
              "  ".join(f"{k}={statistics.median(r[k] for r in results):.2f}" for k in keys), flush=True)


if __name__ == "__main__":
    main()
