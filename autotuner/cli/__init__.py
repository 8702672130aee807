"""`autotune`: the command line. A thin face over the Python API (`autotuner`): parse, call, print. Bad input is
one line and exit status 2.

Start-up stays fast: nothing here imports torch, deepspeed or the SSH stack on the way to `--help`.
"""
from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any, NoReturn

import typer

import autotuner
from autotuner import UserError

# Not sweep operations, so not API: `limits`, the bounds that option values are checked against and the default
# timeout named in --timeout's help (applied by `autotuner.timeout_seconds`), and `shown`, which quotes user
# text in a one-line message.
from .. import limits
from ..backends.ray import ask as ray_ask
from ..errors import shown
from .bundles import GPUS_PER_NODE, NODES, SLURM_OPTIONS, asks_slurm

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Run a space of DeepSpeed configurations across GPU slots and keep the fastest.")


EVENTS_HELP = ("Append one JSON line per event (started, finished: name, attempt, slots, state, reason, metric, "
               "timestamp) to this file, for scripts.")

# Options that several commands share.
HOSTFILE = typer.Option(None, "--hostfile", "-H", help="DeepSpeed hostfile; none = this machine.")
INCLUDE = typer.Option("", "--include", "-i", help="DeepSpeed syntax, e.g. worker-0:0,1@worker-1.")
EXCLUDE = typer.Option("", "--exclude", "-e", help="DeepSpeed syntax, e.g. worker-1:0.")
RESULTS = typer.Option(None, "--results", "-o", help="Results directory \\[default: results/NAME-TIME].")
RETRIES = typer.Option(1, "--retries", min=0, max=100, help="Retries of transient failures (launch, lost host).")
LAUNCHER = typer.Option(None, "--launcher", help="Command that starts DeepSpeed's launcher \\[default: deepspeed].")
GRACE = typer.Option(10.0, "--grace", help="Seconds between SIGTERM and SIGKILL when ending a run.")
SSH_CONFIG = typer.Option(None, "--ssh-config", help="ssh config file to use instead of ~/.ssh/config.")
ACCEPT_NEW_HOSTS = typer.Option(False, "--accept-new-hosts",
                                help="Trust (and record) host keys not yet in known_hosts.")
REMOTE_DIR = typer.Option(None, "--remote-dir",
                          help="Where runs write on hosts without our filesystem; copied back over SFTP.")
QUIET = typer.Option(False, "--quiet", "-q", help="Print only the outcome.")
FAIL_ON = typer.Option(autotuner.FailOn.ANY, "--fail-on",
                       help="When to exit 1: `any` experiment did not succeed, or only `no-result` (none "
                            "succeeded, so no best config: an OOM alone then exits 0).")
EVENTS = typer.Option(None, "--events", help=EVENTS_HELP)
GPU_TYPE = typer.Option(None, "--gpu-type", help="Run every experiment on GPUs of this type (a hostfile's gpu=, or "
                                                 "this machine's, e.g. A100-SXM4-80GB); wins over gpu_type in files.")
GPU_MIXED = typer.Option(False, "--gpu-mixed", help="Let one experiment span GPU types (by default each runs on "
                                                    "one type).")
RAY = typer.Option(None, "--ray", metavar="[ADDRESS]",
                   help="Run on a Ray cluster (KubeRay, `ray up`), as a client: the one at ADDRESS, else RAY_ADDRESS, "
                        "else auto (a cluster this machine is a node of). Never starts one.")
RESULT_HELP = ("table: the outcome in lines; json: only one JSON object on stdout when the sweep ends (counts, "
               "best, its files, exit code), no event lines there (--events writes them).")


class Format(StrEnum):
    """What a read command prints (`--format`): a table for people, or JSON, CSV, Markdown for programs."""

    table = "table"
    json = "json"
    csv = "csv"
    md = "md"


class Brief(StrEnum):
    """`--format` where only lines for people or one JSON object make sense (status, plan, cancel, run)."""

    table = "table"
    json = "json"


def _format_option(help_text: str, default: Enum = Format.table) -> Any:
    """--format / -f: typer lists the enum's choices in --help and refuses others as a usage error."""
    return typer.Option(default, "--format", "-f", help=help_text, case_sensitive=False)


def _screen() -> autotuner.Output:
    """How tables fit stdout: a terminal's width and colour (none with NO_COLOR), a pipe's plain text."""
    return autotuner.Output.of(sys.stdout)


class _Stderr(logging.Handler):
    """Log records to whatever sys.stderr is when they are emitted (a test runner may swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


class _OneLine(logging.Formatter):
    """`autotune: ...` on one line; a traceback only with --debug, else the exception's own line."""

    def __init__(self, debug: bool) -> None:
        super().__init__()
        self.debug = debug

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.levelno >= logging.WARNING:
            text = f"{record.levelname.lower()}: {text}"
        if self.debug:
            text = f"{record.name}: {text}"
            if record.exc_info:
                text += "\n" + self.formatException(record.exc_info)
            return f"autotune: {text}"
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            text += f" ({type(error).__name__}: {error})"
        return "autotune: " + " ".join(text.split())


def _configure_logging(level: int) -> None:
    """The library logs to logging.getLogger("autotuner"); the command shows it on stderr from `level` up."""
    logger = logging.getLogger("autotuner")
    for handler in [h for h in logger.handlers if isinstance(h, _Stderr)]:  # one per process, however often called
        logger.removeHandler(handler)
    handler = _Stderr()
    handler.setFormatter(_OneLine(debug=level <= logging.DEBUG))
    logger.addHandler(handler)
    logger.setLevel(level)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"autotune {autotuner.__version__}")
        raise typer.Exit(0)


