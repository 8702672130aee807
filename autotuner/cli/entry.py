"""`main`, the `autotune` console script: argv read, the command run, its exit status; usage errors as one
line, and a Ctrl-C before the command's own handling as one line and exit 130."""
from __future__ import annotations

import sys
from typing import Any

import typer

import autotuner

from ..backends import kinds
from ..backends.flags import bare_values
from ..errors import one_line, shown
from . import stdout
from .app import app
from .interrupts import EARLY_PRESS, interrupt_once, interrupted

# The base of every usage error (a bad option value, an unknown option or command, a missing argument). typer
# re-exports click's BadParameter (newer typer versions vendor click), so its parent is the right class either way.
_USAGE_ERROR: Any = typer.BadParameter.__mro__[1]


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


def undecodable_argument(argv: list[str]) -> str | None:
    """The error line for the first argument that is not UTF-8 text (None: all are). Python hands bytes it
    cannot decode on as lone surrogates, which no ledger, config or log can hold: refused here, before a command
    writes half a sweep and fails on them."""
    for number, arg in enumerate(argv, 1):
        try:
            arg.encode()
        except UnicodeEncodeError:
            text = one_line(arg.encode(errors="surrogateescape").decode(errors="backslashreplace"), 200)
            return f"autotune: error: argument {number} ({text}) is not UTF-8 text"
    return None


def usage_error_line(error: Any) -> str:  # a _USAGE_ERROR, of whichever click typer carries
    """A click usage error as the one line every other mistake gets, instead of a usage box."""
    message = " ".join(error.format_message().split())
    ctx = getattr(error, "ctx", None)
    hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    return f"autotune: error: {shown(message, 300, quoted=False)}{hint}"


def main(argv: list[str] | None = None) -> None:
    """The `autotune` console script: exit 0 on success and --help, 2 for bad input or usage, or what the
    command says (1: the sweep had failures, 130: interrupted)."""
    interrupt_once(early=True)
    try:
        args = list(sys.argv[1:] if argv is None else argv)
        if (undecodable := undecodable_argument(args)) is not None:
            typer.echo(undecodable, err=True)
            sys.exit(2)
        if "--html" in args:
            args = optional_html_value(args)
        args = bare_values(args, kinds.every_flag())  # a flag's optional value (`--ray [ADDRESS]`)
        stdout.install()
        code = app(args=args, prog_name="autotune", standalone_mode=False)
        if code == autotuner.EXIT_INTERRUPTED and EARLY_PRESS.is_set():  # typer's silent exit 130 for it
            interrupted()
        stdout.flush()
        code = stdout.exit_code(args, code if isinstance(code, int) else 0)
    except KeyboardInterrupt:  # typer still building the command
        interrupted()
    except _USAGE_ERROR as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `autotune`: the help, as a usage error
            if e.format_message().strip():
                typer.echo(e.format_message(), err=True)
        else:
            typer.echo(usage_error_line(e), err=True)
        sys.exit(2)
    except typer.Abort as e:
        if isinstance(e.__cause__, KeyboardInterrupt):  # click's word for a Ctrl-C while it parsed
            interrupted()
        typer.echo("autotune: aborted", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
