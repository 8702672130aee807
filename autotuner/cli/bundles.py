"""Option bundles: options that several commands share, declared once and handed to each command as one value
that checks itself.

A command takes a bundle as one parameter whose default is the `Bundle` (`ssh: SshOptions = SSH`); `bundled`
rewrites the command's signature so that typer sees the bundle's options where that parameter stood (so --help
lists each of them), and calls the command with the value they make. Making it cannot fail: what is checked of
it the command checks (`check()`), inside its own `try`, where a bad value is one line and exit 2.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar  # typer.Option returns Any by its API; a bundle stands where one would

import typer

import autotuner

from .. import limits
from .app import Brief, format_option
from .checks import check_ssh_config, seconds, timeout_value

# --- the options, each declared once -------------------------------------------------------------------------
HOSTFILE = typer.Option(None, "--hostfile", "-H", help="DeepSpeed hostfile; none = this machine.")
INCLUDE = typer.Option("", "--include", "-i", help="DeepSpeed syntax, e.g. worker-0:0,1@worker-1.")
EXCLUDE = typer.Option("", "--exclude", "-e", help="DeepSpeed syntax, e.g. worker-1:0.")
RAY = typer.Option(None, "--ray", metavar="[ADDRESS]",
                   help="Run on a Ray cluster (KubeRay, `ray up`), as a client: the one at ADDRESS, else RAY_ADDRESS, "
                        "else auto (a cluster this machine is a node of). Never starts one.")
DIRECTORY = typer.Argument(..., help="A sweep's results directory.")
SPECS = typer.Argument(..., help="Sweep files (hjson), DeepSpeed experiment files, or directories of them.")
SCRIPT = typer.Option(None, "--script", help="Training script, for experiment files that name none.")
RESULTS = typer.Option(None, "--results", "-o", help="Results directory [default: results/NAME-TIME].")
LAUNCHER = typer.Option(None, "--launcher", help="Command that starts DeepSpeed's launcher [default: deepspeed].")
GPU_TYPE = typer.Option(None, "--gpu-type", help="Run every experiment on GPUs of this type (a hostfile's gpu=, or "
                                                 "this machine's, e.g. A100-SXM4-80GB); wins over gpu_type in files.")
GPU_MIXED = typer.Option(False, "--gpu-mixed", help="Let one experiment span GPU types (by default each runs on "
                                                    "one type).")
SSH_CONFIG = typer.Option(None, "--ssh-config", help="ssh config file to use instead of ~/.ssh/config.")
ACCEPT_NEW_HOSTS = typer.Option(False, "--accept-new-hosts",
                                help="Trust (and record) host keys not yet in known_hosts.")
REMOTE_DIR = typer.Option(None, "--remote-dir",
                          help="Where runs write on hosts without our filesystem; copied back over SFTP.")
RETRIES = typer.Option(1, "--retries", min=0, max=100, help="Retries of transient failures (launch, lost host).")
GRACE = typer.Option(10.0, "--grace", help="Seconds between SIGTERM and SIGKILL when ending a run.")
QUIET = typer.Option(False, "--quiet", "-q", help="Print only the outcome.")
EVENTS = typer.Option(None, "--events", help="Append one JSON line per event (started, finished: name, attempt, "
                                             "slots, state, reason, metric, timestamp; stopping: why the sweep "
                                             "stops dispatching; progress: a running attempt's steps so far) to "
                                             "this file, for scripts.")
STOP_OUTCLASSED = typer.Option(False, "--stop-outclassed",
                               help="Stop a running experiment once its steps show it cannot beat one that "
                                    "succeeded (recorded stopped, outclassed; a tune always does).")
FAIL_ON = typer.Option(autotuner.FailOn.ANY, "--fail-on",
                       help="When to exit 1: `any` experiment did not succeed, or only `no-result` (none "
                            "succeeded, so no best config: an OOM alone then exits 0).")
RESULT_FORMAT = format_option("table: the outcome in lines; json: only one JSON object on stdout when the sweep "
                              "ends (counts, best, its files, exit code), no event lines there (--events writes "
                              "them).", Brief.table)
SLURM = typer.Option(False, "--slurm", help="Run inside a Slurm allocation: this job's (SLURM_JOB_ID), or one "
                                               "asked for with --nodes and --gpus-per-node and given back at the end.")
NODES = typer.Option(None, "--nodes", min=1, help="With --slurm outside an allocation: nodes to ask for.")
GPUS_PER_NODE = typer.Option(None, "--gpus-per-node", min=1,
                             help="With --slurm outside an allocation: GPUs per node to ask for.")
PARTITION = typer.Option(None, "--partition", help="With --slurm --nodes: the Slurm partition.")
TIME_LIMIT = typer.Option(None, "--time", help="With --slurm --nodes: the allocation's time limit (Slurm's syntax).")
ACCOUNT = typer.Option(None, "--account", help="With --slurm --nodes: the Slurm account.")


def timeout_option(default: str = f"{limits.DEFAULT_TIMEOUT:g}", spec: bool = True) -> Any:
    """--timeout SECONDS|none; `default` is what --help says applies without it."""
    return typer.Option(None, "--timeout", parser=timeout_value, metavar="SECONDS|none",
                        help="Seconds an experiment may run" + (", unless its spec says" if spec else "")
                             + f"; `none`: no limit [default: {default}].")


# --- bundles -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bundle:
    """Options a command takes as one value: `options` are (parameter name, type, typer option), `make` builds
    the value from them (keyword arguments named as the parameters)."""

    options: tuple[tuple[str, object, object], ...]  # (name, its annotation, its typer.Option)
    make: Callable[..., object]


@dataclass(frozen=True)
class SshOptions:
    """How to reach SSH hosts, as given on the command line (`--ssh-config`, `--accept-new-hosts`,
    `--remote-dir`)."""

    ssh_config: Path | None = None
    accept_new_hosts: bool = False
    remote_dir: str | None = None

    def check(self) -> None:
        check_ssh_config(self.ssh_config)

    def settings(self) -> autotuner.Ssh | None:
        """The SSH settings given, or None to keep the sweep's own."""
        if self.ssh_config is None and not self.accept_new_hosts and self.remote_dir is None:
            return None
        return autotuner.Ssh(str(self.ssh_config.resolve()) if self.ssh_config else None, self.accept_new_hosts,
                             self.remote_dir)