@app.callback()
def _options(verbose: bool = typer.Option(False, "--verbose", "-v", help="Also say what is being done."),
             debug: bool = typer.Option(False, "--debug", help="Everything the library logs, tracebacks included."),
             version: bool = typer.Option(False, "--version", is_eager=True, callback=_show_version,
                                          help="Print the version and exit.")) -> None:
    _configure_logging(logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING)


def _timeout_value(text: str) -> float | str:
    """`--timeout SECONDS` or `--timeout none` (no limit); anything else is a usage error."""
    if text.strip().lower() == "none":
        return "none"
    try:
        value = float(text)
    except ValueError:
        raise typer.BadParameter(f"expected a number of seconds or `none`, not {shown(text)}") from None
    if not (0 < value < float("inf")):
        raise typer.BadParameter(f"expected a positive number of seconds or `none`, not {shown(text)}")
    if value > limits.SECONDS:
        raise typer.BadParameter(f"{shown(text)} seconds is more than {limits.SECONDS:,} (the limit); "
                                 "use `none` for no limit")
    return value


def fail(error: UserError | str) -> typer.Exit:
    typer.echo(f"autotune: error: {error}", err=True)
    return typer.Exit(2)


def _split(text: str, option: str) -> list[str]:
    """A shell-quoted option value as words; unbalanced quotes are bad input, named by their option."""
    try:
        return shlex.split(text)
    except ValueError as e:
        raise UserError(f"{option} {text!r}: {e}") from None


def _seconds(value: float | None, option: str, *, positive: bool = False) -> None:
    """A number of seconds given on the command line: finite, not negative (with `positive`, above 0)."""
    if value is not None and (value != value or value in (float("inf"), float("-inf")) or value < 0
                              or (positive and value == 0)):
        raise UserError(f"{option} must be a {'positive' if positive else 'non-negative'} number of seconds, "
                        f"not {value:g}")
    if value is not None and value > limits.SECONDS:
        raise UserError(f"{option} {value:g} is more than {limits.SECONDS:,} seconds (the limit)")


def _results_path(results: str | None) -> Path | None:
    """`--results`: None for the default; an empty path is refused (Path("") is ".": a sweep spread over the
    current directory)."""
    if results is not None and not results.strip():
        raise UserError("--results: an empty path; name a directory")
    return None if results is None else Path(results)


def _check_outputs(events: Path | None, results: Path | None, inputs: Sequence[str | Path | None],
                   specs: Sequence[Path] = ()) -> None:
    """What `run` and `tune` write, checked against what they read, before anything is asked of a cluster: the
    --events file, and the results directory (its own files over an input; a directory of experiment files)."""
    if events is not None:
        autotuner.check_output(events, "--events", inputs)
        autotuner.check_events_path(events)
    if results is not None:
        autotuner.check_results_directory(results, inputs, [p for p in specs if p.is_dir()])


def _check_execution(deadline: float | None, grace: float, ssh_config: Path | None) -> None:
    """What `run`, `tune` and `resume` check of how to execute before anything is created or launched."""
    _seconds(deadline, "--deadline", positive=True)
    _seconds(grace, "--grace")
    _check_ssh_config(ssh_config)


def _check_ssh_config(path: Path | None) -> None:
    """An ssh config file named on the command line must be there before anything is created or launched."""
    if path is None:
        return
    if not path.is_file():
        raise UserError("--ssh-config: no such file" if not path.exists() else "--ssh-config: not a file", path)
    if not os.access(path, os.R_OK):
        raise UserError("--ssh-config: cannot read this file", path)


