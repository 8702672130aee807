"""`autotune`: the command line. A thin face over the Python API; bad input is one line and exit status 2.

Start-up stays fast: nothing here imports torch, deepspeed or the SSH stack on the way to `--help`.
"""
from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from .errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Run a space of DeepSpeed configurations across GPU slots and keep the fastest.")


def fail(error: UserError | str) -> "typer.Exit":
    typer.echo(f"autotune: error: {error}", err=True)
    return typer.Exit(2)


@app.command()
def run(
    specs: list[Path] = typer.Argument(..., help="Sweep files (hjson), DeepSpeed experiment files, or directories of them."),
    hostfile: Optional[Path] = typer.Option(None, "--hostfile", "-H", help="DeepSpeed hostfile; none = this machine."),
    include: str = typer.Option("", "--include", "-i", help="DeepSpeed syntax, e.g. worker-0:0,1@worker-1."),
    exclude: str = typer.Option("", "--exclude", "-e", help="DeepSpeed syntax, e.g. worker-1:0."),
    slots: Optional[int] = typer.Option(None, "--slots", min=1, help="Run on this many CPU slots of this machine (no GPU needed)."),
    results: Optional[Path] = typer.Option(None, "--results", "-o", help="Results directory [default: results/NAME-TIME]."),
    script: Optional[str] = typer.Option(None, "--script", help="Training script, for experiment files that name none."),
    args: str = typer.Option("", "--args", help="The script's arguments, as one shell-quoted string."),
    metric: Optional[str] = typer.Option(None, "--metric", help="throughput, latency, FLOPS_per_gpu, or NAME:min|max."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Seconds an experiment may run, unless its spec says."),
    deadline: Optional[float] = typer.Option(None, "--deadline", help="Seconds the whole sweep may run."),
    retries: int = typer.Option(1, "--retries", min=0, help="Retries of transient failures (launch, lost host)."),
    grace: float = typer.Option(10.0, "--grace", help="Seconds between SIGTERM and SIGKILL when ending a run."),
    launcher: Optional[str] = typer.Option(None, "--launcher", help="Command that starts DeepSpeed's launcher [default: deepspeed]."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the outcome."),
) -> None:
    """Run a sweep and report the best configuration."""
    from . import runner
    from .spec import load_sweep

    reload = {"specs": [str(p.resolve()) for p in specs], "script": script, "args": args, "metric": metric,
              "timeout": timeout}
    try:
        sweep = _load(reload)
        cluster = runner.local_or_hostfile_cluster(hostfile, include, exclude, slots)
        directory = results or Path("results") / f"{sweep.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        runner.prepare(sweep, cluster, directory, launcher=shlex.split(launcher) if launcher else None,
                       reload=reload)
    except UserError as e:
        raise fail(e)
    if not quiet:
        typer.echo(f"sweep {sweep.name}: {len(sweep.experiments)} experiments on "
                   f"{sum(len(s) for s in cluster.slots.values())} {cluster.accelerator} slot(s) of "
                   f"{len(cluster.slots)} host(s); results in {directory}")
    _execute(directory, runner.Options(grace=grace, retries=retries, deadline=deadline), quiet)


def _load(reload: dict):
    from .spec import load_sweep

    return load_sweep([Path(p) for p in reload["specs"]], script=reload.get("script"),
                      args=shlex.split(reload.get("args") or ""), metric=reload.get("metric"),
                      timeout=reload.get("timeout"))


def _execute(directory: Path, options, quiet: bool, **kwargs) -> None:
    from . import runner

    if not quiet:
        options.observers.append(_print_event)
    try:
        result = runner.execute(directory, options, **kwargs)
    except UserError as e:
        raise fail(e)
    except KeyboardInterrupt:
        typer.echo(f"\nkilled; `autotune resume {directory}` finishes the sweep", err=True)
        raise typer.Exit(runner.EXIT_INTERRUPTED)
    _print_outcome(result)
    raise typer.Exit(result.exit_code)


@app.command()
def resume(
    directory: Path = typer.Argument(..., help="A sweep's results directory."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Run failed and timed-out experiments again."),
    only_new: bool = typer.Option(False, "--only-new", help="The spec changed: run only its new experiments."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Seconds an experiment may run, unless its spec says."),
    deadline: Optional[float] = typer.Option(None, "--deadline", help="Seconds the resumed sweep may run."),
    retries: int = typer.Option(1, "--retries", min=0, help="Retries of transient failures."),
    grace: float = typer.Option(10.0, "--grace", help="Seconds between SIGTERM and SIGKILL when ending a run."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the outcome."),
) -> None:
    """Finish an interrupted sweep: nothing that succeeded runs again."""
    from . import runner

    try:
        meta = runner.sweep_meta(directory)
        new: list = []
        if meta.get("reload"):
            sweep = _load(dict(meta["reload"]))
            added, changed, removed = runner.spec_changes(directory, sweep)
            if (added or changed or removed) and not only_new:
                parts = [f"{label}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}"
                         for label, names in (("new", added), ("changed", changed), ("removed", removed)) if names]
                raise UserError("the sweep's spec changed since it started (" + "; ".join(parts) +
                                "); `--only-new` runs just the new experiments", sweep.source)
            new = [e for e in sweep.experiments if e.name in set(added)] if only_new else []
    except UserError as e:
        raise fail(e)
    _execute(directory, runner.Options(grace=grace, retries=retries, deadline=deadline, timeout=timeout), quiet,
             retry_failed=retry_failed, new_experiments=new)


@app.command()
def cancel(
    directory: Path = typer.Argument(..., help="A sweep's results directory."),
    names: list[str] = typer.Argument(None, help="Experiments to cancel; none = the whole sweep."),
) -> None:
    """Cancel experiments of a sweep, or all of it, from any terminal."""
    from . import runner

    try:
        typer.echo(runner.cancel(directory, names or []))
    except UserError as e:
        raise fail(e)


@app.command()
def status(
    directory: Path = typer.Argument(..., help="A sweep's results directory."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable."),
) -> None:
    """Where a sweep stands: counts, what runs where, the best so far. Safe while it runs."""
    from . import render

    try:
        sys.stdout.write(render.render_status(directory, as_json))
    except UserError as e:
        raise fail(e)


def _print_event(what: str, subject, outcome) -> None:
    stamp = time.strftime("%H:%M:%S")
    name = subject.experiment.name
    if what == "started":
        where = " ".join(f"{h}:{','.join(map(str, ids))}" for h, ids in subject.reservation.slots)
        typer.echo(f"{stamp} {'start':<9} {name} (attempt {subject.attempt}) on {where}")
    elif outcome is not None:
        value = ""
        if outcome.metrics:
            value = " " + ", ".join(f"{k}={v:.4g}" for k, v in outcome.metrics.items()
                                    if k in ("throughput", "latency", "FLOPS_per_gpu"))
        why = f" [{outcome.reason}] {outcome.detail}" if outcome.state != "succeeded" and outcome.reason else ""
        typer.echo(f"{stamp} {outcome.state:<9} {name}{value}{why}")
    else:
        typer.echo(f"{stamp} {'cancelled':<9} {name} (never started)")


def _print_outcome(result) -> None:
    from .report import OPTIMAL_COMMAND

    snap = result.snapshot
    counts = ", ".join(f"{n} {state}" for state, n in sorted(snap.counts().items()))
    typer.echo(f"\n{len(snap.attempts)} experiments: {counts}")
    best = snap.best
    if best is None:
        typer.echo("no experiment succeeded: no best configuration" + (" yet" if result.interrupted else ""))
    else:
        typer.echo(f"best: {best.name} with {snap.metric.name} {best.metric:.6g}")
        typer.echo(f"  config:  {result.optimal_config}")
        typer.echo(f"  command: {snap.directory / OPTIMAL_COMMAND}")
    if result.interrupted:
        typer.echo(f"interrupted: `autotune resume {snap.directory}` finishes the sweep")


@app.command()
def report(
    directory: Path = typer.Argument(..., help="A sweep's results directory."),
    fmt: str = typer.Option("table", "--format", "-f", help="table, json, csv or md."),
) -> None:
    """Every experiment of a sweep ranked by the metric, the best marked, failures with their reason."""
    from . import render

    try:
        text = render.render_report(directory, fmt)
    except UserError as e:
        raise fail(e)
    sys.stdout.write(text)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
