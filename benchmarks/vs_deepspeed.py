"""`autotune tune` against DeepSpeed's own autotuner (`deepspeed --autotuning tune`): the same script
(experiments/train.py), the same config and space (experiments/ds_tune.json: ZeRO stages, micro-batch bounds), both
on this machine's CPU (DS_ACCELERATOR=cpu), run in turn, round after round.

  pip install tabulate                  # DeepSpeed's autotuner needs it (with PIP_CONSTRAINT holding torch==2.13.0)
  python benchmarks/vs_deepspeed.py --rounds 3 --verify 3

Each round runs, in an order rotated from round to round: DeepSpeed's autotuner (one slot: on the CPU accelerator
it sees one device, `--num_gpus 1`), `autotune tune --slots 1` and `autotune tune --slots 2`, each in a fresh
directory with its own copy of the config. No ssh, no hostfile: DeepSpeed's autotuner runs its experiments through
the local launcher; only its clean-up goes through `pdsh -w localhost pkill -f NAME`, which finds no sshd on
localhost here, so it kills nothing (pdsh exits 0 and DeepSpeed logs the clean-up as done).

For each run: its wall time (start of the command to its exit); time-to-best, from the start to the moment the
config it names the best had its throughput written (the mtime of that experiment's first metrics.json: the same
definition for both tools); experiments run (DeepSpeed's model-info profile run and autotune's confirming re-runs
included) and the position of the best's first run among them; the best config (stage, micro-batch size, gradient
accumulation) and the throughput it was named with (DeepSpeed: its single run; autotune: the mean of its runs).

--verify N runs every config either tool named N times more, interleaved, through the plain DeepSpeed launcher,
so the bests are compared by measurements taken alike, not by the lucky draws that made them bests.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import autotuner  # noqa: E402

TRAIN = ROOT / "experiments" / "train.py"
CONFIG = ROOT / "experiments" / "ds_tune.json"
DEEPSPEED = "deepspeed"


@dataclass
class Run:
    """What one tuning run did, read from the files it left."""

    tool: str
    round: int
    rc: int
    wall_s: float
    experiments: int
    best: str | None = None
    stage: int | None = None
    mbs: int | None = None
    gas: int | None = None
    value: float | None = None  # the throughput the tool named its best with
    to_best_s: float | None = None
    to_best_exps: int | None = None
    failed: int = 0  # experiments without a metrics file
    noise: list[float] = field(default_factory=list)  # autotune: |run - mean| / mean of each re-run config
    gap_s: float | None = None  # median idle time of a slot between one experiment's end and the next's start
    reported: int | None = None  # DeepSpeed: the experiments its summary.txt says it ran
    profile_s: float | None = None  # DeepSpeed: its model-info profile run


def tune_config(work: Path, stages: list[int], min_mbs: int, max_mbs: int, start: int, end: int) -> Path:
    """The example's config, the space and profile window as asked, in a run's own directory."""
    config = json.loads(CONFIG.read_text())
    config["zero_optimization"]["stage"] = stages
    config["autotuning"] |= {"min_train_micro_batch_size_per_gpu": min_mbs,
                             "max_train_micro_batch_size_per_gpu": max_mbs,
                             "start_profile_step": start, "end_profile_step": end}
    path = work / "ds.json"
    path.write_text(json.dumps(config, indent=1))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def environment() -> dict[str, str]:
    return os.environ | {"DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT)}


def timed(cmd: list[str], work: Path) -> tuple[int, float, float]:
    """Run a command in `work` (its output in files there): exit status, start and end (wall clock)."""
    with open(work / "out.log", "wb") as out, open(work / "err.log", "wb") as err:
        start = time.time()
        rc = subprocess.run(cmd, cwd=work, env=environment(), stdout=out, stderr=err, check=False).returncode
        return rc, start, time.time()


def run_deepspeed(work: Path, steps: int) -> tuple[int, float, float]:
    cmd = [DEEPSPEED, "--num_gpus", "1", "--master_port", str(free_port()), "--autotuning", "tune", str(TRAIN),
           "--steps", str(steps), "--deepspeed_config", "ds.json"]
    return timed(cmd, work)


def run_autotune(work: Path, slots: int, steps: int) -> tuple[int, float, float]:
    cmd = [sys.executable, "-m", "autotuner", "tune", "--slots", str(slots), "-o", str(work / "res"), str(TRAIN),
           "--steps", str(steps), "--deepspeed_config", "ds.json"]
    return timed(cmd, work)


def config_point(config: dict) -> tuple[int, int, int]:
    return (int(config.get("zero_optimization", {}).get("stage", 0)), int(config["train_micro_batch_size_per_gpu"]),
            int(config.get("gradient_accumulation_steps", 1)))


def summary_best(summary: Path) -> str | None:
    """The `global` row's best_exp_name of DeepSpeed's summary.txt (a pipe table)."""
    if not summary.exists():
        return None
    for line in summary.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == "global" and len(cells) == 4:
            return cells[3]
    return None


def read_deepspeed(work: Path, rnd: int, rc: int, start: float, end: float) -> Run:
    """DeepSpeed's results_dir: one directory per experiment run (exp.json with its exp_id), summary.txt."""
    results = work / "autotuning_results"
    ran = sorted((json.loads((d / "exp.json").read_text())["exp_id"], d) for d in results.glob("*/")
                 if (d / "exp.json").exists())
    run = Run("deepspeed", rnd, rc, end - start, len(ran),
              failed=sum(1 for _, d in ran if not (d / "metrics.json").exists()
                         and not (d / "model_info.json").exists()))
    best = summary_best(results / "summary.txt")
    order = [d.name for _, d in ran]
    # an experiment's exp.json is written at its launch, its stdout.log last at its launcher's exit
    spans = [((d / "exp.json").stat().st_mtime, (d / "stdout.log").stat().st_mtime) for _, d in ran
             if (d / "stdout.log").exists()]
    run.gap_s = median([b[0] - a[1] for a, b in itertools.pairwise(spans)])
    if spans and order[0] == "profile_model_info":
        run.profile_s = spans[0][1] - spans[0][0]
    if (results / "summary.txt").exists():
        tail = (results / "summary.txt").read_text().rsplit("Total number of experiments:", 1)
        run.reported = int(tail[1].strip().rstrip(".")) if len(tail) == 2 else None
    if best is None or best not in order:
        return run
    directory = results / best
    run.best = best
    run.stage, run.mbs, run.gas = config_point(json.loads((directory / "ds_config.json").read_text()))
    run.value = float(json.loads((directory / "metrics.json").read_text())["throughput"])
    run.to_best_s = (directory / "metrics.json").stat().st_mtime - start
    run.to_best_exps = order.index(best) + 1
    return run