@app.command()
@asks_slurm
def run(
    specs: list[Path] = typer.Argument(..., help="Sweep files (hjson), DeepSpeed experiment files, or directories "
                                                 "of them."),
    hostfile: Path | None = HOSTFILE,
    include: str = INCLUDE,
    exclude: str = EXCLUDE,
    slots: int | None = typer.Option(None, "--slots", min=1,
                                     help="Run on this many CPU slots of this machine (no GPU needed)."),
    results: str | None = RESULTS,
    script: str | None = typer.Option(None, "--script", help="Training script, for experiment files that name none."),
    args: str = typer.Option("", "--args", help="The script's arguments, as one shell-quoted string."),
    metric: str | None = typer.Option(None, "--metric", help=f"{', '.join(autotuner.KNOWN)}, or NAME:min|max."),
    timeout: str | None = typer.Option(None, "--timeout", parser=_timeout_value, metavar="SECONDS|none",
                                          help="Seconds an experiment may run, unless its spec says; `none`: no "
                                               f"limit \\[default: {limits.DEFAULT_TIMEOUT:g}]."),
    deadline: float | None = typer.Option(None, "--deadline", help="Seconds the whole sweep may run."),
    retries: int = RETRIES,
    grace: float = GRACE,
    launcher: str | None = LAUNCHER,
    placement: str = typer.Option("pack", "--placement", help="pack (best fit), spread, or memory (only GPUs with "
                                                              "room for the sweep's gpu_memory)."),
    past: Path | None = typer.Option(None, "--from", help="A sweep already run: the peak GPU memory each config held "
                                                          "there is the need of the same config here, where its "
                                                          "spec states no gpu_memory."),
    gpu_type: str | None = GPU_TYPE,
    gpu_mixed: bool = GPU_MIXED,
    ssh_config: Path | None = SSH_CONFIG,
    accept_new_hosts: bool = ACCEPT_NEW_HOSTS,
    remote_dir: str | None = REMOTE_DIR,
    quiet: bool = QUIET,
    events: Path | None = EVENTS,
    fail_on: autotuner.FailOn = FAIL_ON,
    ask: autotuner.SlurmAsk = SLURM_OPTIONS,
    ray: str | None = RAY,
    fmt: Brief = _format_option(RESULT_HELP, Brief.table),
) -> None:
    """Run a sweep and report the best configuration."""
    notes: list[str] = []
    try:  # everything that can be checked before a cluster is asked for anything (an allocation, a probe)
        ask.check(hostfile, slots, include, exclude)
        ask.check_runnable()
        ray_ask.check(ray, hostfile=hostfile, slots=slots, slurm=ask.slurm, include=include, exclude=exclude)
        _check_execution(deadline, grace, ssh_config)
        launch = _split(launcher, "--launcher") if launcher else None
        chosen = _names(placement, "--placement", autotuner.PLACEMENTS, one=True)[0]
        directory_asked = _results_path(results)
        # Paths absolute: `resume` reads them again from any directory.
        sweep = autotuner.load_sweep([p.resolve() for p in specs], script=script, args=_split(args, "--args"),
                                     metric=metric, gpu_type=gpu_type, gpu_mixed=gpu_mixed)
        _check_outputs(events, directory_asked, [*sweep.paths(), hostfile, ssh_config], specs)
        peaks = autotuner.measured_peaks(past) if past is not None else None
    except UserError as e:
        raise fail(e) from None
    allocation = _slurm_allocation(ask)
    with _given_back(allocation):
        try:
            ssh = _ssh(ssh_config, accept_new_hosts, remote_dir)
            cluster = autotuner.ray_cluster(ray) if ray is not None else _cluster(
                allocation, hostfile, include, exclude, slots, sweep, notes.append, ssh or autotuner.Ssh())
            options = autotuner.Options(ssh=ssh, grace=grace,
                                        retries=retries, deadline=deadline,
                                        timeout=autotuner.timeout_seconds(timeout), placement=chosen,
                                        fail_on=fail_on, slurm=allocation, ray=ray)
            directory = autotuner.prepare(sweep, cluster, directory_asked, launcher=launch,
                                          timeout=options.timeout, memory_from=peaks)
        except UserError as e:
            raise fail(e) from None
        for note in notes:
            typer.echo(f"autotune: note: {note}", err=True)
        if not quiet:  # with --format json stdout holds only the result
            typer.echo(f"sweep {sweep.name}: {len(sweep.experiments)} experiments on "
                       f"{sum(len(s) for s in cluster.slots.values())} {cluster.accelerator} slot(s) of "
                       f"{len(cluster.slots)} host(s); results in {directory}", err=fmt == Brief.json)
        _execute(directory, options, quiet, events, fmt=fmt)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                "allow_interspersed_args": False})
