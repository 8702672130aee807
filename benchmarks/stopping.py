"""Stopping what cannot win (issue 36): the same `autotune tune`, through the real runner on the stand-in launcher
with a fake GPU (tests/oom_standin.sh), with the live step reading on and off, over seeded trials.

  python benchmarks/stopping.py --trials 20 --startup 0.6 --steps 40 --step-seconds 0.03 --noise 0.03

The space is the stand-in's plain rule: ZeRO stages 1-3, micro-batch sizes up to 64; the best is z3 mbs45, the
close second z2 mbs40 (1.4% behind), the small sizes clearly worse. Each run sleeps --startup seconds (start-up,
many times a step), then makes --steps steps of --step-seconds, each measuring the law's throughput times
1 + a normal draw of standard deviation --noise (OOM_STANDIN_STEP_NOISE, seeded by the trial), and writes their
mean. A trial is one tune with stopping on (the step reader polls every 0.1 s) and the same tune with it off
(AUTOTUNE_PROGRESS_POLL huge: the reader never reads while runs run, so nothing is stopped), both with the same
seed, so each config's steps draw the same numbers in both.

Reported: the share of trials whose stopping tune names the same best as its stopping-off twin; each tune's
GPU-hours (the ledger's, gpu_hours.spent) and the median of their ratios; and every stopped config whose true
throughput (the law, without noise) beats the named best's by more than the noise of a run's mean
(--noise / sqrt(--steps), twice that to be sure of it).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import autotuner  # noqa: E402
from autotuner.views.gpu_hours import gpu_hours  # noqa: E402

STANDIN = ROOT / "tests" / "oom_standin.sh"
NAME = re.compile(r"_z(\d)_mbs(\d+)")


def law(stage: int, mbs: int) -> float:
    """The stand-in's true throughput of a config at DeepSpeed's defaults (its rule, without noise)."""
    return mbs * 100 / (1 + mbs / 64) * (1 - 0.05 * stage)


def true_value(name: str) -> float:
    found = NAME.search(name)
    assert found, name
    return law(int(found.group(1)), int(found.group(2)))


@dataclass(frozen=True)
class Tuned:
    """One tune's outcome: the config it named, its GPU-hours, the configs it stopped, how long it took."""

    best: str
    hours: float
    stopped: list[str]
    wall: float
    experiments: int


def tune(work: Path, seed: int, stopping: bool, args: argparse.Namespace) -> Tuned:
    """One tune of the trial `seed`, with the live step reading (and so stopping) on or off."""
    out = work / f"{'on' if stopping else 'off'}-{seed}"
    environ = dict(os.environ, PYTHONPATH=str(ROOT), OOM_STANDIN_LOG=str(work / f"launches-{out.name}.log"),
                   OOM_STANDIN_SECONDS=str(args.startup), OOM_STANDIN_STEPS=f"{args.steps} {args.step_seconds}",
                   OOM_STANDIN_STEP_NOISE=f"{args.noise} {seed}",
                   AUTOTUNE_PROGRESS_POLL="0.1" if stopping else "1e9")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "autotuner", "tune", "--slots", str(args.slots), "--launcher",
                           f"sh {STANDIN}", "-o", str(out), "train.py", "--deepspeed_config", "ds.json"],
                          cwd=work, env=environ, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"tune failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    best = re.search(r"best: (\S+) with", done.stdout)
    assert best, done.stdout
    records = autotuner.load(out).records
    stopped = [r.name for r in records if r.state == autotuner.State.STOPPED]
    return Tuned(best.group(1), gpu_hours(autotuner.snapshot(out)).spent, stopped, wall, len(records))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--slots", type=int, default=3)
    parser.add_argument("--startup", type=float, default=0.6, help="seconds of start-up a run")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-seconds", type=float, default=0.03)
    parser.add_argument("--noise", type=float, default=0.03, help="per-step standard deviation, relative")
    parser.add_argument("--json", type=Path, help="write each trial's figures here")
    args = parser.parse_args()
    margin = 2 * args.noise / math.sqrt(args.steps)  # twice the noise of a run's mean
    rows: list[tuple[Tuned, Tuned, list[str]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "train.py").write_text("# stand-in: the launcher never runs it\n")
        (work / "ds.json").write_text(json.dumps({
            "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": [1, 2, 3]},
            "autotuning": {"enabled": True, "metric": "throughput", "max_train_micro_batch_size_per_gpu": 64}}))
        for seed in range(args.trials):
            off, on = tune(work, seed, False, args), tune(work, seed, True, args)
            wrong = [n for n in on.stopped if true_value(n) > true_value(on.best) * (1 + margin)]
            rows.append((off, on, wrong))
            print(f"seed {seed}: off {off.best} {off.hours * 3600:.1f} GPU-s ({off.wall:.0f} s wall), "
                  f"on {on.best} {on.hours * 3600:.1f} GPU-s ({on.wall:.0f} s wall), "
                  f"{len(on.stopped)} of {on.experiments} stopped"
                  + (f", stopped truly better: {wrong}" if wrong else ""), flush=True)
    same = sum(on.best == off.best for off, on, _ in rows)
    ratios = [on.hours / off.hours for off, on, _ in rows]
    print(f"\n{len(rows)} trials; same best as stopping off: {same}/{len(rows)} ({same / len(rows):.0%})")
    print(f"GPU-hours stopping on / off: median ratio {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f} to {max(ratios):.3f})")
    print("the named best's true value / the law's best (z3 mbs45), median: off "
          f"{statistics.median(true_value(off.best) / law(3, 45) for off, _, _ in rows):.4f}, "
          f"on {statistics.median(true_value(on.best) / law(3, 45) for _, on, _ in rows):.4f}")
    print(f"stopped configs truly better than the named best by more than {margin:.2%}: "
          f"{sum(len(wrong) for _, _, wrong in rows)}")
    if args.json:
        args.json.write_text(json.dumps([{"seed": seed, "off": vars(off), "on": vars(on), "stopped_better": wrong}
                                         for seed, (off, on, wrong) in enumerate(rows)], indent=1))


if __name__ == "__main__":
    main()