def read_autotune(work: Path, tool: str, rnd: int, rc: int, start: float, end: float) -> Run:
    """autotune's ledger: every attempt with its times; the best (ranked by the mean of its runs)."""
    snap = autotuner.snapshot(work / "res")
    ran = sorted((a for a in snap.attempts if a.started_at is not None), key=lambda a: a.started_at or 0.0)
    run = Run(tool, rnd, rc, end - start, len(ran), failed=sum(1 for a in ran if a.metric is None))
    for runs in snap.runs.values():
        values = [a.metric for a in runs if a.metric is not None]
        if len(values) > 1:
            mean = statistics.mean(values)
            run.noise += [abs(v - mean) / mean for v in values]
    by_slot: dict[str, list[tuple[float, float]]] = {}
    for a in ran:
        if a.started_at is not None and a.finished_at is not None:
            by_slot.setdefault(json.dumps(dict(a.slots), sort_keys=True), []).append((a.started_at, a.finished_at))
    run.gap_s = median([b[0] - a[1] for spans in by_slot.values() for a, b in itertools.pairwise(spans)])
    best = snap.best
    if best is None:
        return run
    run.best = best.name
    run.stage, run.mbs, run.gas = config_point(dict(snap.experiments[best.name].ds_config))
    run.value = snap.value(best)
    run.to_best_s = (work / "res" / best.name / "metrics.json").stat().st_mtime - start
    run.to_best_exps = [a.name for a in ran].index(best.name) + 1
    return run


def one(tool: str, rnd: int, base: Path, args: argparse.Namespace) -> Run:
    work = base / f"r{rnd}-{tool}"
    work.mkdir(parents=True)
    tune_config(work, args.stages, args.min_mbs, args.max_mbs, args.start_step, args.end_step)
    steps = args.end_step + 2
    if tool == "deepspeed":
        rc, start, end = run_deepspeed(work, steps)
    else:
        rc, start, end = run_autotune(work, int(tool.rsplit("-", 1)[1]), steps)
    (work / "timing.json").write_text(json.dumps({"rc": rc, "start": start, "end": end}))
    return read_run(work)