@asks_slurm
def tune(
    ctx: typer.Context,
    script: str = typer.Argument(..., help="The training script; everything after it goes to the script, which "
                                           "names its DeepSpeed config (--deepspeed_config ds.json, or --deepspeed "
                                           "ds.json for a Trainer script). Or a tune file (.hjson) stating it all."),
    hostfile: Path | None = HOSTFILE,
    include: str = INCLUDE,
    exclude: str = EXCLUDE,
    slots: int | None = typer.Option(None, "--slots", min=1,
                                     help="Tune on this many CPU slots of this machine (no GPU needed)."),
    num_gpus: int | None = typer.Option(None, "--num_gpus", "--num-gpus", min=1,
                                        help="Slots per node of each experiment (default: a tune file's, or 1)."),
    num_nodes: int | None = typer.Option(None, "--num_nodes", "--num-nodes", min=1,
                                         help="Nodes of each experiment (default: a tune file's, or 1)."),
    results: str | None = RESULTS,
    timeout: str | None = typer.Option(None, "--timeout", parser=_timeout_value, metavar="SECONDS|none",
                                          help="Seconds an experiment may run; `none`: no limit "
                                               f"\\[default: {limits.DEFAULT_TIMEOUT:g}]."),
    deadline: float | None = typer.Option(None, "--deadline", help="Seconds the whole tuning may run."),
    confirm: int | None = typer.Option(None, "--confirm", min=0, metavar="K",
                                       help="Run the K best configs once more and rank them by the mean of their "
                                            "runs before the winner is named; 0: no re-runs \\[default: 2 when "
                                            "more than 2 configs succeeded]."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random and model_based tuners: the same seed, the "
                                               "same search."),
    min_improvement: float = typer.Option(0.0, "--min-improvement", metavar="PERCENT",
                                          help="Early stopping (tuner_early_stopping N) counts a run as progress "
                                               "only when it beats the best so far by this many percent "
                                               "(0 to 1000)."),
    retries: int = RETRIES,
    grace: float = GRACE,
    launcher: str | None = LAUNCHER,
    ssh_config: Path | None = SSH_CONFIG,
    accept_new_hosts: bool = ACCEPT_NEW_HOSTS,
    remote_dir: str | None = REMOTE_DIR,
    quiet: bool = QUIET,
    events: Path | None = EVENTS,
    ask: autotuner.SlurmAsk = SLURM_OPTIONS,
    ray: str | None = RAY,
) -> None:
    """Find the fastest DeepSpeed config for a script without writing the grid: your usual DeepSpeed command,
    with `autotune tune` where `deepspeed` stood. The config's `autotuning` section is read as DeepSpeed
    documents it; each ZeRO stage's largest micro-batch size that fits is searched (tuner_type gridsearch), or
    the grid sampled (random, model_based); with `fast: false` each stage's ZeRO knobs too (bucket sizes,
    overlap_comm, reduce_scatter, contiguous_gradients); runs out of memory are answers, not failures; the best
    configs are run again before the winner is named."""
    try:  # everything that can be checked before a cluster is asked for anything (an allocation, a probe)
        ask.check(hostfile, slots, include, exclude)
        ask.check_runnable()
        ray_ask.check(ray, hostfile=hostfile, slots=slots, slurm=ask.slurm, include=include, exclude=exclude)
        _check_execution(deadline, grace, ssh_config)
        launch = _split(launcher, "--launcher") if launcher else None
        chosen = _results_path(results)
        request = autotuner.read_tune(script, list(ctx.args), num_gpus=num_gpus, num_nodes=num_nodes, seed=seed,
                                      confirm=confirm, min_gain=min_improvement / 100)
        _check_outputs(events, chosen, [*request.inputs, hostfile, ssh_config])
    except UserError as e:
        raise fail(e) from None
    allocation = _slurm_allocation(ask)
    with _given_back(allocation):
        notes: list[str] = []
        try:
            ssh = _ssh(ssh_config, accept_new_hosts, remote_dir)
            cluster = autotuner.ray_cluster(ray) if ray is not None else _cluster(
                allocation, hostfile, include, exclude, slots, None, notes.append, ssh or autotuner.Ssh())
            options = autotuner.Options(ssh=ssh, grace=grace,
                                        retries=retries, deadline=deadline,
                                        timeout=autotuner.timeout_seconds(timeout), slurm=allocation, ray=ray)
            directory = autotuner.prepare_tune(request, (), cluster, chosen, launcher=launch,
                                               timeout=options.timeout)
        except UserError as e:
            raise fail(e) from None
        for note in notes:
            typer.echo(f"autotune: note: {note}", err=True)
        if not quiet:
            template = autotuner.snapshot(directory).meta.search["template"]  # type: ignore[index]
            typer.echo(f"tuning {script}: experiments of {template['num_nodes']} node(s) x {template['num_gpus']} "
                       "slot(s) on "
                       f"{sum(len(s) for s in cluster.slots.values())} {cluster.accelerator} slot(s) of "
                       f"{len(cluster.slots)} host(s); results in {directory}")
        _execute(directory, options, quiet, events)


def _cluster(allocation: autotuner.Allocation | None, hostfile: Path | None, include: str, exclude: str,
             slots: int | None, sweep: autotuner.Sweep | None, log: Callable[[str], None],
             probe: autotuner.Ssh | None = None) -> autotuner.Cluster:
    """The allocation's nodes and GPUs, or the hostfile's (with `probe`, its hosts' MIG instances as found over
    SSH), or this machine's."""
    if allocation is not None:
        return autotuner.allocation_cluster(allocation, include, exclude)
    return autotuner.load_cluster(hostfile, include=include, exclude=exclude, slots=slots, sweep=sweep, log=log,
                                  probe=probe)


def _note(line: str) -> None:
    typer.echo(f"autotune: note: {line}", err=True)


def _slurm_allocation(ask: autotuner.SlurmAsk, recorded: dict[str, Any] | None = None
                      ) -> autotuner.Allocation | None:
    """The allocation the command runs in (None: not in Slurm); a bad ask is one line, exit 2."""
    try:
        allocation = ask.allocation(recorded, log=_note)
    except UserError as e:
        raise fail(e) from None
    except autotuner.Withdrawn as e:
        _echo_err(f"autotune: interrupted while waiting for the allocation: Slurm job {e.job} withdrawn")
        raise typer.Exit(autotuner.EXIT_INTERRUPTED) from None
    for line in allocation.warnings() if allocation is not None else ():
        _note(line)
    return allocation


def _planned_cluster(ask: autotuner.SlurmAsk, hostfile: Path | None, include: str, exclude: str, slots: int | None,
                     sweep: autotuner.Sweep, log: Callable[[str], None]) -> autotuner.Cluster:
    """What `plan` plans for: with --slurm, the allocation this runs in or one of the size asked (never asked
    for: a plan spends nothing); else as `run` would."""
    ask.check(hostfile, slots, include, exclude)
    return ask.planned(include, exclude) or _cluster(None, hostfile, include, exclude, slots, sweep, log)


@contextlib.contextmanager
def _given_back(allocation: autotuner.Allocation | None) -> Iterator[None]:
    """An allocation we asked for is given back however the command ends; one that cannot be (Slurm does not
    answer) is named with what to do, and a command that would have succeeded exits 2. SIGTERM meanwhile is
    taken as Ctrl-C (the sweep installs its own handler while it runs)."""
    guard: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if allocation is not None and allocation.owned:
        guard = autotuner.sigterm_interrupts()
    try:
        with guard:
            yield
    except typer.Exit as e:
        if not _give_back(allocation) and e.exit_code == 0:
            raise typer.Exit(autotuner.EXIT_USAGE) from None
        raise
    except BaseException:
        _give_back(allocation)
        raise
    if not _give_back(allocation):
        raise typer.Exit(autotuner.EXIT_USAGE)


