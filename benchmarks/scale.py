"""The CLI on a sweep of 10,000 recorded experiments: resume until the first launch, status, report, compare.

The sweep is made through the Python API (autotuner.prepare), its history written into its ledger: most experiments
succeeded with metrics, some failed, some were interrupted, some are still queued, and a few were left
`running` by a runner that died (no process of theirs exists any more). Then, each as a subprocess:

  resume -> first launch   from just before `autotune resume` is started to the first `launched_at` the new
                           runner writes to the ledger (benchmarks/standin.sh as launcher); the runner is then
                           stopped with `autotune cancel`. Each round works on a fresh copy of the sweep.
  status, status --json,   wall time of the whole command
  report (table, json, csv, md), compare (the sweep with itself), --help, --version, `import autotuner`

  python benchmarks/scale.py --experiments 10000 --rounds 5
  python benchmarks/scale.py --code OLD_CHECKOUT --code . --rounds 5   # interleaved: each command under each
  python benchmarks/scale.py --full-configs --rounds 5                   # whole ds_configs (FULL_CONFIG)

With --code (repeatable), every command runs under each checkout's code in turn (PYTHONPATH), round after round,
so a load swing on a shared machine hits them alike; the sweep is built once, by this checkout. With Optuna
installed (the `tune` extra), Optuna's own CLI on a 10,000-trial SQLite study is timed in the same rounds as an
anchor (`optuna trials -f json`, `optuna best-trial`, `optuna --help`); --no-optuna leaves it out.

Targets (issue 24): status, report (every format) and compare < 0.3 s; resume to first launch < 0.5 s; --help and
--version < 0.15 s; import < 30 ms; at 100,000 experiments every one < 2 s.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.environ.get("SCALE_BUILD_CODE") or str(ROOT))  # (set for --build-only: that checkout's)

import autotuner  # noqa: E402
from autotuner import Reason, State  # noqa: E402
from autotuner.ledger.store import Ledger  # noqa: E402  # the one internal: the API runs sweeps, it does not fake history

STANDIN = ROOT / "benchmarks" / "standin.sh"
SLOTS = 8


# `--full-configs`: each experiment's ds_config as users write a whole one (optimizer, scheduler, precision, ZeRO
# settings) around the same three swept values. The report flattens every config to find what the sweep varies,
# so the configs' size is part of what it costs.
FULL_CONFIG = {
    "gradient_clipping": 1.0, "steps_per_print": 100, "wall_clock_breakdown": False,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-5, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-5, "warmup_num_steps": 500}},
    "bf16": {"enabled": True}, "fp16": {"enabled": False},
    "zero_optimization": {"overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": 5e8,
                          "allgather_bucket_size": 5e8, "stage3_prefetch_bucket_size": 5e7,
                          "stage3_param_persistence_threshold": 1e5, "offload_optimizer": {"device": "none"},
                          "offload_param": {"device": "none"}},
    "activation_checkpointing": {"partition_activations": False, "cpu_checkpointing": False},
    "flops_profiler": {"enabled": False}, "comms_logger": {"enabled": False}}


def ds_config(i: int, full: bool) -> dict[str, object]:
    """The `i`th experiment's config: micro-batch, ZeRO stage and accumulation swept, the whole rest fixed if `full`."""
    swept = {"train_micro_batch_size_per_gpu": 2 ** (i % 6), "zero_optimization": {"stage": i % 3},
             "gradient_accumulation_steps": 1 + i % 4}
    if not full:
        return swept
    fixed = json.loads(json.dumps(FULL_CONFIG))  # every experiment its own objects, as the ledger's decode gives
    fixed["zero_optimization"]["stage"] = i % 3
    return {**fixed, **swept, "zero_optimization": fixed["zero_optimization"]}


