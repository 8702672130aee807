"""Option bundles: options that several commands share, declared once and handed to each command as one value
that checks itself.

A command takes a bundle as one parameter whose default is the `Bundle` (`times: Timing = timing(...)`); `bundled`
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
from ..backends import kinds
from ..backends.flags import Given
from .app import Brief, format_option
from .checks import seconds, timeout_value

# --- the options, each declared once (the backends' own: `backend_options`) -------------------------------
DIRECTORY = typer.Argument(..., help="A sweep's results directory.")
SPECS = typer.Argument(..., help="Sweep files (hjson), DeepSpeed experiment files, or directories of them.")
SCRIPT = typer.Option(None, "--script", help="Training script, for experiment files that name none.")
RESULTS = typer.Option(None, "--results", "-o", help="Results directory [default: results/NAME-TIME].")
LAUNCHER = typer.Option(None, "--launcher", help="Command that starts DeepSpeed's launcher [default: deepspeed].")
GPU_TYPE = typer.Option(None, "--gpu-type", help="Run every experiment on GPUs of this type (a hostfile's gpu=, or "
                                                 "this machine's, e.g. A100-SXM4-80GB); wins over gpu_type in files.")
GPU_MIXED = typer.Option(False, "--gpu-mixed", help="Let one experiment span GPU types (by default each runs on "
                                                    "one type).")
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


# The bundles are typed Any, as typer's own options are: a command's parameter names the value it gets (`watch:
# Watch = WATCH`), not the Bundle that stands as its default.
WATCH: Any = Bundle((("quiet", bool, QUIET), ("events", Path | None, EVENTS)), Watch)
WATCH_AND_VERDICT: Any = Bundle((*WATCH.options, ("fail_on", autotuner.FailOn, FAIL_ON),
                                 ("fmt", Brief, RESULT_FORMAT)), Watch)


def timing(whole: str, default: str = f"{limits.DEFAULT_TIMEOUT:g}", spec: bool = True) -> Any:
    """--timeout, --deadline (`whole`: what it bounds), --retries, --grace."""
    return Bundle((("timeout", str | None, timeout_option(default, spec)),
                   ("deadline", float | None, typer.Option(None, "--deadline", help=f"Seconds {whole} may run.")),
                   ("retries", int, RETRIES), ("grace", float, GRACE)), Timing)


def backend_options(command: str) -> Any:
    """The flags the backends declare for `command` (kinds.KINDS: none named here), as one value: the options
    given, by name, each routed to the backend that declared it (`autotuner.check_options`, `hold`, ...).
    A value left at its declared default is not given."""
    flags = kinds.flags_of(command)
    defaults = {flag.name: flag.default for flag in flags}

    def given(**values: object) -> Given:
        return {name: value for name, value in values.items() if value != defaults[name] and value is not None}

    return Bundle(tuple((flag.name, flag.type, typer.Option(flag.default, *flag.decls, help=flag.help,
                                                            metavar=flag.metavar, min=flag.min))
                        for flag in flags), given)


def sweep_options(timing: Timing, watch: Watch, given: Given, timeout: float | None, placement: str | None = None,
                  stop_outclassed: bool = False) -> autotuner.Options:
    """The Options of `run`, `tune` and `resume`, from their bundles (`given`: the backends' options, with what
    the command holds)."""
    return autotuner.Options(grace=timing.grace, retries=timing.retries, deadline=timing.deadline, timeout=timeout,
                             placement=placement, fail_on=watch.fail_on, backend=given,
                             stop_outclassed=stop_outclassed)


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
