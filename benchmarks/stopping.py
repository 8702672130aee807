"""Stopping what cannot win and measuring until sure (issue 36): the same `autotune tune`, through the real runner
on the stand-in launcher with a fake GPU (tests/oom_standin.sh), three ways, over seeded trials.

  python benchmarks/stopping.py --trials 20 --startup 0.6 --steps 40 --step-seconds 0.03 --noise 0.03 \
      --tolerance 0.03

The space is the stand-in's plain rule: ZeRO stages 1-3, micro-batch sizes up to 64; the best is z3 mbs45, the
close second z2 mbs40 (1.4% behind), the small sizes clearly worse. Each run sleeps --startup seconds (start-up,
many times a step), then makes --steps steps of --step-seconds, each measuring the law's throughput times
1 + a normal draw of standard deviation --noise (OOM_STANDIN_STEP_NOISE, seeded by the trial), and writes their
mean. A trial is three tunes with the same seed, so each config's steps draw the same numbers in each:
- fixed: today's fixed-step tune (`--tolerance off`, AUTOTUNE_PROGRESS_POLL huge: the reader never reads while
  runs run, so nothing is stopped or ended early; 1e6, the most it takes: a larger value is refused for
  the default of 2 s, which read and stopped runs in the "off" tunes of the first figures below);
- stopping: the same with the step reader on (every 0.1 s): what cannot win is stopped;
- sure: stopping, and each run measured until sure (`--tolerance`, `--max-measured-steps` so that its window
  ends where the fixed run's steps do, or at --sure-steps).

Reported, for stopping and sure against fixed: the share of trials naming the same best; each tune's GPU-hours (the
ledger's, gpu_hours.spent) and the median of their ratios; what each says stopping saved (gpu_hours.saved, an
estimate) against what it spent less than the fixed tune, and run by run against the same config's fixed run;
where the GPU-hours go (start-up, steps, by the ledger's measured start-up; confirming re-runs); and every
stopped config whose true throughput (the law, without noise) beats the named best's by more than the noise of a
run's mean (--noise / sqrt(--steps), twice that); and the floor of each tune's runs: what they would have cost had
every run that fit cost what a run out of memory did (start-up and the launch's overhead) plus warm-up and the 4
measured steps stopping needs, against the fixed tune. --against DIR runs another source tree's stopping and sure
tunes too, each trial interleaved with this tree's (the fixed tune reads no steps: its code path is the same).

--memory-known: the GPUs' memory is known to the tune, as nvidia-smi or a hostfile's gpu= tells it on a GPU cluster.
The hostfile states 2 x --slots GPUs of type A100-80GB (80e9 bytes), each run takes 2 of them (ZeRO partitions over
2, so its stages need different memory), and the stand-in runs out of memory by its DeepSpeed-like need
(OOM_STANDIN_MODEL: an fp16 model with Adam of P parameters, A bytes of activations a sample, and --context bytes the
runtime keeps), which is what the tune's memory model (tune/memory_model.py) predicts, less its headroom. P and A are
chosen so that the largest sizes that fit are the plain rule's, z1 35, z2 40, z3 45: the same best and close
second, the same law of throughput. `profile`: the tune learns P and A from a profile run, as DeepSpeed's
autotuner does; `stated`: the config's model_info states them, and no profile run is made.
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
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import autotuner  # noqa: E402
from autotuner.backends.launch import with_autotuning  # noqa: E402
from autotuner.ledger.store import Ledger  # noqa: E402
from autotuner.spec.progress import Window  # noqa: E402
from autotuner.views.gpu_hours import gpu_hours  # noqa: E402

STANDIN = ROOT / "tests" / "oom_standin.sh"
NAME = re.compile(r"_z(\d)_mbs(\d+)")
GPU = 80e9  # bytes of the hostfile's A100-80GB, as gpu/types.py reads its name
GPUS = 2  # a run's GPUs when the memory is known: ZeRO's stages then differ in what each GPU holds


@dataclass(frozen=True)
class Memory:
    """The stand-in's memory need (tests/oom_standin.sh): its plain rule, or, known to the tune, a model of `params`
    parameters (fp16, Adam) and `per_sample` bytes of activations on 2 GPUs, beside `context` bytes the runtime
    keeps."""

    known: bool = False
    context: float = 1.5e9

    @property
    def per_sample(self) -> float:
        """Largest sizes z3 45, z2 40, z1 35: at 2 GPUs z3 holds 8 bytes a parameter, z2 9, z1 10, so 5 samples a
        stage apart with params = 5 x per_sample, and 85 samples' room (45 + 8 x 5) with half a sample to spare."""
        return (GPU - self.context) / 85.5

    @property
    def params(self) -> float:
        return 5 * self.per_sample

    def need(self, stage: int, mbs: int) -> float:
        """Bytes one GPU needs (the stand-in's sum: weights, gradients, Adam partitioned over the 2 GPUs)."""
        p = self.params
        return (2 * p / (GPUS if stage >= 3 else 1) + 2 * p / (GPUS if stage >= 2 else 1)
                + 12 * p / (GPUS if stage >= 1 else 1) + self.per_sample * mbs + self.context)

    def out_of_memory(self, name: str) -> bool:
        """Whether the stand-in runs a config out of its fake GPU's memory (False for a profile run)."""
        found = NAME.search(name)
        if found is None:
            assert name.endswith("_profile") or "_profile_z" in name, name
            return False
        stage, mbs = int(found.group(1)), int(found.group(2))
        if self.known:
            return self.need(stage, mbs) > GPU
        return {0: 40, 1: 30, 2: 20, 3: 10}[stage] + 2.0 * mbs > 100


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
    startup_hours: float  # of the runs that measured a start-up: launch to first step, GPUs x seconds
    rerun_hours: float  # the confirming re-runs'
    early: int  # runs ended once sure
    saved: float = 0.0  # GPU-hours stopping saved, as the tune estimates them (gpu_hours.saved)
    held: dict[str, float] = field(default_factory=dict)  # name -> GPU-hours its attempts held
    saved_each: dict[str, float] = field(default_factory=dict)  # name -> the estimate's part for its early end


