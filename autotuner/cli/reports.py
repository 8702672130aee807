"""The commands that read sweeps and never change them: `status`, `report`, `compare`, `dashboard`."""
from __future__ import annotations

import sys
from pathlib import Path

import typer

import autotuner
from autotuner import UserError

from .app import Brief, Format, collecting, fail, format_option, screen
from .bundles import DIRECTORY, bundled
from .goal import GOAL, GoalOptions

_HELD: list[object] = []


def _held() -> list[object]:
    """Where a read command leaves what it read (a snapshot of 100,000 attempts, their records): held until the
    process ends, which it does without freeing them (`autotuner.__main__`). Emptied first: run in a process
    that goes on (tests), it holds one command's worth."""
    _HELD.clear()
    return _HELD


def status(
    directory: Path = DIRECTORY,
    fmt: Brief = format_option("table: lines for people; json: for programs."),
    as_json: bool = typer.Option(False, "--json", help="The same as --format json."),
) -> None:
    """Where a sweep stands: counts, what runs where, the best so far. Safe while it runs."""
    try:
        sys.stdout.write(autotuner.render_status(directory, "json" if as_json else fmt.value, keep=_held()))
    except UserError as e:
        raise fail(e) from None


@bundled
def report(
    directory: Path = DIRECTORY,
    fmt: Format = format_option("table (fitted to the terminal), json, csv or md (Markdown): one row per "
                                "experiment with every swept parameter and metric."),
    plot: bool = typer.Option(False, "--plot", help="Also draw plot_metric.png and plot_timeline.png into DIR "
                                                    "(needs matplotlib: pip install 'ds-autotune[plots]')."),
    x: str | None = typer.Option(None, "--x", help="Dotted ds_config key on the metric plot's x axis "
                                                      "[default: train_micro_batch_size_per_gpu]."),
    lines: str | None = typer.Option(None, "--lines", help="Dotted ds_config key: one line per value "
                                                              "[default: zero_optimization.stage]."),
    html: str | None = typer.Option(None, "--html", metavar="[FILE]", help="Also write one self-contained "
                                       "HTML page: table, best config, command, plots [FILE: DIR/report.html]."),
    training_run: GoalOptions = GOAL,
) -> None:
    """Every experiment of a sweep ranked by the metric, the best marked, failures with their reason; with the
    training run stated (here or in the tune), each config's time to train, GPU-hours and cost, the front."""
    try:
        wanted = training_run.goal()
        if (x or lines) and not (plot or html is not None):
            raise UserError("--x and --lines shape the plots: add --plot or --html")
        if html:  # before anything is printed: a refusal is the one line
            autotuner.check_output(Path(html), "--html", [directory / "ledger.sqlite"], own_files=False,
                                   replaced=True)
        # The report made (a training run it cannot price refused), then the page, then the plots, then the report
        # written: a refusal (a --x no experiment has, a page over the sweep's own files, no matplotlib) is then
        # the one line, with nothing written before it.
        text = autotuner.render_report(directory, fmt.value, screen(), keep=_held(), goal=wanted)
        if html is not None or plot:
            with collecting():
                _draw(directory, html, plot, x, lines, wanted)
        sys.stdout.write(text)
    except UserError as e:
        raise fail(e) from None


def _draw(directory: Path, html: str | None, plot: bool, x: str | None, lines: str | None,
          wanted: autotuner.Goal) -> None:
    """The HTML page, then the plots, each named on stderr."""
    if html is not None:
        page, note = autotuner.write_html(directory, Path(html) if html else None, x=x, lines=lines, goal=wanted)
        typer.echo(f"html: {page}" + (f" (without plots: {note})" if note else ""), err=True)
    if plot:
        paths = autotuner.write_plots(autotuner.snapshot(directory), x, lines, goal=wanted)
        typer.echo("plots: " + ", ".join(str(p) for p in paths), err=True)


def compare(
    dir_a: Path = typer.Argument(..., help="A sweep's results directory (A)."),
    dir_b: Path = typer.Argument(..., help="Another sweep's results directory (B)."),
    fmt: Format = format_option("table (fitted to the terminal), json, csv or md (Markdown)."),
) -> None:
    """The same experiments (by name) of two sweeps side by side, with the ratio of the metric B / A."""
    try:
        sys.stdout.write(autotuner.render_compare(dir_a, dir_b, fmt.value, screen(), keep=_held()))
    except UserError as e:
        raise fail(e) from None


def dashboard(
    directories: list[Path] = typer.Argument(None, help="Results directories: a sweep's, or a folder of sweeps "
                                                         "(new ones appear as they start) [default: results]."),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="Port to listen on (0: any free one)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address or name to listen on (::1, 0.0.0.0, :: for "
                             "IPv6 and IPv4, localhost: each address it resolves to). Anything but loopback lets "
                             "other machines reach the page: the link still guards it, but the traffic is plain "
                             "HTTP."),
    allow_cancel: bool = typer.Option(False, "--allow-cancel", help="Let the page cancel experiments or a whole "
                                      "sweep (as `autotune cancel` does)."),
) -> None:
    """A live page of sweeps in the browser, read only from their ledgers: counts, ETA, best config, nodes,
    every experiment, each run's logs, plots. Prints the link to open (it opens the page once; the next one is
    printed when it is used); Ctrl-C ends it.
    Needs the dashboard extra: pip install 'ds-autotune[dashboard]'."""
    try:
        autotuner.serve_dashboard(directories or [Path("results")], host=host, port=port,
                                  allow_cancel=allow_cancel, announce=lambda line: print(line, flush=True))
    except UserError as e:
        raise fail(e) from None