def _give_back(allocation: autotuner.Allocation | None) -> bool:
    """Cancel an allocation autotune asked for (True), or say in one line that it still runs (False)."""
    if allocation is None or not allocation.owned:
        return True
    try:
        autotuner.release_allocation(allocation.job)
    except autotuner.SlurmError as e:
        _echo_err(f"autotune: error: Slurm job {allocation.job} was not given back ({e}): it still holds its "
                  f"nodes; `scancel {allocation.job}` ends it")
        return False
    _echo_err(f"autotune: note: gave Slurm job {allocation.job} back")
    return True


def _names(text: str, option: str, known: Any, one: bool = False) -> list[str]:
    """A comma-separated list of policy names, each one of `known` (with `one`: a single name)."""
    chosen = [word.strip() for word in text.split(",") if word.strip()]
    unknown = [word for word in chosen if word not in known]
    if unknown or not chosen or (one and len(chosen) > 1):
        raise UserError(f"{option} {shown(text)}: choose from {', '.join(known)}"
                        + ("" if one else " (comma-separated)"))
    return list(dict.fromkeys(chosen))


@app.command()
def plan(
    specs: list[Path] = typer.Argument(..., help="Sweep files (hjson), DeepSpeed experiment files, or directories "
                                                 "of them."),
    hostfile: Path | None = HOSTFILE,
    include: str = INCLUDE,
    exclude: str = EXCLUDE,
    slots: int | None = typer.Option(None, "--slots", min=1, help="Plan for this many slots of this machine."),
    script: str | None = typer.Option(None, "--script", help="Training script, for experiment files that name none."),
    past: Path | None = typer.Option(None, "--from", help="A sweep already run: its measured durations, and the "
                                                          "peak GPU memory of each config as its need."),
    duration: float = typer.Option(600.0, "--duration",
                                   help="Seconds an experiment takes when nothing better is known."),
    spread: float = typer.Option(0.0, "--spread", help="Coefficient of variation of durations: with it, "
                                                       "Monte Carlo gives P10/P50/P90."),
    samples: int = typer.Option(100, "--samples", min=1, max=10_000, help="Monte Carlo draws (with --spread)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the draws: the same seed, the same plan."),
    policy: str = typer.Option("backfill", "--policy", help="Queue policies to compare: backfill, fifo."),
    placement: str = typer.Option("pack", "--placement", help="Placements to compare: pack, spread, memory."),
    gpu_type: str | None = GPU_TYPE,
    gpu_mixed: bool = GPU_MIXED,
    timeout: str | None = typer.Option(None, "--timeout", parser=_timeout_value, metavar="SECONDS|none",
                                          help="Seconds an experiment may run, unless its spec says; `none`: no "
                                               f"limit \\[default: {limits.DEFAULT_TIMEOUT:g}]."),
    fmt: Brief = _format_option("table or JSON (every experiment's expected start and end)."),
    plot: Path | None = typer.Option(None, "--plot", help="Draw the expected slot timeline into this PNG file."),
    slurm: bool = typer.Option(False, "--slurm", help="Plan for this Slurm allocation, or for one of --nodes x "
                                                      "--gpus-per-node (nothing is asked of Slurm)."),
    nodes: int | None = NODES,
    gpus_per_node: int | None = GPUS_PER_NODE,
    ray: str | None = RAY,
) -> None:
    """Predict a sweep before it runs: makespan, GPU-hours, utilisation and each experiment's start, on the
    scheduler and policies `run` uses, with a simulated clock. Nothing is launched or written (but --plot)."""
    notes: list[str] = []
    try:
        _seconds(duration, "--duration", positive=True)
        queues = _names(policy, "--policy", autotuner.QUEUES)
        placements = _names(placement, "--placement", autotuner.PLACEMENTS)
        sweep = autotuner.load_sweep([p.resolve() for p in specs], script=script, gpu_type=gpu_type,
                                     gpu_mixed=gpu_mixed)
        if plot is not None:
            autotuner.check_output(plot, "--plot", [*sweep.paths(), *specs, hostfile,
                                                    past / "ledger.sqlite" if past is not None else None],
                                   replaced=True)
        ray_ask.check(ray, hostfile=hostfile, slots=slots, slurm=slurm, include=include, exclude=exclude)
        cluster = autotuner.ray_cluster(ray) if ray is not None else _planned_cluster(
            autotuner.SlurmAsk(slurm, nodes, gpus_per_node), hostfile, include, exclude, slots, sweep, notes.append)
        autotuner.check_gpu_needs(sweep, cluster)
        predicted = autotuner.plan_sweep(
            sweep.experiments, cluster.slots, past=past, default_seconds=duration, queues=queues,
            placements=placements, spread=spread, samples=samples, seed=seed,
            timeout=autotuner.timeout_seconds(timeout), types=cluster.host_types, sizes=cluster.memory,
            devices=cluster.devices)
        text = autotuner.render_plan(predicted, fmt.value, _screen())
        drawn = autotuner.write_plan_plot(predicted, plot) if plot is not None else None
    except UserError as e:
        raise fail(e) from None
    for note in notes:
        typer.echo(f"autotune: note: {note}", err=True)
    try:
        typer.echo(text, nl=False)
        if drawn is not None and fmt == Brief.table:
            typer.echo(f"slot timeline: {drawn}")
    except OSError:
        _drop_stdout()


