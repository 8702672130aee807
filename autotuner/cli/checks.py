"""Option values checked before anything is asked of a cluster, created or launched: a bad one is a UserError
(one line, exit 2) or, for a value typer parses, a usage error."""
from __future__ import annotations

import shlex
from collections.abc import Collection, Sequence
from pathlib import Path

import typer

import autotuner
from autotuner import UserError

# Not sweep operations, so not API: `limits`, the bounds that option values are checked against and the default
# timeout named in --timeout's help (applied by `autotuner.timeout_seconds`), and `shown`, which quotes user
# text in a one-line message.
from .. import limits
from ..errors import shown


def timeout_value(text: str) -> float | str:
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


def split(text: str, option: str) -> list[str]:
    """A shell-quoted option value as words; unbalanced quotes are bad input, named by their option."""
    try:
        return shlex.split(text)
    except ValueError as e:
        raise UserError(f"{option} {text!r}: {e}") from None


def seconds(value: float | None, option: str, *, positive: bool = False) -> None:
    """A number of seconds given on the command line: finite, not negative (with `positive`, above 0)."""
    if value is not None and (value != value or value in (float("inf"), float("-inf")) or value < 0
                              or (positive and value == 0)):
        raise UserError(f"{option} must be a {'positive' if positive else 'non-negative'} number of seconds, "
                        f"not {value:g}")
    if value is not None and value > limits.SECONDS:
        raise UserError(f"{option} {value:g} is more than {limits.SECONDS:,} seconds (the limit)")


def results_path(results: str | None) -> Path | None:
    """`--results`: None for the default; an empty path is refused (Path("") is ".": a sweep spread over the
    current directory)."""
    if results is not None and not results.strip():
        raise UserError("--results: an empty path; name a directory")
    return None if results is None else Path(results)


def check_outputs(events: Path | None, results: Path | None, inputs: Sequence[str | Path | None],
                  specs: Sequence[Path] = ()) -> None:
    """What `run` and `tune` write, checked against what they read, before anything is asked of a cluster: the
    --events file, and the results directory (its own files over an input; a directory of experiment files)."""
    if events is not None:
        autotuner.check_output(events, "--events", inputs)
        autotuner.check_events_path(events)
    if results is not None:
        autotuner.check_results_directory(results, inputs, [p for p in specs if p.is_dir()])


def policy_names(text: str, option: str, known: Collection[str], one: bool = False) -> list[str]:
    """A comma-separated list of policy names, each one of `known` (with `one`: a single name)."""
    chosen = [word.strip() for word in text.split(",") if word.strip()]
    unknown = [word for word in chosen if word not in known]
    if unknown or not chosen or (one and len(chosen) > 1):
        raise UserError(f"{option} {shown(text)}: choose from {', '.join(known)}"
                        + ("" if one else " (comma-separated)"))
    return list(dict.fromkeys(chosen))