@dataclass(frozen=True)
class Timing:
    """How long experiments and the sweep may run, and how runs are retried and ended."""

    timeout: float | str | None = None  # seconds, "none", or None: not given
    deadline: float | None = None
    retries: int = 1
    grace: float = 10.0

    def check(self) -> None:
        seconds(self.deadline, "--deadline", positive=True)
        seconds(self.grace, "--grace")

    def timeout_seconds(self) -> float | None:
        """--timeout in seconds (None: no limit; not given: the default)."""
        return autotuner.timeout_seconds(self.timeout)


@dataclass(frozen=True)
class Watch:
    """What the command prints while the sweep runs and at its end, and when it exits 1."""

    quiet: bool = False
    events: Path | None = None
    fail_on: autotuner.FailOn | str = "any"
    fmt: Brief = Brief.table


@dataclass(frozen=True)
class Where:
    """The nodes a new sweep runs on: a hostfile's (filtered), this machine's, CPU slots, or a Ray cluster's."""

    hostfile: Path | None = None
    include: str = ""
    exclude: str = ""
    slots: int | None = None
    ray: str | None = None

    def check_slurm(self, ask: autotuner.SlurmAsk) -> None:
        """--slurm and what it replaces (a hostfile, --slots, --include, --exclude)."""
        ask.check(self.hostfile, self.slots, self.include, self.exclude)

    def check_ray(self, ask: autotuner.SlurmAsk) -> None:
        """--ray and what it replaces (a hostfile, --slots, --slurm, --include, --exclude)."""
        autotuner.check_ray(self.ray, hostfile=self.hostfile, slots=self.slots, slurm=ask.slurm,
                            include=self.include, exclude=self.exclude)

    def cluster(self, allocation: autotuner.Allocation | None, sweep: autotuner.Sweep | None,
                log: Callable[[str], None], probe: autotuner.Ssh | None = None) -> autotuner.Cluster:
        """The Ray cluster's nodes, the allocation's nodes and GPUs, or the hostfile's (with `probe`, its hosts'
        MIG instances as found over SSH), or this machine's."""
        return autotuner.cluster_for(self.hostfile, include=self.include, exclude=self.exclude, slots=self.slots,
                                     ray=self.ray, allocation=allocation, sweep=sweep, log=log, probe=probe)

    def planned(self, ask: autotuner.SlurmAsk, sweep: autotuner.Sweep,
                log: Callable[[str], None]) -> autotuner.Cluster:
        """What `plan` plans for: with --slurm, the allocation this runs in or one of the size asked (never asked
        for: a plan spends nothing); else as `run` would."""
        self.check_ray(ask)
        if self.ray is None:
            self.check_slurm(ask)
            planned = ask.planned(self.include, self.exclude)
            if planned is not None:
                return planned
        return self.cluster(None, sweep, log)