def read_run(work: Path) -> Run:
    """A finished run's figures from its directory (`--read` reports kept runs again). Without timing.json (a run
    cut short): its start is when its config was written, its end its output's last write."""
    rnd, tool = work.name[1:].split("-", 1)
    timing = work / "timing.json"
    if timing.exists():
        t = json.loads(timing.read_text())
        rc, start, end = int(t["rc"]), float(t["start"]), float(t["end"])
    else:
        rc, start, end = -1, (work / "ds.json").stat().st_mtime, (work / "out.log").stat().st_mtime
    if tool == "deepspeed":
        return read_deepspeed(work, int(rnd), rc, start, end)
    return read_autotune(work, tool, int(rnd), rc, start, end)


def verify(points: list[tuple[int, int, int]], times: int, base: Path, args: argparse.Namespace
           ) -> dict[tuple[int, int, int], list[float]]:
    """Each named config run `times` more, interleaved, through the plain launcher with DeepSpeed's own profiler."""
    measured: dict[tuple[int, int, int], list[float]] = {p: [] for p in points}
    for i in range(times):
        for stage, mbs, gas in points:
            work = base / f"verify-z{stage}-mbs{mbs}-gas{gas}-{i}"
            work.mkdir(parents=True)
            config = json.loads(CONFIG.read_text())
            config.update({"train_micro_batch_size_per_gpu": mbs, "gradient_accumulation_steps": gas,
                           "zero_optimization": {"stage": stage}})
            config["autotuning"] = {"enabled": True, "metric_path": str(work / "metrics.json"),
                                    "start_profile_step": args.start_step, "end_profile_step": args.end_step}
            (work / "ds.json").write_text(json.dumps(config))
            cmd = [DEEPSPEED, "--num_gpus", "1", "--master_port", str(free_port()), str(TRAIN),
                   "--steps", str(args.end_step + 2), "--deepspeed_config", "ds.json"]
            timed(cmd, work)
            if (work / "metrics.json").exists():
                measured[(stage, mbs, gas)].append(float(json.loads((work / "metrics.json").read_text())["throughput"]))
    return measured


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def report(runs: list[Run], tools: list[str]) -> str:
    lines = ["| round | tool | rc | wall s | time-to-best s | experiments | experiments-to-best "
             "| best (stage, mbs, gas) | best throughput | no metrics |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|---:|"]
    for r in runs:
        point = "-" if r.best is None else f"z{r.stage} mbs{r.mbs} gas{r.gas}"
        lines.append(f"| {r.round} | {r.tool} | {r.rc} | {r.wall_s:.1f} | {fmt(r.to_best_s)} | {r.experiments} | "
                     f"{r.to_best_exps or '-'} | {point} | {fmt(r.value, 0)} | {r.failed} |")
    lines += ["", "| tool | runs | median wall s | median time-to-best s | median experiments | "
                  "median experiments-to-best | median best throughput "
                  "| time-to-best / DeepSpeed's (median of rounds) | wall / DeepSpeed's | slot idle between runs s |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    by_round = {(r.tool, r.round): r for r in runs}
    for tool in tools:
        mine = [r for r in runs if r.tool == tool]
        ratios = [r.to_best_s / ds.to_best_s for r in mine
                  if (ds := by_round.get(("deepspeed", r.round))) and r.to_best_s and ds.to_best_s]
        walls = [r.wall_s / ds.wall_s for r in mine if (ds := by_round.get(("deepspeed", r.round)))]
        lines.append(
            f"| {tool} | {len(mine)} | {fmt(median([r.wall_s for r in mine]))} | "
            f"{fmt(median([r.to_best_s for r in mine if r.to_best_s is not None]))} | "
            f"{fmt(median([float(r.experiments) for r in mine]))} | "
            f"{fmt(median([float(r.to_best_exps) for r in mine if r.to_best_exps]))} | "
            f"{fmt(median([r.value for r in mine if r.value is not None]), 0)} | {fmt(median(ratios), 2)} | "
            f"{fmt(median(walls), 2)} | {fmt(median([r.gap_s for r in mine if r.gap_s is not None]), 2)} |")
    ds_runs = [r for r in runs if r.tool == "deepspeed"]
    if ds_runs:
        lines += ["", "DeepSpeed's own count (summary.txt, 'Total number of experiments') against the experiments "
                      "it ran (profile run included): " + ", ".join(f"{r.reported} vs {r.experiments}" for r in ds_runs)
                  + "; its model-info profile run (ZeRO-3, micro-batch 1) took "
                  + ", ".join(f"{fmt(r.profile_s)} s" for r in ds_runs)]
    noise = [n for r in runs for n in r.noise]
    if noise:
        lines += ["", f"Noise of one measurement (autotune's re-runs of a config: |run - mean| / mean): median "
                      f"{100 * statistics.median(noise):.1f}%, max {100 * max(noise):.1f}% (n={len(noise)})"]
    return "\n".join(lines)


def verify_report(measured: dict[tuple[int, int, int], list[float]], runs: list[Run]) -> str:
    named: dict[tuple[int, int, int], list[str]] = {}
    for r in runs:
        if r.stage is not None and r.mbs is not None and r.gas is not None:
            named.setdefault((r.stage, r.mbs, r.gas), []).append(f"{r.tool} r{r.round}")
    lines = ["| config | named by | runs | mean throughput | min | max |", "|---|---|---:|---:|---:|---:|"]
    for (stage, mbs, gas), values in sorted(measured.items(), key=lambda kv: -(median(kv[1]) or 0.0)):
        lines.append(f"| z{stage} mbs{mbs} gas{gas} | {', '.join(named.get((stage, mbs, gas), []))} | {len(values)} | "
                     f"{fmt(statistics.mean(values) if values else None, 0)} | {fmt(min(values, default=None), 0)} | "
                     f"{fmt(max(values, default=None), 0)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stages", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    parser.add_argument("--min-mbs", type=int, default=4)
    parser.add_argument("--max-mbs", type=int, default=32)
    parser.add_argument("--start-step", type=int, default=5, help="start_profile_step of every run")
    parser.add_argument("--end-step", type=int, default=15, help="end_profile_step of every run")
    parser.add_argument("--slots", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2],
                        help="autotune's slot counts, each a tool of its own")
    parser.add_argument("--verify", type=int, default=0, help="run each named config this many times more")
    parser.add_argument("--keep", type=Path, help="keep every run's directory here (default: a temporary one)")
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    parser.add_argument("--read", type=Path, help="run nothing: report the runs kept in this directory (--keep)")
    args = parser.parse_args()
    try:
        import tabulate  # noqa: F401  (DeepSpeed's autotuner asserts it is installed)
    except ImportError:
        sys.exit("DeepSpeed's autotuner needs tabulate: pip install tabulate")
    if shutil.which(DEEPSPEED) is None:
        sys.exit("no `deepspeed` launcher on PATH")
    base = args.read or args.keep or Path(tempfile.mkdtemp(prefix="vs_deepspeed-"))
    tools = ["deepspeed"] + [f"autotune-{n}" for n in args.slots]
    runs: list[Run] = []
    if args.read:
        runs = [read_run(d) for d in sorted(args.read.glob("r*-*/"), key=lambda d: (int(d.name[1:].split("-")[0]),
                                                                                       d.stat().st_mtime))
                if (d / "out.log").exists()]
    for rnd in range(0 if args.read else args.rounds):
        shift = rnd % len(tools)
        for tool in tools[shift:] + tools[:shift]:
            run = one(tool, rnd, base, args)
            runs.append(run)
            print(f"round {rnd} {tool}: rc {run.rc}, wall {run.wall_s:.1f} s, best {run.best} "
                  f"({fmt(run.value, 0)}) after {fmt(run.to_best_s)} s, {run.to_best_exps}/{run.experiments} "
                  "experiments", flush=True)
    print(report(runs, tools))
    measured: dict[tuple[int, int, int], list[float]] = {}
    if args.verify:
        points = sorted({(r.stage, r.mbs, r.gas) for r in runs
                         if r.stage is not None and r.mbs is not None and r.gas is not None})
        measured = verify(points, args.verify, base, args)
        print()
        print(verify_report(measured, runs))
    if args.json:
        args.json.write_text(json.dumps({"runs": [asdict(r) for r in runs],
                                         "verify": {f"z{s}_mbs{m}_gas{g}": v for (s, m, g), v in measured.items()}},
                                        indent=1))
    if args.keep is None and args.read is None:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