def _ssh(config: Path | None, accept_new_hosts: bool, remote_dir: str | None) -> autotuner.Ssh | None:
    """SSH settings given on the command line, or None to keep the sweep's own."""
    if config is None and not accept_new_hosts and remote_dir is None:
        return None
    return autotuner.Ssh(str(config.resolve()) if config else None, accept_new_hosts, remote_dir)


def _execute(directory: Path, options: autotuner.Options, quiet: bool, events: Path | None = None,
             retry_failed: bool = False, new_experiments: tuple[autotuner.Experiment, ...] = (),
             fmt: Brief = Brief.table) -> None:
    """Run it, watched: a live view on a terminal, one plain line per event otherwise (not with --format
    json: stdout is the result's), nothing with --quiet."""
    options.log = lambda line: typer.echo(f"autotune: {line}", err=True)
    _interrupt_once()
    try:
        with autotuner.watching(directory, options.observers, live=not quiet and sys.stdout.isatty(),
                      plain=not quiet and fmt == Brief.table, events=events, default_timeout=options.timeout,
                      retry_failed=retry_failed, added=new_experiments):
            result = autotuner.execute(directory, options, retry_failed=retry_failed,
                                       new_experiments=new_experiments)
    except UserError as e:
        raise fail(e) from None
    except autotuner.Stopped as e:  # what ran was ended first; the ledger lets `resume` finish
        _echo_err(f"autotune: error: {e}; `autotune resume {directory}` finishes the sweep")
        raise typer.Exit(autotuner.EXIT_FAILED) from None
    except KeyboardInterrupt:
        typer.echo(f"\nkilled; `autotune resume {directory}` finishes the sweep", err=True)
        raise typer.Exit(autotuner.EXIT_INTERRUPTED) from None
    _ignore_interrupts()
    try:
        sys.stdout.write(autotuner.render_result(result, fmt.value))
        sys.stdout.flush()
    except OSError:  # stdout closed (`| head`): the outcome is in the results directory, the exit status says it
        _drop_stdout()
    raise typer.Exit(result.exit_code)


def _interrupt_once() -> None:
    """Ctrl-C outside the runner's own handling (while it sets up, or once it restored the handler it found):
    the first press interrupts, later ones are ignored. With Python's default handler every press raised a
    KeyboardInterrupt, and one landing while the first was handled, or as the interpreter shut down, ended the
    process by SIGINT. The CLI owns the process: this stays until it exits (see `_ignore_interrupts`)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def on_sigint(signum: int, frame: object) -> None:
        _ignore_interrupts()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)


def _ignore_interrupts() -> None:
    """The sweep has ended (or been interrupted): what is left is printing its outcome. SIG_IGN, not a Python
    handler, since Python resets its own handlers as it shuts down and a late press would then kill it."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _echo_err(line: str) -> None:
    with contextlib.suppress(OSError):  # stderr is closed too: the exit status is all that is left to say it
        typer.echo(line, err=True)


