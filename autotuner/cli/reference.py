"""docs/reference.md, written from the command line itself: each command's usage, its help, and every argument
and option as `--help` states them (names, value, help, default, range), so the page cannot promise an option the
command line no longer takes. `tests/test_docs.py` fails when the page and the command line differ.

    python -m autotuner.cli.reference docs/reference.md     # write it again (no path: print it)
"""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any  # click's commands and parameters, of whichever click typer carries (cli/entry.py)

import typer

from .app import app

WIDTH = 120
REGENERATE = "python -m autotuner.cli.reference docs/reference.md"


def _wrapped(text: str, first: str = "", indent: str = "") -> list[str]:
    """`text` (its whitespace made single spaces) after `first`, in lines of at most WIDTH; never cut in a word."""
    return textwrap.wrap(first + " ".join(text.split()), WIDTH, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False)


def _usage(path: str, command: Any) -> str:
    """`autotune run [OPTIONS] SPECS...`: arguments by their names, as people write them."""
    words = [path, "[OPTIONS]"]
    for param in command.params:
        if param.param_type_name == "argument":
            name = param.name.upper() + ("..." if param.nargs == -1 else "")
            words.append(name if param.required else f"[{name}]")
    if command.context_settings.get("allow_extra_args"):
        words.append("[ARGS]...")
    if hasattr(command, "commands"):  # the group: `autotune [OPTIONS] COMMAND [ARGS]...`
        words.append("COMMAND [ARGS]...")
    return " ".join(words)


def _section(path: str, command: Any, ctx: Any) -> list[str]:
    """A command's heading, usage, help, arguments and options."""
    lines = [f"## {path}", "", f"`{_usage(path, command)}`", ""]
    if command.help:
        lines += [*_wrapped(command.help), ""]
    for kind, title in (("argument", "Arguments"), ("option", "Options")):
        records = [p.get_help_record(ctx) for p in command.params if p.param_type_name == kind]
        records = [r for r in records if r is not None]
        if kind == "option" and (help_option := command.get_help_option(ctx)) is not None:
            records.append(help_option.get_help_record(ctx))
        if not records:
            continue
        lines += [f"{title}:", ""]
        for names, help_text in records:
            shown = names.upper() if kind == "argument" else names
            lines += _wrapped(help_text, f"- `{shown}`: " if help_text else f"- `{shown}`", "  ")
        lines.append("")
    return lines


def markdown() -> str:
    """The whole page: the global options, then each command in the order `autotune --help` lists them."""
    root: Any = typer.main.get_command(app)
    root_ctx = typer.Context(root, info_name="autotune")
    lines = ["# Command reference", "",
             *_wrapped(f"Written from the command line itself by `{REGENERATE}`; do not edit it by hand "
                       "(`tests/test_docs.py` fails when this page and the command line differ). What each "
                       "option is for, with examples, is in the other pages of the manual: start from the "
                       "[README](../README.md#the-manual)."),
             "",
             *_wrapped(", ".join(f"[{name}](#autotune-{name})" for name in root.commands), "Commands: "),
             ""]
    lines += _section("autotune", root, root_ctx)
    for name, command in root.commands.items():
        ctx = typer.Context(command, info_name=name, parent=root_ctx)
        lines += _section(f"autotune {name}", command, ctx)
    while lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    """Write the page to the path given, or print it."""
    text = markdown()
    if argv:
        Path(argv[0]).write_text(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main(sys.argv[1:])