def _slurm_ask(slurm: bool, nodes: int | None = None, gpus_per_node: int | None = None,
               partition: str | None = None, time_limit: str | None = None,
               account: str | None = None) -> autotuner.SlurmAsk:
    return autotuner.SlurmAsk(slurm, nodes, gpus_per_node, partition, time_limit, account)


# The bundles are typed Any, as typer's own options are: a command's parameter names the value it gets (`ssh:
# SshOptions = SSH`), not the Bundle that stands as its default.
SLURM_OPTIONS: Any = Bundle((("slurm", bool, SLURM), ("nodes", int | None, NODES),
                             ("gpus_per_node", int | None, GPUS_PER_NODE), ("partition", str | None, PARTITION),
                             ("time_limit", str | None, TIME_LIMIT), ("account", str | None, ACCOUNT)), _slurm_ask)
SSH: Any = Bundle((("ssh_config", Path | None, SSH_CONFIG), ("accept_new_hosts", bool, ACCEPT_NEW_HOSTS),
                   ("remote_dir", str | None, REMOTE_DIR)), SshOptions)
WATCH: Any = Bundle((("quiet", bool, QUIET), ("events", Path | None, EVENTS)), Watch)
WATCH_AND_VERDICT: Any = Bundle((*WATCH.options, ("fail_on", autotuner.FailOn, FAIL_ON),
                                 ("fmt", Brief, RESULT_FORMAT)), Watch)


def timing(whole: str, default: str = f"{limits.DEFAULT_TIMEOUT:g}", spec: bool = True) -> Any:
    """--timeout, --deadline (`whole`: what it bounds), --retries, --grace."""
    return Bundle((("timeout", str | None, timeout_option(default, spec)),
                   ("deadline", float | None, typer.Option(None, "--deadline", help=f"Seconds {whole} may run.")),
                   ("retries", int, RETRIES), ("grace", float, GRACE)), Timing)


def where(slots_help: str) -> Any:
    """--hostfile, --include, --exclude, --slots (`slots_help`), --ray."""
    return Bundle((("hostfile", Path | None, HOSTFILE), ("include", str, INCLUDE), ("exclude", str, EXCLUDE),
                   ("slots", int | None, typer.Option(None, "--slots", min=1, help=slots_help)),
                   ("ray", str | None, RAY)), Where)


def sweep_options(timing: Timing, ssh: SshOptions, watch: Watch, allocation: autotuner.Allocation | None,
                  ray: str | None, timeout: float | None, placement: str | None = None,
                  stop_outclassed: bool = False) -> autotuner.Options:
    """The Options of `run`, `tune` and `resume`, from their bundles."""
    return autotuner.Options(ssh=ssh.settings(), grace=timing.grace, retries=timing.retries,
                             deadline=timing.deadline, timeout=timeout, placement=placement,
                             fail_on=watch.fail_on, slurm=allocation, ray=ray, stop_outclassed=stop_outclassed)


F = TypeVar("F", bound=Callable[..., None])


def bundled(command: F) -> F:
    """`command(..., name: T = BUNDLE, ...)` as typer sees it: each bundle's options where its parameter stood;
    the command is called with the values the bundles make."""
    signature = inspect.signature(command)
    bundles = {name: p.default for name, p in signature.parameters.items() if isinstance(p.default, Bundle)}
    # The other parameters' annotations, evaluated now for typer (a bundle's own type may be lazily imported).
    hints = {name: eval(hint, command.__globals__) if isinstance(hint, str) else hint
             for name, hint in command.__annotations__.items() if name not in bundles}
    params: list[inspect.Parameter] = []
    for param in signature.parameters.values():
        if param.name in bundles:
            params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind)
                       for name, kind, option in bundles[param.name].options]
        else:
            params.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints[param.name]))
    names = [p.name for p in params]
    if len(set(names)) != len(names):
        raise TypeError(f"{command.__name__}: two bundles or parameters name the same option")

    @functools.wraps(command)
    def wrapper(**given: object) -> None:
        for name, bundle in bundles.items():
            given[name] = bundle.make(**{option: given.pop(option) for option, _, _ in bundle.options})
        command(**given)

    wrapper.__signature__ = signature.replace(parameters=params, return_annotation=None)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {**hints, **{name: kind for b in bundles.values() for name, kind, _ in b.options}}
    return wrapper  # type: ignore[return-value]