def _drop_stdout() -> None:
    """Point a stdout that cannot be written at /dev/null, so the text still buffered for it does not fail
    again (with a traceback) when the interpreter flushes it on the way out."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


@app.command()
@asks_slurm
def resume(
    directory: Path = typer.Argument(..., help="A sweep's results directory."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Run failed and timed-out experiments again."),
    only_new: bool = typer.Option(False, "--only-new", help="The spec changed: run only its new experiments."),
    timeout: str | None = typer.Option(None, "--timeout", parser=_timeout_value, metavar="SECONDS|none",
                                          help="Seconds an experiment may run, unless its spec says; `none`: no "
                                               "limit \\[default: as the sweep was started]."),
    deadline: float | None = typer.Option(None, "--deadline", help="Seconds the resumed sweep may run."),
    retries: int = typer.Option(1, "--retries", min=0, max=100, help="Retries of transient failures."),
    grace: float = GRACE,
    placement: str | None = typer.Option(None, "--placement", help="pack, spread or memory \\[default: as the "
                                                                      "sweep last ran]."),
    ssh_config: Path | None = SSH_CONFIG,
    accept_new_hosts: bool = ACCEPT_NEW_HOSTS,
    remote_dir: str | None = REMOTE_DIR,
    quiet: bool = QUIET,
    events: Path | None = EVENTS,
    fail_on: autotuner.FailOn = FAIL_ON,
    ask: autotuner.SlurmAsk = SLURM_OPTIONS,
    ray: str | None = RAY,
    fmt: Brief = _format_option(RESULT_HELP, Brief.table),
) -> None:
    """Finish an interrupted sweep: nothing that succeeded runs again. A sweep started in Slurm runs in this
    allocation, in the one it ran in while that still runs, or in a new one (--nodes, --gpus-per-node)."""
    try:  # everything that can be checked before a cluster is asked for anything
        ask.check()
        ray_ask.check(ray, slurm=ask.slurm)
        _check_execution(deadline, grace, ssh_config)
        chosen = _names(placement, "--placement", autotuner.PLACEMENTS, one=True)[0] if placement is not None \
            else None
        plan = autotuner.resume_plan(directory, only_new=only_new)
        _check_outputs(events, None, [*plan.inputs, ssh_config])
    except UserError as e:
        raise fail(e) from None
    for note in plan.notes:
        typer.echo(f"autotune: note: {note}", err=True)
    allocation = _slurm_allocation(ask, recorded=plan.slurm)
    with _given_back(allocation):
        options = autotuner.Options(ssh=_ssh(ssh_config, accept_new_hosts, remote_dir), grace=grace,
                                    retries=retries, deadline=deadline, placement=chosen,
                                    timeout=plan.timeout if timeout is None else autotuner.timeout_seconds(timeout),
                                    fail_on=fail_on, slurm=allocation, ray=ray)
        _execute(directory, options, quiet, events, retry_failed=retry_failed,
                 new_experiments=plan.new_experiments, fmt=fmt)


@app.command()
def cancel(
    directory: Path = typer.Argument(..., help="A sweep's results directory."),
    names: list[str] = typer.Argument(None, help="Experiments to cancel; none = the whole sweep."),
    fmt: Brief = _format_option("table: what was done, in a line; json: the same as one JSON object."),
) -> None:
    """Cancel experiments of a sweep, or all of it, from any terminal."""
    try:
        done = autotuner.cancel(directory, names or [])
    except UserError as e:
        raise fail(e) from None
    typer.echo(json.dumps(done.to_json()) if fmt == Brief.json else str(done))


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Reading a large sweep builds a few hundred thousand objects and no reference cycle: Python's cyclic
    collector, run again and again over all of them as they pile up, took half of a 100,000-experiment report
    (a fifth of a 10,000 one). Paused while a read command builds its output; reference counting still frees
    everything, and the process ends soon after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@app.command()
def status(
    directory: Path = typer.Argument(..., help="A sweep's results directory."),
    fmt: Brief = _format_option("table: lines for people; json: for programs."),
    as_json: bool = typer.Option(False, "--json", help="The same as --format json."),
) -> None:
    """Where a sweep stands: counts, what runs where, the best so far. Safe while it runs."""
    try:
        with _collector_paused():
            sys.stdout.write(autotuner.render_status(directory, "json" if as_json else fmt.value))
    except UserError as e:
        raise fail(e) from None


@app.command()
def report(
    directory: Path = typer.Argument(..., help="A sweep's results directory."),
    fmt: Format = _format_option("table (fitted to the terminal), json, csv or md (Markdown): one row per "
                                 "experiment with every swept parameter and metric."),
    plot: bool = typer.Option(False, "--plot", help="Also draw plot_metric.png and plot_timeline.png into DIR "
                                                    "(needs matplotlib: pip install 'ds-autotune\\[plots]')."),
    x: str | None = typer.Option(None, "--x", help="Dotted ds_config key on the metric plot's x axis "
                                                      "\\[default: train_micro_batch_size_per_gpu]."),
    lines: str | None = typer.Option(None, "--lines", help="Dotted ds_config key: one line per value "
                                                              "\\[default: zero_optimization.stage]."),
    html: str | None = typer.Option(None, "--html", metavar="[FILE]", help="Also write one self-contained "
                                       "HTML page: table, best config, command, plots \\[FILE: DIR/report.html]."),
) -> None:
    """Every experiment of a sweep ranked by the metric, the best marked, failures with their reason."""
    try:
        if (x or lines) and not (plot or html is not None):
            raise UserError("--x and --lines shape the plots: add --plot or --html")
        if html:  # before anything is printed: a refusal is the one line
            autotuner.check_output(Path(html), "--html", [directory / "ledger.sqlite"], own_files=False,
                                   replaced=True)
        with _collector_paused():
            sys.stdout.write(autotuner.render_report(directory, fmt.value, _screen()))
        if plot:
            paths = autotuner.write_plots(autotuner.snapshot(directory), x, lines)
            typer.echo("plots: " + ", ".join(str(p) for p in paths), err=True)
        if html is not None:
            page, note = autotuner.write_html(directory, Path(html) if html else None, x=x, lines=lines)
            typer.echo(f"html: {page}" + (f" (without plots: {note})" if note else ""), err=True)
    except UserError as e:
        raise fail(e) from None


@app.command()
def compare(
    dir_a: Path = typer.Argument(..., help="A sweep's results directory (A)."),
    dir_b: Path = typer.Argument(..., help="Another sweep's results directory (B)."),
    fmt: Format = _format_option("table (fitted to the terminal), json, csv or md (Markdown)."),
) -> None:
    """The same experiments (by name) of two sweeps side by side, with the ratio of the metric B / A."""
    try:
        with _collector_paused():
            sys.stdout.write(autotuner.render_compare(dir_a, dir_b, fmt.value, _screen()))
    except UserError as e:
        raise fail(e) from None


@app.command()
def dashboard(
    directories: list[Path] = typer.Argument(None, help="Results directories: a sweep's, or a folder of sweeps "
                                                         "(new ones appear as they start) \\[default: results]."),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="Port to listen on (0: any free one)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on. Anything but loopback lets other "
                             "machines reach the page: the token still guards it, but the traffic is plain HTTP."),
    allow_cancel: bool = typer.Option(False, "--allow-cancel", help="Let the page cancel experiments or a whole "
                                      "sweep (as `autotune cancel` does)."),
) -> None:
    """A live page of sweeps in the browser, read only from their ledgers: counts, ETA, best config, nodes,
    every experiment, each run's logs, plots. Prints the URL to open (with its secret token); Ctrl-C ends it.
    Needs the dashboard extra: pip install 'ds-autotune\\[dashboard]'."""
    try:
        autotuner.serve_dashboard(directories or [Path("results")], host=host, port=port,
                                  allow_cancel=allow_cancel, announce=lambda line: print(line, flush=True))
    except UserError as e:
        raise fail(e) from None


def optional_html_value(argv: list[str]) -> list[str]:
    """`--html` takes an optional FILE: a bare `--html` (not followed by a name ending in .html or .htm)
    becomes `--html=`, which means DIR/report.html."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--":
            break
        if arg == "--html" and not (i + 1 < len(out) and out[i + 1].lower().endswith((".html", ".htm"))):
            out[i] = "--html="
    return out