def build(directory: Path, n: int, full: bool = False) -> dict[str, int]:
    """A sweep of `n` experiments in `directory`, recorded as a long sweep would have left it."""
    experiments = tuple(
        autotuner.Experiment(name=f"scale_z{i % 3}_mbs{2 ** (i % 6)}_i{i:05d}", ds_config=ds_config(i, full),
                   num_gpus=1, num_nodes=1, script=str(STANDIN), args=("--steps", "10"), timeout=None, env={},
                   source="benchmarks/scale.py")
        for i in range(n))
    sweep = autotuner.Sweep(name="scale", experiments=experiments, metric=autotuner.metric_named("throughput"),
                            source="scale")
    autotuner.prepare(sweep, autotuner.load_cluster(slots=SLOTS), directory, launcher=["sh", str(STANDIN)])

    ledger = Ledger.open(directory)
    # Setting up is not what is measured: one fsync per transition would take minutes for 10k experiments.
    ledger._db.execute("PRAGMA synchronous=OFF")
    counts: dict[State, int] = {}
    now = time.time() - n  # as if the sweep had run for a while
    for i, e in enumerate(experiments):
        slot = i % SLOTS
        if i % 500 == 7:
            kind = State.QUEUED
        elif i % 200 == 3:
            kind = State.INTERRUPTED
        elif i % 150 == 1:
            kind = State.FAILED
        elif i % 2500 == 11:
            kind = State.RUNNING  # left by a runner that was killed; its processes are gone
        else:
            kind = State.SUCCEEDED
        if kind == State.RUNNING:  # a slot of its own, as a real runner would have held
            slot = (i // 2500) % SLOTS
        counts[kind] = counts.get(kind, 0) + 1
        if kind == State.QUEUED:
            continue
        at = now + i
        ledger.start(e.name, 1, slots={"localhost": [slot]}, tag=f"deadbeef.{e.name}.1", dir=str(directory / e.name),
                     at=at)
        ledger.launched(e.name, 1, pid=1, port=29500 + slot, at=at + 0.01)
        if kind == State.SUCCEEDED:
            value = 1000.0 + (i * 7919) % 5000
            ledger.finish(e.name, 1, State.SUCCEEDED, at + 0.9, exit_code=0, metric=value,
                          metrics={"throughput": value, "latency": 1.0 / value, "FLOPS_per_gpu": value * 1e9})
        elif kind == State.FAILED:
            ledger.finish(e.name, 1, State.FAILED, at + 0.5, reason=Reason.OOM, exit_code=1,
                          detail="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
        elif kind == State.INTERRUPTED:
            ledger.finish(e.name, 1, State.INTERRUPTED, at + 0.5, reason=Reason.INTERRUPTED,
                          detail="interrupted by the user")
    ledger.close()
    return counts


def cli(*args: object) -> list[str]:
    return [sys.executable, "-m", "autotuner", *map(str, args)]


def code_env(code: Path | None) -> dict[str, str]:
    """The environment that runs `code`'s autotuner (None: this checkout's)."""
    return {**os.environ, "PYTHONPATH": str(code or ROOT)}


def cpu_of_children() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def wall(*args: object, code: Path | None = None, command: list[str] | None = None) -> tuple[float, float]:
    """Wall seconds of the whole command, and the CPU seconds it used (user + system): on a loaded machine the
    CPU time moves far less than the wall time."""
    cpu, started = cpu_of_children(), time.perf_counter()
    done = subprocess.run(command or cli(*args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env=code_env(code), cwd=code or ROOT)  # `-m` and `-c` put the cwd first on sys.path
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, command or args))} failed: {done.stderr}")
    return took, cpu_of_children() - cpu


def optuna_study(directory: Path, n: int) -> str | None:
    """A SQLite study of `n` finished trials (two parameters, one value) for Optuna's CLI; None without Optuna."""
    try:
        import optuna
    except ImportError:
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{directory / 'optuna.db'}"
    study = optuna.create_study(study_name="anchor", storage=storage, direction="maximize")
    dist = {"stage": optuna.distributions.CategoricalDistribution([0, 1, 2, 3]),
            "mbs": optuna.distributions.IntDistribution(1, 1024)}
    study.add_trials([optuna.trial.create_trial(params={"stage": i % 4, "mbs": 1 + i % 1024}, distributions=dist,
                                                value=float((i * 7919) % 5000)) for i in range(n)])
    return storage


