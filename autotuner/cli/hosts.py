"""`autotune hosts`: the nodes a sweep would run on, checked before GPU hours are spent. Each kind of node
(a hostfile's over SSH, a Slurm allocation's, a Ray cluster's) is read by one API call here."""
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
    chosen = "json" if as_json else fmt.value
    if slurm:
        _slurm_hosts(chosen)
    if ray is not None:
        _ray_hosts(ray, chosen)
    _ssh_hosts(hostfile, ssh_config, accept_new_hosts, chosen)


def _ssh_hosts(hostfile: Path, ssh_config: Path | None, accept_new_hosts: bool, fmt: str) -> None:
    """A hostfile's hosts probed over SSH: exit 0 when every one answered, 1 when one did not."""
    try:
        check_ssh_config(ssh_config)
        listed, reports = autotuner.check_hosts(hostfile, str(ssh_config) if ssh_config else None,
                                                accept_new_hosts)
    except UserError as e:
        raise fail(e) from None
    sys.stdout.write(autotuner.render_hosts(f"hosts of {hostfile}", listed, reports, fmt, screen()))
    raise typer.Exit(0 if all(r.reachable for r in reports) else 1)


def _ray_hosts(ray: str, fmt: str) -> None:
    """`hosts --ray`: the cluster's live nodes; exit 0 when one has a GPU, 1 when none has, 2 when the cluster
    cannot be reached."""
    try:
        address, nodes = autotuner.ray_nodes(ray)
    except UserError as e:
        raise fail(e) from None
    sys.stdout.write(autotuner.render_ray_nodes(address, nodes, fmt))
    raise typer.Exit(0 if any(n.gpus for n in nodes) else 1)


def _slurm_hosts(fmt: str) -> None:
    """`hosts --slurm`: exit 0 when every node can run, 1 when Slurm has taken one out."""
    try:
        allocation, nodes = autotuner.this_allocation()
        text = autotuner.render_allocation(allocation, nodes, fmt, screen())
    except UserError as e:
        raise fail(e) from None
    sys.stdout.write(text)
    raise typer.Exit(1 if any(n.lost for n in nodes.values()) else 0)
