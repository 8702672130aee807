"""What a command runs in, as the command line shows it: held by the backends for the command
(`autotuner.hold`: a Slurm allocation asked for, kept, given back however the command ends), its notes and
warnings printed, and what could not be given back turned into exit status 2."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import typer

import autotuner
from autotuner import UserError

from ..jsonvalues import JSONObject
from .app import echo_err, fail


def _note(line: str) -> None:
    echo_err(f"autotune: note: {line}")


@contextlib.contextmanager
def held(given: Mapping[str, object], recorded: JSONObject | None = None) -> Iterator[Mapping[str, object]]:
    """The backends' options `given`, with what the command runs in added; bad options are one line, exit 2; a
    Ctrl-C while it is waited for withdraws it (exit 130). What cannot be given back at the end is named with
    what to do, and a command that would have succeeded exits 2."""
    unreturned: list[str] = []

    def not_given_back(line: str) -> None:
        echo_err(f"autotune: error: {line}")
        unreturned.append(line)

    try:
        with autotuner.hold(given, recorded, log=_note, not_given_back=not_given_back) as running:
            yield running
    except autotuner.Withdrawn as e:
        echo_err(f"autotune: interrupted while waiting for the allocation: {e.what} withdrawn")
        raise typer.Exit(autotuner.EXIT_INTERRUPTED) from None
    except typer.Exit as e:
        if unreturned and e.exit_code == 0:
            raise typer.Exit(autotuner.EXIT_USAGE) from None
        raise
    except UserError as e:
        raise fail(e) from None
    if unreturned:
        raise typer.Exit(autotuner.EXIT_USAGE)
