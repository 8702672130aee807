"""`autotune`: the command line. A thin face over the Python API (`autotuner`): parse, call, print. Bad input is
one line and exit status 2.

The modules, by job: `app` (the typer app, global options, what every command prints alike), `bundles`
(options several commands share, declared once), `checks` (option values checked before anything starts),
`sweeps` (run, tune, resume, cancel), `plan`, `reports` (status, report, compare, dashboard), `hosts`,
`allocation` (a Slurm allocation asked for and given back), `execute` (a sweep watched to its end),
`interrupts` (Ctrl-C), `entry` (`main`, the console script), `reference` (docs/reference.md written from the
commands, never imported on the way to a command). The commands are registered here, in the order
`autotune --help` lists them.

Start-up stays fast: nothing here imports torch, deepspeed or the SSH stack on the way to `--help`.
"""
from __future__ import annotations

from .app import app
from .entry import main, optional_html_value
from .hosts import hosts
from .plan import plan
from .reports import compare, dashboard, report, status
from .sweeps import TUNE_SETTINGS, cancel, resume, run, tune

app.command()(run)
app.command(context_settings=TUNE_SETTINGS)(tune)
app.command()(plan)
app.command()(resume)
app.command()(cancel)
app.command()(status)
app.command()(report)
app.command()(compare)
app.command()(dashboard)
app.command()(hosts)

__all__ = ["app", "main", "optional_html_value"]
