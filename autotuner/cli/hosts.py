"""`autotune hosts`: the nodes a sweep would run on, checked before GPU hours are spent, as the backend the
options name finds them (a hostfile's over SSH, a Slurm allocation's, a Ray cluster's): one API call."""
from __future__ import annotations

import sys

import typer

import autotuner
from autotuner import UserError

from .app import Format, fail, format_option, screen
from .bundles import Given, backend_options, bundled


@bundled
def hosts(
    backend: Given = backend_options("hosts"),
    fmt: Format = format_option("table (fitted to the terminal), json, csv or md (Markdown)."),
    as_json: bool = typer.Option(False, "--json", help="The same as --format json."),
) -> None:
    """Check every host of a hostfile before spending GPU hours: reachable, GPUs, versions, load. With --slurm:
    the nodes of the allocation this runs in, their state in Slurm and what each can run."""
    try:
        autotuner.check_options("hosts", backend)
        check = autotuner.hosts_check(**backend)
        text = autotuner.render_hosts_check(check, "json" if as_json else fmt.value, screen())
    except UserError as e:
        raise fail(e) from None
    sys.stdout.write(text)
    raise typer.Exit(0 if check.ok else 1)
