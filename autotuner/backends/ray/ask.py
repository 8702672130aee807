"""What the command line asks of Ray: `--ray [ADDRESS]` read from argv, checked against the options it excludes,
and the cluster it names read for `run`, `tune`, `plan` and `hosts` (Ray imported only then)."""
from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...errors import UserError
from ..cluster import Cluster
from .connect import address_of, connect
from .nodes import RayNode, cluster_of, read_nodes

# What follows a bare `--ray` as its address, rather than as the next argument (a spec file, an option).
# What `--ray VALUE` takes as its address: a word Ray knows, any scheme:// (ray://; http:// is Ray's to refuse,
# with its own advice), host:port, [v6]:port.
_ADDRESS = re.compile(r"auto|local|[A-Za-z][A-Za-z0-9+.-]*://\S+|\[[0-9A-Fa-f:.]+\]:\d+|[A-Za-z0-9._-]+:\d+")


def optional_ray_value(argv: list[str]) -> list[str]:
    """`--ray` takes an optional ADDRESS: a bare `--ray` not followed by an address becomes `--ray=` (the
    default: RAY_ADDRESS, else auto)."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--":
            break
        if arg == "--ray" and not (i + 1 < len(out) and _ADDRESS.fullmatch(out[i + 1])
                                   and not Path(out[i + 1]).exists()):
            out[i] = "--ray="
    return out


def check(ray: str | None, *, hostfile: Path | None = None, slots: int | None = None, slurm: bool = False,
          include: str = "", exclude: str = "") -> None:
    """--ray takes its nodes from the cluster: the options that name other nodes are refused with it."""
    if ray is None:
        return
    for given, name in ((hostfile is not None, "--hostfile"), (slots is not None, "--slots"), (slurm, "--slurm"),
                        (bool(include), "--include"), (bool(exclude), "--exclude")):
        if given:
            raise UserError(f"--ray takes its nodes from the Ray cluster: leave out {name}")


def ray_nodes(ray: str) -> tuple[str, list[RayNode]]:
    """The address `--ray` names and the cluster's live nodes (this process connected to it)."""
    address = address_of(ray or None)
    return address, read_nodes(connect(address).nodes())


def ray_cluster(ray: str) -> Cluster:
    """The sweep's cluster: the nodes of the Ray cluster with GPUs (a UserError when there is none)."""
    address, nodes = ray_nodes(ray)
    cluster = cluster_of(nodes)
    if not cluster.slots:
        raise UserError(f"the Ray cluster at {address} has no live node with a GPU")
    return cluster


def render_ray_nodes(address: str, nodes: Sequence[RayNode], fmt: str) -> str:
    """`autotune hosts --ray`: one row per live node: its host name, Ray's node id and address, GPUs (type),
    CPUs and memory as Ray counts them, and what it can run."""
    rows: list[dict[str, Any]] = [
        {"host": n.host, "node_id": n.id, "address": n.ip, "gpus": n.gpus, "gpu_type": n.gpu_type, "cpus": n.cpus,
         "memory_bytes": n.memory, "can_run": f"up to {n.gpus} GPU(s) here" if n.gpus else "nothing (no GPU)"}
        for n in nodes]
    if fmt == "json":
        return json.dumps({"address": address, "nodes": rows}, indent=2) + "\n"
    names = ("host", "node id", "address", "GPUs", "CPUs", "memory", "can run")
    cells = [(r["host"], r["node_id"][:16], r["address"], f"{r['gpus']}" + (f" x {r['gpu_type']}" if r["gpu_type"]
              else ""), f"{r['cpus']:g}", f"{r['memory_bytes'] / 2**30:.1f} GiB", r["can_run"]) for r in rows]
    if fmt == "csv":
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerows([names, *cells])
        return buffer.getvalue()
    if fmt == "md":
        lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
        return "\n".join(lines + ["| " + " | ".join(c) + " |" for c in cells]) + "\n"
    width = [max(len(str(x)) for x in column) for column in zip(names, *cells, strict=True)]
    lines = [f"Ray cluster at {address}: {len(nodes)} live node(s)"]
    lines += ["  ".join(str(x).ljust(w) for x, w in zip(row, width, strict=True)).rstrip()
              for row in (names, *cells)]
    return "\n".join(lines) + "\n"
