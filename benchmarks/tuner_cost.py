"""What one decision of `autotune tune`'s tuners costs after 10, 100 and 1,000 finished trials, and what a search
rebuilt from a 1,000-trial ledger (resume) costs until its first decision.

The search is driven in process (no runner, no processes): a space large enough for 1,000 trials (ZeRO stages
0-3, micro-batch sizes 1..1024 doubling, full mode's knobs on stages 1 and 2: 1,606 points), proposals of 8 at a
time each told its outcome at once by a fixed rule (a size past a stage's memory runs out of memory, throughput a
known function of stage and size). Then one decision (`propose(1)`) is timed, `--repeat` times, each told its
outcome before the next; the median is printed, in CPU time (the search runs in this one thread: on a loaded
machine its CPU time moves far less than its wall time). gridsearch walks each stage's sizes and ends after a few
dozen trials: its row says how many it ran.

  python benchmarks/tuner_cost.py --trials 10,100,1000 --tuners gridsearch,random,model_based
  python benchmarks/tuner_cost.py --trials 1000 --tuners model_based --resume --via random

model_based's own history to 1,000 trials takes long to grow (every decision is TPE's sampling, several asks when
it keeps choosing points tried); `--via random` grows it with the random tuner's draws on the same points and
replays them into the tuner timed, as `resume` would: the decisions timed are then that tuner's own.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotuner.spec import Experiment  # noqa: E402
from autotuner.states import Reason, State  # noqa: E402
from autotuner.tune.search import Search  # noqa: E402
from autotuner.tune.space import SearchSpec  # noqa: E402
from autotuner.tune.tuners import search_for  # noqa: E402

SIZES = [50_000_000, 500_000_000, 1_000_000_000]
KNOBS = {str(stage): {"overlap_comm": [False, True], "reduce_scatter": [True, False],
                      "contiguous_gradients": [True, False], "reduce_bucket_size": SIZES,
                      "allgather_bucket_size": SIZES} for stage in (1, 2)}
Outcome = tuple[State, str | None, float | None]


def spec(tuner: str, seed: int = 0) -> SearchSpec:
    return SearchSpec(prefix="t", template={"script": "/x/train.py", "num_gpus": 1, "num_nodes": 1, "args": []},
                      base={"gradient_accumulation_steps": 1}, stages=(0, 1, 2, 3), metric="throughput",
                      max_mbs=1024, confirm=0, tuner=tuner, seed=seed, knobs=KNOBS)


def outcome(e: Experiment) -> Outcome:
    """Out of memory past a stage's size; else a throughput that grows with the size, less with the stage."""
    zero = e.ds_config["zero_optimization"]
    stage, mbs = zero["stage"], e.ds_config["train_micro_batch_size_per_gpu"]
    if {0: 40, 1: 30, 2: 20, 3: 10}[stage] + 0.2 * mbs > 100:
        return State.FAILED, Reason.OOM, None
    return State.SUCCEEDED, None, mbs * 100 / (1 + mbs / 64) * (1 - 0.05 * stage) * (
        1.1 if zero.get("overlap_comm") else 1.0)


def grown(tuner: str, trials: int, via: str | None = None) -> tuple[Search, list[Experiment]]:
    """A search that has proposed and learnt about `trials` experiments (fewer if it ended first). `via`: the
    history is another tuner's (on the same points), replayed into this one as a resume would."""
    search = search_for(spec(via or tuner))
    ledger: list[Experiment] = []
    while len(ledger) < trials:
        got = search.propose(min(8, trials - len(ledger)), 0.0)
        if not got:
            break
        for e in got:
            search.learn(e, *outcome(e))
        ledger += got
    if via is not None:
        search = search_for(spec(tuner))
        search.replay(ledger, {e.name: outcome(e) for e in ledger})
    return search, ledger


def decision(search: Search, repeat: int) -> float:
    """Median CPU seconds of one `propose(1)`, each told its outcome before the next."""
    took = []
    for _ in range(repeat):
        started = time.process_time()
        got = search.propose(1, 0.0)
        took.append(time.process_time() - started)
        for e in got:
            search.learn(e, *outcome(e))
    return statistics.median(took)


def rebuilt(tuner: str, ledger: list[Experiment]) -> float:
    """CPU seconds from a new search to its first decision, rebuilt from a ledger of `ledger` (as `resume` does)."""
    ended = {e.name: outcome(e) for e in ledger}
    started = time.process_time()
    search = search_for(spec(tuner))
    search.replay(ledger, ended)
    search.propose(1, 0.0)
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", default="10,100,1000")
    parser.add_argument("--tuners", default="gridsearch,random,model_based")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--resume", action="store_true", help="also time a rebuilt search's first decision")
    parser.add_argument("--via", help="grow each history with this tuner (random: fast), replayed into the one timed")
    opts = parser.parse_args()
    for tuner in opts.tuners.split(","):
        for n in map(int, opts.trials.split(",")):
            started = time.perf_counter()
            search, ledger = grown(tuner, n, opts.via)
            built = time.perf_counter() - started
            cost = decision(search, opts.repeat)
            line = f"{tuner:<12} {len(ledger):>5} trials: one decision {cost * 1000:8.2f} ms (median of {opts.repeat})"
            if opts.resume:
                line += f", rebuilt to its first decision {rebuilt(tuner, ledger) * 1000:8.1f} ms"
            print(line + f"  [{n} asked; growing it took {built:.1f} s]", flush=True)


if __name__ == "__main__":
    main()