MODES = ("fixed", "stopping", "sure")


def tune(work: Path, seed: int, mode: str, args: argparse.Namespace, root: Path = ROOT) -> Tuned:
    """One tune of the trial `seed`, one of MODES, by the autotuner of the source tree `root` (this one, or
    --against's)."""
    out = work / f"{mode}-{seed}{'' if root == ROOT else '-against'}"
    environ = dict(os.environ, PYTHONPATH=str(root), OOM_STANDIN_LOG=str(work / f"launches-{out.name}.log"),
                   OOM_STANDIN_SECONDS=str(args.startup), OOM_STANDIN_STEPS=f"{args.steps} {args.step_seconds}",
                   OOM_STANDIN_STEP_NOISE=f"{args.noise} {seed}",
                   AUTOTUNE_PROGRESS_POLL="1e6" if mode == "fixed" else "0.1")
    memory = memory_of(args)
    if memory.known:
        environ |= {"OOM_STANDIN_MODEL": f"{memory.params:.0f} {memory.per_sample:.0f} {GPU:.0f}",
                    "OOM_STANDIN_CONTEXT": f"{memory.context:.0f}"}
    where = ["-H", "hostfile", "--num_gpus", str(GPUS)] if memory.known else ["--slots", str(args.slots)]
    # The stand-in measured until sure steps to end_profile_step + 1 = 3 + max + 1: as many as a fixed run, unless
    # --sure-steps gives the sure tune a window of its own (DeepSpeed's default window, 6 steps, is too short to be
    # sure of anything).
    measuring = ["--tolerance", str(args.tolerance), "--max-measured-steps", str((args.sure_steps or args.steps) - 4)] \
        if mode == "sure" else ["--tolerance", "off"]
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "autotuner", "tune", *where, "--launcher", f"sh {STANDIN}",
                           *measuring, "-o", str(out), "train.py", "--deepspeed_config",
                           "ds-stated.json" if args.memory_known == "stated" else "ds.json"],
                          cwd=work, env=environ, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"tune failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    best = re.search(r"best: (\S+) with", done.stdout)
    assert best, done.stdout
    records = autotuner.load(out).records
    stopped = [r.name for r in records if r.state == autotuner.State.STOPPED]
    startup = sum(r.metrics.get("startup_s", 0.0) for r in records) * (GPUS if memory.known else 1) / 3600
    reruns = sum(r.gpu_hours or 0.0 for r in records if "_confirm" in r.name)
    early = sum(1 for r in records if (r.reason or "") == "" and "until sure" in (r.detail or ""))
    hours = gpu_hours(autotuner.snapshot(out))
    return Tuned(best.group(1), hours.spent, stopped, wall, len(records), startup, reruns, early,
                 getattr(hours, "saved", 0.0), {r.name: r.gpu_hours or 0.0 for r in records}, saved_each(out))