@app.command()
def hosts(
    hostfile: Path = typer.Option(Path("hostfile"), "--hostfile", "-H", help="DeepSpeed hostfile."),
    ssh_config: Path | None = SSH_CONFIG,
    accept_new_hosts: bool = ACCEPT_NEW_HOSTS,
    fmt: Format = _format_option("table (fitted to the terminal), json, csv or md (Markdown)."),
    as_json: bool = typer.Option(False, "--json", help="The same as --format json."),
    slurm: bool = typer.Option(False, "--slurm", help="The nodes of this Slurm allocation instead of a hostfile."),
    ray: str | None = typer.Option(None, "--ray", metavar="[ADDRESS]", help="The nodes of this Ray cluster (ADDRESS, "
                                   "else RAY_ADDRESS, else auto) instead of a hostfile."),
) -> None:
    """Check every host of a hostfile before spending GPU hours: reachable, GPUs, versions, load. With --slurm:
    the nodes of the allocation this runs in, their state in Slurm and what each can run."""
    if slurm:
        _slurm_hosts("json" if as_json else fmt.value)
    if ray is not None:
        _ray_hosts(ray, "json" if as_json else fmt.value)
    try:
        _check_ssh_config(ssh_config)
        listed, reports = autotuner.check_hosts(hostfile, str(ssh_config) if ssh_config else None,
                                                accept_new_hosts)
    except UserError as e:
        raise fail(e) from None
    sys.stdout.write(autotuner.render_hosts(f"hosts of {hostfile}", listed, reports,
                                            "json" if as_json else fmt.value, _screen()))
    raise typer.Exit(0 if all(r.reachable for r in reports) else 1)


def _ray_hosts(ray: str, fmt: str) -> None:
    """`hosts --ray`: the cluster's live nodes; exit 0 when one has a GPU, 1 when none has, 2 when the cluster
    cannot be reached."""
    try:
        address, nodes = autotuner.ray_nodes(ray)
    except UserError as e:
        raise fail(e) from None
    sys.stdout.write(autotuner.render_ray_nodes(address, nodes, fmt))
    raise typer.Exit(0 if any(n.gpus for n in nodes) else 1)


def _slurm_hosts(fmt: str) -> None:
    """`hosts --slurm`: exit 0 when every node can run, 1 when Slurm has taken one out."""
    try:
        allocation, nodes = autotuner.this_allocation()
        text = autotuner.render_allocation(allocation, nodes, fmt, _screen())
    except UserError as e:
        raise fail(e) from None
    sys.stdout.write(text)
    raise typer.Exit(1 if any(n.lost for n in nodes.values()) else 0)


# The base of every usage error (a bad option value, an unknown option or command, a missing argument). typer
# re-exports click's BadParameter (newer typer versions vendor click), so its parent is the right class either way.
_USAGE_ERROR: Any = typer.BadParameter.__mro__[1]


def usage_error_line(error: Any) -> str:
    """A click usage error as the one line every other mistake gets, instead of a usage box."""
    message = " ".join(error.format_message().split())
    ctx = getattr(error, "ctx", None)
    hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    return f"autotune: error: {shown(message, 300, quoted=False)}{hint}"


def main(argv: list[str] | None = None) -> None:
    """The `autotune` console script: exit 0 on success and --help, 2 for bad input or usage, or what the
    command says (1: the sweep had failures, 130: interrupted)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--html" in args:
        args = optional_html_value(args)
    if "--ray" in args:
        args = ray_ask.optional_ray_value(args)
    _listen_for_early_ctrl_c()
    try:
        code = app(args=args, prog_name="autotune", standalone_mode=False)
        if code == autotuner.EXIT_INTERRUPTED and _EARLY_PRESS.is_set():  # typer's silent exit 130 for it
            _interrupted()
    except KeyboardInterrupt:  # typer still building the command
        _interrupted()
    except _USAGE_ERROR as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `autotune`: the help, as a usage error
            if e.format_message().strip():
                typer.echo(e.format_message(), err=True)
        else:
            typer.echo(usage_error_line(e), err=True)
        sys.exit(2)
    except typer.Abort as e:
        if isinstance(e.__cause__, KeyboardInterrupt):  # click's word for a Ctrl-C while it parsed
            _interrupted()
        typer.echo("autotune: aborted", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


_EARLY_PRESS = threading.Event()  # a Ctrl-C came before a command installed its own handling


def _listen_for_early_ctrl_c() -> None:
    """From the start of `main` until a command installs its own handling (`_interrupt_once`): the first Ctrl-C
    is noted and interrupts, later ones are ignored; `main` then says so in one line and exits 130."""
    if threading.current_thread() is not threading.main_thread():
        return

    def on_sigint(signum: int, frame: object) -> None:
        _EARLY_PRESS.set()
        _ignore_interrupts()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)


def _interrupted() -> NoReturn:
    """A Ctrl-C while the command line was still being read: nothing started, one line, exit 130."""
    _ignore_interrupts()
    _echo_err("autotune: interrupted")
    sys.exit(autotuner.EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
