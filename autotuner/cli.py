"""`autotune`: the command line. A thin face over the Python API; bad input is one line and exit status 2.

Start-up stays fast: nothing here imports torch, deepspeed or the SSH stack on the way to `--help`.
"""
from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from . import limits
from .errors import UserError, shown

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Run a space of DeepSpeed configurations across GPU slots and keep the fastest.")


EVENTS_HELP = ("Append one JSON line per event (started, finished: name, attempt, slots, state, reason, metric, "
               "timestamp) to this file, for scripts.")

# Options that several commands share.
GRACE = typer.Option(10.0, "--grace", help="Seconds between SIGTERM and SIGKILL when ending a run.")
SSH_CONFIG = typer.Option(None, "--ssh-config", help="ssh config file to use instead of ~/.ssh/config.")
ACCEPT_NEW_HOSTS = typer.Option(False, "--accept-new-hosts", help="Trust (and record) host keys not yet in known_hosts.")
REMOTE_DIR = typer.Option(None, "--remote-dir", help="Where runs write on hosts without our filesystem; copied back over SFTP.")
QUIET = typer.Option(False, "--quiet", "-q", help="Print only the outcome.")
EVENTS = typer.Option(None, "--events", help=EVENTS_HELP)


def _timeout_value(text: str) -> float | str:
    """`--timeout SECONDS` or `--timeout none` (no limit); anything else is a usage error."""
    if text.strip().lower() == "none":
        return "none"
    try:
        value = float(text)
    except ValueError:
        raise typer.BadParameter(f"expected a number of seconds or `none`, not {shown(text)}") from None
    if not (0 < value < float("inf")):
        raise typer.BadParameter(f"expected a positive number of seconds or `none`, not {shown(text)}")
    return value


def timeout_seconds(given: float | str | None) -> float | None:
    """What a --timeout value means for experiments whose spec gives none: None (not given) is the default
    limit, `none` is no limit."""
    if given == "none":
        return None
    if isinstance(given, (int, float)) and not isinstance(given, bool) and 0 < given < float("inf"):
        return float(given)
    return limits.DEFAULT_TIMEOUT  # not given (or, in a ledger's record of `run`, not a usable value)


def fail(error: UserError | str) -> "typer.Exit":
    typer.echo(f"autotune: error: {error}", err=True)
    return typer.Exit(2)


def _split(text: str, option: str) -> list[str]:
    """A shell-quoted option value as words; unbalanced quotes are bad input, named by their option."""
    try:
        return shlex.split(text)
    except ValueError as e:
        raise UserError(f"{option} {text!r}: {e}") from None


def _seconds(value: float | None, option: str, *, positive: bool = False) -> None:
    """A number of seconds given on the command line: finite, not negative (with `positive`, above 0)."""
    if value is not None and (value != value or value in (float("inf"), float("-inf")) or value < 0
                              or (positive and value == 0)):
        raise UserError(f"{option} must be a {'positive' if positive else 'non-negative'} number of seconds, "
                        f"not {value:g}")


def _check_ssh_config(path: Path | None) -> None:
    """An ssh config file named on the command line must be there before anything is created or launched."""
    if path is None:
        return
    if not path.is_file():
        raise UserError("--ssh-config: no such file" if not path.exists() else "--ssh-config: not a file", path)
    if not os.access(path, os.R_OK):
        raise UserError("--ssh-config: cannot read this file", path)