def saved_each(out: Path) -> dict[str, float]:
    """name -> GPU-hours the estimate counts for its run ended early (views/gpu_hours.py saved_hours, per run)."""
    with Ledger.open(out) as ledger:
        return {stop.name: max((Window.of(with_autotuning({"autotuning": stop.autotuning}, "", "")).most or 0)
                               - stop.steps, 0) * stop.step_seconds * stop.slots / 3600
                for stop in ledger.early_stops()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=0, help="the first trial's seed (more trials of a setting "
                        "measured before: --first-seed 8 --trials 12 after --trials 8)")
    parser.add_argument("--slots", type=int, default=3)
    parser.add_argument("--startup", type=float, default=0.6, help="seconds of start-up a run")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-seconds", type=float, default=0.03)
    parser.add_argument("--noise", type=float, default=0.03, help="per-step standard deviation, relative")
    parser.add_argument("--tolerance", type=float, default=0.03, help="the sure tune's --tolerance")
    parser.add_argument("--sure-steps", type=int, help="the sure tune's window in steps (default: --steps); "
                        "--steps 6 --sure-steps 40: the fixed tunes measure DeepSpeed's default window, steps 3-5")
    parser.add_argument("--json", type=Path, help="write each trial's figures here")
    parser.add_argument("--against", type=Path, help="a source tree (git archive REV | tar -x -C DIR) whose "
                        "stopping and sure tunes run too, interleaved with this tree's, each trial")
    parser.add_argument("--memory-known", nargs="?", const="profile", choices=("profile", "stated"),
                        help="the GPUs' memory known to the tune, the stand-in's need its memory model's; the model's "
                        "facts from a profile run (default) or stated in model_info")
    parser.add_argument("--context", type=float, default=1.5e9, help="with --memory-known: bytes the runtime keeps "
                        "on a GPU, beyond the model's need (the tune's model keeps 5%%, 4e9)")
    args = parser.parse_args()
    memory = memory_of(args)
    margin = 2 * args.noise / math.sqrt(args.steps)  # twice the noise of a run's mean
    rows: list[dict[str, Tuned]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "train.py").write_text("# stand-in: the launcher never runs it\n")
        autotuning = {"enabled": True, "metric": "throughput", "max_train_micro_batch_size_per_gpu": 64}
        ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": [1, 2, 3]}, "autotuning": autotuning}
        if memory.known:  # what the memory model reads of a config: fp16, Adam; the GPUs from the hostfile
            ds |= {"fp16": {"enabled": True}, "optimizer": {"type": "Adam", "params": {"lr": 1e-4}}}
            (work / "hostfile").write_text(f"localhost slots={GPUS * args.slots} gpu=A100-80GB\n")
            stated = {"num_params": round(memory.params), "activation_mem_per_gpu": round(memory.per_sample)}
            (work / "ds-stated.json").write_text(json.dumps(ds | {"autotuning": autotuning | {"model_info": stated}}))
        (work / "ds.json").write_text(json.dumps(ds))
        for seed in range(args.first_seed, args.first_seed + args.trials):
            row = {mode: tune(work, seed, mode, args) for mode in MODES}
            if args.against:
                row |= {f"{mode} (against)": tune(work, seed, mode, args, args.against.resolve())
                        for mode in MODES[1:]}
            rows.append(row)
            print(f"seed {seed}: " + "; ".join(
                f"{mode} {t.best} {t.hours * 3600:.1f} GPU-s ({t.wall:.0f} s wall, {len(t.stopped)} stopped, "
                f"{t.early} sure, of {t.experiments})" for mode, t in row.items()), flush=True)
    print(f"\n{len(rows)} trials, tolerance {args.tolerance}")
    for mode in list(rows[0])[1:]:
        same = sum(r[mode].best == r["fixed"].best for r in rows)
        ratios = [r[mode].hours / r["fixed"].hours for r in rows]
        wrong = sum(1 for r in rows for n in r[mode].stopped if true_value(n) > true_value(r[mode].best) * (1 + margin))
        print(f"{mode}: same best as fixed {same}/{len(rows)} ({same / len(rows):.0%}); GPU-hours {mode} / fixed: "
              f"median ratio {statistics.median(ratios):.3f} (range {min(ratios):.3f} to {max(ratios):.3f}); "
              f"stopped truly better by more than {margin:.2%}: {wrong}")
        spared = [(r["fixed"].hours - r[mode].hours) * 3600 for r in rows]
        estimated = [r[mode].saved * 3600 for r in rows]
        # run by run: each run it ended early against the same config's run in the fixed tune (to its window's end)
        pairs = [(r[mode].saved_each[n], r["fixed"].held[n] - r[mode].held[n]) for r in rows
                 for n in r[mode].saved_each if n in r["fixed"].held]
        each = [e / d for e, d in pairs if d > 0] or [math.nan]
        print(f"{mode}: GPU-s saved as it estimates them, median {statistics.median(estimated):.1f} (range "
              f"{min(estimated):.1f} to {max(estimated):.1f}); fixed's spend less its, median "
              f"{statistics.median(spared):.1f} (range {min(spared):.1f} to {max(spared):.1f}); run by run, "
              f"{len(pairs)} runs ended early: estimated {sum(e for e, _ in pairs) * 3600:.1f} GPU-s, the same "
              f"configs' fixed runs less these {sum(d for _, d in pairs) * 3600:.1f}; estimate / that per run, "
              f"median {statistics.median(each):.2f} (range {min(each):.2f} to {max(each):.2f})")
    for mode in rows[0]:
        tuned = [r[mode] for r in rows]
        print(f"{mode}: GPU-s median {statistics.median(t.hours * 3600 for t in tuned):.1f}, of it start-up "
              f"{statistics.median(t.startup_hours * 3600 for t in tuned):.1f}, confirming re-runs "
              f"{statistics.median(t.rerun_hours * 3600 for t in tuned):.1f}; experiments "
              f"{statistics.median(t.experiments for t in tuned)}, stopped "
              f"{statistics.median(len(t.stopped) for t in tuned)}, "
              f"ended once sure {statistics.median(t.early for t in tuned)}; named best's true value / the law's "
              f"best {statistics.median(true_value(t.best) / law(3, 45) for t in tuned):.4f}, named it "
              f"(z3 mbs45) {sum(t.best.endswith('_z3_mbs45') for t in tuned)}/{len(tuned)}")
        # The floor of this tune's runs: those out of memory as they were (start-up and the launch's overhead),
        # every other run at the median of their cost plus warm-up and MIN_STEPS measured steps (6), against fixed.
        floors = [_floor(t, args.step_seconds, memory) / r["fixed"].hours for t, r in zip(tuned, rows, strict=True)]
        oom = memory.out_of_memory
        print(f"{mode}: runs out of memory {statistics.median(sum(map(oom, t.held)) for t in tuned)}, "
              f"{statistics.median(sum(h for n, h in t.held.items() if oom(n)) * 3600 for t in tuned):.1f}"
              f" GPU-s; floor of its runs / fixed: median {statistics.median(floors):.3f}")
    if args.json:
        args.json.write_text(json.dumps([{"seed": seed, **{mode: vars(t) for mode, t in row.items()}}
                                         for seed, row in enumerate(rows, args.first_seed)], indent=1))

def memory_of(args: argparse.Namespace) -> Memory:
    return Memory(args.memory_known is not None, args.context)


def _floor(t: Tuned, step_seconds: float, memory: Memory) -> float:
    """GPU-hours of `t`'s runs had each that did not run out of memory (or profile) cost what one that did, plus 6
    steps; with no such run, each run its measured start-up plus 6 steps."""
    gpus = GPUS if memory.known else 1
    short = [h for n, h in t.held.items() if memory.out_of_memory(n) or NAME.search(n) is None]
    each = statistics.median(short) if short else t.startup_hours / max(len(t.held), 1)
    return sum(short) + (len(t.held) - len(short)) * (each + 6 * step_seconds * gpus / 3600)


if __name__ == "__main__":
    main()
