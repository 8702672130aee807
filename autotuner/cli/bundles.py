"""Option bundles: options that several commands share, declared once and handed to each command as one value.

`asks_slurm` gives a command the six Slurm options (`--slurm`, `--nodes`, `--gpus-per-node`, `--partition`,
`--time`, `--account`) in place of its `ask: autotuner.SlurmAsk = SLURM_OPTIONS` parameter: typer sees the options (the
command's signature is rewritten), the command gets the SlurmAsk they make. Making it cannot fail: what is
checked of it (`SlurmAsk.check`) the command checks, where a bad value is one line and exit 2.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import typer

import autotuner

SLURM = typer.Option(False, "--slurm", help="Run inside a Slurm allocation: this job's (SLURM_JOB_ID), or one "
                                               "asked for with --nodes and --gpus-per-node and given back at the end.")
NODES = typer.Option(None, "--nodes", min=1, help="With --slurm outside an allocation: nodes to ask for.")
GPUS_PER_NODE = typer.Option(None, "--gpus-per-node", min=1,
                             help="With --slurm outside an allocation: GPUs per node to ask for.")
PARTITION = typer.Option(None, "--partition", help="With --slurm --nodes: the Slurm partition.")
TIME_LIMIT = typer.Option(None, "--time", help="With --slurm --nodes: the allocation's time limit (Slurm's syntax).")
ACCOUNT = typer.Option(None, "--account", help="With --slurm --nodes: the Slurm account.")

# The default of a command's `ask` parameter: where `asks_slurm` puts the Slurm options.
SLURM_OPTIONS: Any = object()

# name, type, option: in SlurmAsk's field order
_SLURM_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("slurm", bool, SLURM), ("nodes", int | None, NODES), ("gpus_per_node", int | None, GPUS_PER_NODE),
    ("partition", str | None, PARTITION), ("time_limit", str | None, TIME_LIMIT), ("account", str | None, ACCOUNT))

F = TypeVar("F", bound=Callable[..., None])


def asks_slurm(command: F) -> F:
    """`command(..., ask: autotuner.SlurmAsk, ...)` as typer sees it: the Slurm options where `ask` stood."""
    signature = inspect.signature(command)
    hints = {name: eval(hint, command.__globals__) if isinstance(hint, str) else hint
             for name, hint in command.__annotations__.items() if name != "ask"}  # (SlurmAsk: imported when called)
    names = [name for name, _, _ in _SLURM_OPTIONS]
    options = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind)
               for name, kind, option in _SLURM_OPTIONS]
    params = []
    for param in signature.parameters.values():
        if param.name == "ask":
            params += options
        else:
            params.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints[param.name]))

    @functools.wraps(command)
    def wrapper(**given: Any) -> None:
        values = [given.pop(name) for name in names]
        command(**given, ask=autotuner.SlurmAsk(*values))

    wrapper.__signature__ = signature.replace(parameters=params, return_annotation=None)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {**hints, **{name: kind for name, kind, _ in _SLURM_OPTIONS}}
    return wrapper  # type: ignore[return-value]