@app.command()
def run(
    specs: list[Path] = typer.Argument(..., help="Sweep files (hjson), DeepSpeed experiment files, or directories of them."),
    hostfile: Optional[Path] = typer.Option(None, "--hostfile", "-H", help="DeepSpeed hostfile; none = this machine."),
    include: str = typer.Option("", "--include", "-i", help="DeepSpeed syntax, e.g. worker-0:0,1@worker-1."),
    exclude: str = typer.Option("", "--exclude", "-e", help="DeepSpeed syntax, e.g. worker-1:0."),
    slots: Optional[int] = typer.Option(None, "--slots", min=1, help="Run on this many CPU slots of this machine (no GPU needed)."),
    results: Optional[Path] = typer.Option(None, "--results", "-o", help="Results directory \\[default: results/NAME-TIME]."),
    script: Optional[str] = typer.Option(None, "--script", help="Training script, for experiment files that name none."),
    args: str = typer.Option("", "--args", help="The script's arguments, as one shell-quoted string."),
    metric: Optional[str] = typer.Option(None, "--metric", help="throughput, latency, FLOPS_per_gpu, or NAME:min|max."),
    timeout: Optional[str] = typer.Option(None, "--timeout", parser=_timeout_value, metavar="SECONDS|none",
                                          help="Seconds an experiment may run, unless its spec says; `none`: no "
                                               f"limit \\[default: {limits.DEFAULT_TIMEOUT:g}]."),
    deadline: Optional[float] = typer.Option(None, "--deadline", help="Seconds the whole sweep may run."),
    retries: int = typer.Option(1, "--retries", min=0, help="Retries of transient failures (launch, lost host)."),
    grace: float = GRACE,
    launcher: Optional[str] = typer.Option(None, "--launcher", help="Command that starts DeepSpeed's launcher \\[default: deepspeed]."),
    ssh_config: Optional[Path] = SSH_CONFIG,
    accept_new_hosts: bool = ACCEPT_NEW_HOSTS,
    remote_dir: Optional[str] = REMOTE_DIR,
    quiet: bool = QUIET,
    events: Optional[Path] = EVENTS,
) -> None:
    """Run a sweep and report the best configuration."""
    from . import runner
    from .cluster import local_or_hostfile_cluster, spec_hostfile

    # What `resume` reloads the spec from: paths absolute, so it may run from any directory.
    reload = {"specs": [str(p.resolve()) for p in specs],
              "script": script and os.path.abspath(os.path.expanduser(script)),
              "args": args, "metric": metric, "timeout": timeout}
    try:
        _seconds(deadline, "--deadline")
        _seconds(grace, "--grace")
        _check_ssh_config(ssh_config)
        launch = _split(launcher, "--launcher") if launcher else None
        if events is not None:
            from .live import check_events_path

            check_events_path(events)
        sweep = _load(reload)
        hostfile, note = spec_hostfile(sweep, hostfile, slots)
        cluster = local_or_hostfile_cluster(hostfile, include, exclude, slots)
        directory = results or Path("results") / f"{sweep.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        runner.prepare(sweep, cluster, directory, launcher=launch, reload=reload)
    except UserError as e:
        raise fail(e)
    if note:
        typer.echo(f"autotune: note: {note}", err=True)
    if not quiet:
        typer.echo(f"sweep {sweep.name}: {len(sweep.experiments)} experiments on "
                   f"{sum(len(s) for s in cluster.slots.values())} {cluster.accelerator} slot(s) of "
                   f"{len(cluster.slots)} host(s); results in {directory}")
    _execute(directory, runner.Options(ssh=_ssh(ssh_config, accept_new_hosts, remote_dir), grace=grace,
                                       retries=retries, deadline=deadline, timeout=timeout_seconds(timeout)),
             quiet, events)


def _ssh(config: Path | None, accept_new_hosts: bool, remote_dir: str | None):
    """SSH settings given on the command line, or None to keep the sweep's own."""
    from .runner import Ssh

    if config is None and not accept_new_hosts and remote_dir is None:
        return None
    return Ssh(str(config.resolve()) if config else None, accept_new_hosts, remote_dir)


def _load(reload: dict):
    from .spec import load_sweep

    # The --timeout of `run` is not part of the experiments: `resume --timeout` may change it.
    return load_sweep([Path(p) for p in reload["specs"]], script=reload.get("script"),
                      args=_split(reload.get("args") or "", "--args"), metric=reload.get("metric"))


def _execute(directory: Path, options, quiet: bool, events: Optional[Path] = None, **kwargs) -> None:
    """Run it, watched: a live view on a terminal, one plain line per event otherwise, nothing with --quiet."""
    from . import runner
    from .live import watching

    options.log = lambda line: typer.echo(f"autotune: {line}", err=True)
    try:
        with watching(directory, options.observers, live=not quiet and sys.stdout.isatty(),
                      plain=None if quiet else _print_event, events=events, default_timeout=options.timeout,
                      retries=options.retries, retry_failed=kwargs.get("retry_failed", False),
                      added=kwargs.get("new_experiments", ())):
            result = runner.execute(directory, options, **kwargs)
    except UserError as e:
        raise fail(e)
    except runner.Stopped as e:  # what ran was ended first; the ledger lets `resume` finish
        _echo_err(f"autotune: error: {e}; `autotune resume {directory}` finishes the sweep")
        raise typer.Exit(runner.EXIT_FAILED)
    except KeyboardInterrupt:
        typer.echo(f"\nkilled; `autotune resume {directory}` finishes the sweep", err=True)
        raise typer.Exit(runner.EXIT_INTERRUPTED)
    try:
        _print_outcome(result)
    except OSError:  # stdout closed (`| head`): the outcome is in the results directory, the exit status says it
        _drop_stdout()
    raise typer.Exit(result.exit_code)


