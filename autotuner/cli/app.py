"""The typer app every command registers on, its global options, and what all commands print the same way:
the --format choices, a refusal (one line, exit 2), notes on stderr.

Help is click's plain text (`rich_markup_mode=None`): typer's rich help imported rich's Markdown, pygments and
tracebacks on every `autotune --help`, most of its start-up (BENCHMARKS.md, issue 24).
"""
from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
from collections.abc import Iterator
from enum import Enum, StrEnum
from typing import Any  # typer.Option returns Any by its API

import typer

import autotuner
from autotuner import UserError
from autotuner.errors import one_line

from .logs import configure_logging

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None,
                  help="Run a space of DeepSpeed configurations across GPU slots and keep the fastest.")


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


def format_option(help_text: str, default: Enum = Format.table) -> Any:
    """--format / -f: typer lists the enum's choices in --help and refuses others as a usage error."""
    return typer.Option(default, "--format", "-f", help=help_text, case_sensitive=False)


def screen() -> autotuner.Output:
    """How tables fit stdout: a terminal's width and colour (none with NO_COLOR), a pipe's plain text."""
    return autotuner.Output.of(sys.stdout)


def fail(error: UserError | str) -> typer.Exit:
    """Bad input: its one line on stderr; raise what this returns to exit 2."""
    typer.echo(one_line(f"autotune: error: {error}"), err=True)
    return typer.Exit(2)


def echo_err(line: str) -> None:
    """A line on stderr that may find it closed: the exit status is then all that is left to say it."""
    with contextlib.suppress(OSError):
        typer.echo(line, err=True)


def note(line: str) -> None:
    typer.echo(f"autotune: note: {line}", err=True)


def drop_stdout() -> None:
    """Point a stdout that cannot be written at /dev/null, so the text still buffered for it does not fail
    again (with a traceback) when the interpreter flushes it on the way out."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


@contextlib.contextmanager
def collecting() -> Iterator[None]:
    """The cyclic collector on while plots and the HTML page are drawn, though a read command otherwise runs
    without it (`autotuner.__main__`): matplotlib's figures leave cycles (50 MB a plot of a 10,000-experiment
    sweep), collected before it is switched off again."""
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        if not was:
            gc.collect()
            gc.disable()


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"autotune {autotuner.__version__}")
        raise typer.Exit(0)


@app.callback()
def _options(verbose: bool = typer.Option(False, "--verbose", "-v", help="Also say what is being done."),
             debug: bool = typer.Option(False, "--debug", help="Everything the library logs, tracebacks included."),
             version: bool = typer.Option(False, "--version", is_eager=True, callback=_show_version,
                                          help="Print the version and exit.")) -> None:
    configure_logging(logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING)
