"""`autotune hosts`: the nodes a sweep would run on, checked before GPU hours are spent, as the backend the
options name finds them (a hostfile's over SSH, a Slurm allocation's, a Ray cluster's): one API call."""
from __future__ import annotations

import sys
from pathlib import Path

import typer

import autotuner
from autotuner import UserError

from .app import Format, fail, format_option, screen
from .bundles import ACCEPT_NEW_HOSTS, SSH_CONFIG
from .checks import check_ssh_config


def hosts(
    hostfile: Path = typer.Option(Path("hostfile"), "--hostfile", "-H", help="DeepSpeed hostfile."),
    ssh_config: Path | None = SSH_CONFIG,
    accept_new_hosts: bool = ACCEPT_NEW_HOSTS,
    fmt: Format = format_option("table (fitted to the terminal), json, csv or md (Markdown)."),
    as_json: bool = typer.Option(False, "--json", help="The same as --format json."),
    slurm: bool = typer.Option(False, "--slurm", help="The nodes of this Slurm allocation instead of a hostfile."),
    ray: str | None = typer.Option(None, "--ray", metavar="[ADDRESS]", help="The nodes of this Ray cluster (ADDRESS, "
                                   "else RAY_ADDRESS, else auto) instead of a hostfile."),
) -> None:
    """Check every host of a hostfile before spending GPU hours: reachable, GPUs, versions, load. With --slurm:
    the nodes of the allocation this runs in, their state in Slurm and what each can run."""
    try:
        check_ssh_config(ssh_config)
        check = autotuner.hosts_check(hostfile, autotuner.Ssh(str(ssh_config) if ssh_config else None,
                                                              accept_new_hosts), slurm=slurm, ray=ray)
        text = autotuner.render_hosts_check(check, "json" if as_json else fmt.value, screen())
    except UserError as e:
        raise fail(e) from None
    sys.stdout.write(text)
    raise typer.Exit(0 if check.ok else 1)
