"""A prepared sweep run to its end, watched (`run`, `tune`, `resume`): a live view on a terminal, one plain
line per event otherwise, the outcome printed and its exit status."""
from __future__ import annotations

import sys
from pathlib import Path

import typer

import autotuner
from autotuner import UserError

from .app import Brief, drop_stdout, echo_err, fail
from .bundles import Watch
from .interrupts import ignore_interrupts, interrupt_once


def execute(directory: Path, options: autotuner.Options, watch: Watch, retry_failed: bool = False,
            new_experiments: tuple[autotuner.Experiment, ...] = (), prepared: bool = False) -> None:
    """Run it, watched: a live view on a terminal, one plain line per event otherwise (not with --format
    json: stdout is the result's), nothing with --quiet. `prepared`: a new sweep, its directory just made."""
    options.log = lambda line: typer.echo(f"autotune: {line}", err=True)
    interrupt_once()
    try:
        with autotuner.watching(directory, options.observers, live=not watch.quiet and sys.stdout.isatty(),
                                plain=not watch.quiet and watch.fmt == Brief.table, events=watch.events,
                                default_timeout=options.timeout, retry_failed=retry_failed,
                                added=new_experiments):
            result = autotuner.execute(directory, options, retry_failed=retry_failed,
                                       new_experiments=new_experiments, prepared=prepared)
    except UserError as e:
        raise fail(e) from None
    except autotuner.Stopped as e:  # what ran was ended first; the ledger lets `resume` finish
        echo_err(f"autotune: error: {e}; `autotune resume {directory}` finishes the sweep")
        raise typer.Exit(autotuner.EXIT_FAILED) from None
    except KeyboardInterrupt:
        typer.echo(f"\nkilled; `autotune resume {directory}` finishes the sweep", err=True)
        raise typer.Exit(autotuner.EXIT_INTERRUPTED) from None
    ignore_interrupts()
    try:
        sys.stdout.write(autotuner.render_result(result, watch.fmt.value))
        sys.stdout.flush()
    except OSError:  # stdout closed (`| head`): the outcome is in the results directory, the exit status says it
        drop_stdout()
    raise typer.Exit(result.exit_code)