def first_launch(template: Path, workdir: Path, round_: int, code: Path | None = None) -> float:
    """Seconds from starting `autotune resume` on a fresh copy of the sweep to its first launch."""
    directory = workdir / f"resume{round_}-{len(list(workdir.glob('resume*')))}"
    directory.mkdir()
    for name in ("ledger.sqlite", "hostfile"):
        shutil.copy2(template / name, directory / name)
    db = sqlite3.connect(directory / "ledger.sqlite")
    db.execute("UPDATE meta SET value = ? WHERE key = 'sweep_id'", (f'"r{round_}{os.getpid()}"',))
    db.commit()
    db.close()
    # Stand-ins sleep 5 s: one left by a runner that had to be killed ends by itself soon after the benchmark.
    env = {**code_env(code), "STANDIN_SECONDS": "5"}
    started = time.time()
    proc = subprocess.Popen(cli("resume", directory, "-q", "--grace", "1"), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=code or ROOT)
    try:
        seen = None
        while seen is None:
            if proc.poll() is not None:
                raise SystemExit(f"resume ended before launching anything: {proc.stderr.read()}")
            db = sqlite3.connect(f"file:{directory / 'ledger.sqlite'}?mode=ro", uri=True, timeout=30)
            try:
                seen = db.execute("SELECT MIN(launched_at) FROM attempts WHERE launched_at >= ?",
                                  (started,)).fetchone()[0]
            finally:
                db.close()
            if seen is None:
                time.sleep(0.005)
        took = seen - started
        stop = subprocess.run(cli("cancel", directory), capture_output=True, text=True, env=code_env(code),
                              cwd=code or ROOT)
        if stop.returncode != 0:
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiments", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keep", type=Path, help="build the sweep here and keep it (default: a temp dir)")
    parser.add_argument("--code", type=Path, action="append",
                        help="a checkout whose autotuner runs each command (repeat it to interleave several)")
    parser.add_argument("--no-optuna", action="store_true", help="leave Optuna's CLI (the anchor) out")
    parser.add_argument("--full-configs", action="store_true",
                        help="whole ds_configs as users write them around the swept keys (see FULL_CONFIG)")
    parser.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)  # one checkout's sweep
    opts = parser.parse_args()
    codes: list[Path | None] = list(opts.code or [None])
    if opts.build_only:
        build(opts.keep, opts.experiments, opts.full_configs)
        return

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        started = time.perf_counter()
        templates = {code: (opts.keep or workdir) / f"sweep{i}" for i, code in enumerate(codes)}
        if len(codes) == 1:
            counts = build(templates[codes[0]], opts.experiments, opts.full_configs)
            print(f"built {opts.experiments} experiments in {time.perf_counter() - started:.1f} s: "
                  + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())), flush=True)
        else:  # each checkout builds its own: its ledger is of its own version (an older one refuses a newer one)
            for code, template in templates.items():
                subprocess.run([sys.executable, __file__, "--build-only", "--keep", str(template), "--experiments",
                                str(opts.experiments), *(["--full-configs"] if opts.full_configs else [])],
                               check=True, env={**os.environ, "SCALE_BUILD_CODE": str(Path(str(code)).resolve())})
            print(f"built {opts.experiments} experiments for each checkout in {time.perf_counter() - started:.1f} s",
                  flush=True)
        storage = None if opts.no_optuna else optuna_study(workdir, 10_000)
        figures: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for round_ in range(opts.rounds):
            for code in codes:
                label, template = str(code or "."), templates[code]
                commands = (("status", ("status", template)), ("status --json", ("status", template, "--json")),
                            ("report", ("report", template)),
                            ("report --format json", ("report", template, "--format", "json")),
                            ("report --format csv", ("report", template, "--format", "csv")),
                            ("report --format md", ("report", template, "--format", "md")),
                            ("compare", ("compare", template, template)),
                            ("--help", ("--help",)), ("--version", ("--version",)))
                figures.setdefault((label, "resume -> first launch"), []).append(
                    (first_launch(template, workdir, round_, code), float("nan")))
                for name, args in commands:
                    figures.setdefault((label, name), []).append(wall(*args, code=code))
                figures.setdefault((label, "import autotuner"), []).append(
                    wall(code=code, command=[sys.executable, "-c", "import autotuner"]))
                figures.setdefault((label, "python -c pass"), []).append(
                    wall(code=code, command=[sys.executable, "-c", "pass"]))
            if storage is not None:
                optuna_cli = [shutil.which("optuna") or "optuna"]
                for name, argv in (("trials -f json", ["trials", "--study-name", "anchor", "--storage", storage,
                                                         "-f", "json"]),
                                   ("best-trial", ["best-trial", "--study-name", "anchor", "--storage", storage]),
                                   ("--help", ["--help"])):
                    figures.setdefault(("optuna", name), []).append(wall(command=optuna_cli + argv))
        print(f"median of {opts.rounds} rounds, seconds: wall (min-max), CPU (user + system)")
        for (label, name), pairs in figures.items():
            walls, cpus = [w for w, _ in pairs], [c for _, c in pairs]
            print(f"  {label:<20} {name:<24} {statistics.median(walls):6.3f}   ({min(walls):.3f}-{max(walls):.3f})"
                  f"   cpu {statistics.median(cpus):6.3f}")


if __name__ == "__main__":
    main()