def _echo_err(line: str) -> None:
    try:
        typer.echo(line, err=True)
    except OSError:
        pass  # stderr is closed too: the exit status is all that is left to say it


def _drop_stdout() -> None:
    """Point a stdout that cannot be written at /dev/null, so the text still buffered for it does not fail
    again (with a traceback) when the interpreter flushes it on the way out."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


@app.command()
def resume(
    directory: Path = typer.Argument(..., help="A sweep's results directory."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Run failed and timed-out experiments again."),
    only_new: bool = typer.Option(False, "--only-new", help="The spec changed: run only its new experiments."),
    timeout: Optional[str] = typer.Option(None, "--timeout", parser=_timeout_value, metavar="SECONDS|none",
                                          help="Seconds an experiment may run, unless its spec says; `none`: no "
                                               "limit \\[default: as the sweep was started]."),
    deadline: Optional[float] = typer.Option(None, "--deadline", help="Seconds the resumed sweep may run."),
    retries: int = typer.Option(1, "--retries", min=0, help="Retries of transient failures."),
    grace: float = GRACE,
    ssh_config: Optional[Path] = SSH_CONFIG,
    accept_new_hosts: bool = ACCEPT_NEW_HOSTS,
    remote_dir: Optional[str] = REMOTE_DIR,
    quiet: bool = QUIET,
    events: Optional[Path] = EVENTS,
) -> None:
    """Finish an interrupted sweep: nothing that succeeded runs again."""
    from . import runner

    try:
        _seconds(deadline, "--deadline")
        _seconds(grace, "--grace")
        _check_ssh_config(ssh_config)
        if events is not None:
            from .live import check_events_path

            check_events_path(events)
        meta = runner.sweep_meta(directory)
        new: list = []
        reload = dict(meta.reload)
        gone = [p for p in reload.get("specs") or () if not os.path.exists(p)]
        if gone:  # e.g. /tmp wiped by a reboot: the ledger holds every experiment's spec, so finish those
            typer.echo(f"autotune: note: {gone[0]} is gone: resuming the experiments recorded in the ledger",
                       err=True)
        elif reload:
            sweep = _load(reload)
            added, changed, removed = runner.spec_changes(directory, sweep)
            if (added or changed or removed) and not only_new:
                parts = [f"{label}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}"
                         for label, names in (("new", added), ("changed", changed), ("removed", removed)) if names]
                raise UserError("the sweep's spec changed since it started (" + "; ".join(parts) +
                                "); `--only-new` runs just the new experiments", sweep.source)
            new = [e for e in sweep.experiments if e.name in set(added)] if only_new else []
    except UserError as e:
        raise fail(e)
    _execute(directory, runner.Options(ssh=_ssh(ssh_config, accept_new_hosts, remote_dir), grace=grace,
                                       retries=retries, deadline=deadline,
                                       timeout=timeout_seconds(timeout or reload.get("timeout"))), quiet,
             events, retry_failed=retry_failed, new_experiments=new)


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
    if what in ("host_down", "host_up"):
        typer.echo(f"{stamp} {'lost' if what == 'host_down' else 'back':<9} host {subject}")
        return
    if what == "requeued":
        return
    name = subject.experiment.name
    if what in ("started", "adopted"):
        where = " ".join(f"{h}:{','.join(map(str, ids))}" for h, ids in subject.reservation.slots)
        verb = "start" if what == "started" else "adopt"  # adopted: a dead runner started it, this one follows it
        typer.echo(f"{stamp} {verb:<9} {name} (attempt {subject.attempt}) on {where}")
    else:
        value = ""
        if outcome.metrics:
            value = " " + ", ".join(f"{k}={v:.4g}" for k, v in outcome.metrics.items()
                                    if k in ("throughput", "latency", "FLOPS_per_gpu"))
        why = f" [{outcome.reason}] {outcome.detail}" if outcome.state != "succeeded" and outcome.reason else ""
        typer.echo(f"{stamp} {outcome.state:<9} {name}{value}{why}")


_print_event.label = "printing events on stdout"  # type: ignore[attr-defined]  # names it if it fails


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
    plot: bool = typer.Option(False, "--plot", help="Also draw plot_metric.png and plot_timeline.png into DIR "
                                                    "(needs matplotlib: pip install 'autotuner\\[plots]')."),
    x: Optional[str] = typer.Option(None, "--x", help="Dotted ds_config key on the metric plot's x axis "
                                                      "\\[default: train_micro_batch_size_per_gpu]."),
    lines: Optional[str] = typer.Option(None, "--lines", help="Dotted ds_config key: one line per value "
                                                              "\\[default: zero_optimization.stage]."),
    html: Optional[str] = typer.Option(None, "--html", metavar="[FILE]", help="Also write one self-contained "
                                       "HTML page: table, best config, command, plots \\[FILE: DIR/report.html]."),
) -> None:
    """Every experiment of a sweep ranked by the metric, the best marked, failures with their reason."""
    from . import render

    try:
        if (x or lines) and not (plot or html is not None):
            raise UserError("--x and --lines shape the plots: add --plot or --html")
        text = render.render_report(directory, fmt)
        sys.stdout.write(text)
        if plot:
            from .plots import write_plots

            paths = write_plots(render.load(directory), x, lines)
            typer.echo("plots: " + ", ".join(str(p) for p in paths), err=True)
        if html is not None:
            from .htmlreport import write_html

            page, note = write_html(directory, Path(html) if html else None, x=x, lines=lines)
            typer.echo(f"html: {page}" + (f" (without plots: {note})" if note else ""), err=True)
    except UserError as e:
        raise fail(e)


@app.command()
def compare(
    dir_a: Path = typer.Argument(..., help="A sweep's results directory (A)."),
    dir_b: Path = typer.Argument(..., help="Another sweep's results directory (B)."),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json."),
) -> None:
    """The same experiments (by name) of two sweeps side by side, with the ratio of the metric B / A."""
    from .compare import render_compare

    try:
        sys.stdout.write(render_compare(dir_a, dir_b, fmt))
    except UserError as e:
        raise fail(e)


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


@app.command()
def hosts(
    hostfile: Path = typer.Option(Path("hostfile"), "--hostfile", "-H", help="DeepSpeed hostfile."),
    ssh_config: Optional[Path] = SSH_CONFIG,
    accept_new_hosts: bool = ACCEPT_NEW_HOSTS,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable."),
) -> None:
    """Check every host of a hostfile before spending GPU hours: reachable, GPUs, versions, load."""
    from .probe import check_hostfile
    from .render import render_hosts

    try:
        _check_ssh_config(ssh_config)
        listed, reports = check_hostfile(hostfile, str(ssh_config) if ssh_config else None, accept_new_hosts)
    except UserError as e:
        raise fail(e)
    sys.stdout.write(render_hosts(f"hosts of {hostfile}", listed, reports, as_json))
    raise typer.Exit(0 if all(r.reachable for r in reports) else 1)


# The base of every usage error (a bad option value, an unknown option or command, a missing argument). typer
# re-exports click's BadParameter (newer typer versions vendor click), so its parent is the right class either way.
_USAGE_ERROR = typer.BadParameter.__mro__[1]


def usage_error_line(error: Exception) -> str:
    """A click usage error as the one line every other mistake gets, instead of a usage box."""
    message = " ".join(error.format_message().split())
    ctx = getattr(error, "ctx", None)
    hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    return f"autotune: error: {shown(message, 300, quoted=False)}{hint}"


def main(argv: list[str] | None = None) -> None:
    """The `autotune` console script: exit 0 on success and --help, 2 for bad input or usage, or what the
    command says (1: the sweep had failures, 130: interrupted)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--html" in args:
        args = optional_html_value(args)
    try:
        code = app(args=args, prog_name="autotune", standalone_mode=False)
    except _USAGE_ERROR as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `autotune`: the help, as a usage error
            if e.format_message().strip():
                typer.echo(e.format_message(), err=True)
        else:
            typer.echo(usage_error_line(e), err=True)
        sys.exit(2)
    except typer.Abort:
        typer.echo("autotune: aborted", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
