"""Reaching a Ray cluster as a client: the address (`--ray ADDRESS`, else RAY_ADDRESS, else `auto`, a cluster
this machine is a node of), never a cluster started on the way; every failure one line.

Ray is an optional dependency (`pip install 'ds-autotune[ray]'`): imported only here and by the modules that
run once a cluster is reached, so that nothing else of autotune loads it.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import socket
from pathlib import Path
from types import ModuleType

from ...errors import UserError

NAMESPACE = "autotune"  # every placement group and actor of ours is named in it: `<sweep id>.<attempt>...`
CONNECT_WITHIN = 10.0  # seconds for a cluster's address to accept a connection before it is taken as holding none
_HOST_PORT = re.compile(r"(?:ray://)?(?P<host>\[[^]]+]|[^:/\s]+):(?P<port>\d+)")


def address_of(given: str | None) -> str:
    """The address to connect to: the one given, else RAY_ADDRESS, else `auto`."""
    return given or os.environ.get("RAY_ADDRESS") or "auto"


def import_ray() -> ModuleType:
    """Ray, or a UserError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UserError("--ray needs Ray: pip install 'ds-autotune[ray]'") from None
    return ray


def connect(address: str, where: Path | None = None) -> ModuleType:
    """This process connected to the cluster at `address` (once; again is a no-op), or a UserError."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    found = _bootstrap_address(ray, address)
    silent = unanswering(found)
    if silent:
        shown = address if found == address else f"{address} ({found})"
        raise UserError(f"--ray: no Ray cluster answers at {shown}: {silent}", where)
    if address.startswith("ray://"):  # Ray's client fails to connect (after 40 s) while RAY_ADDRESS names a GCS
        os.environ.pop("RAY_ADDRESS", None)
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stderr(quiet):
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.ERROR,
                     configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
        raise UserError(f"--ray: no Ray cluster answers at {address}: {_first_sentence(e)}", where) from None
    return ray


def _bootstrap_address(ray: ModuleType, address: str) -> str:
    """`auto` as Ray resolves it (the cluster this machine last started, or a Ray process running here), so that
    a stale or unreachable one is refused in seconds instead of Ray's minutes of retries; else `address`."""
    if address != "auto":
        return address
    services = logging.getLogger("ray._private.services")  # "Found multiple active Ray instances": not ours to print
    level = services.level
    services.setLevel(logging.ERROR)
    try:
        found = ray._private.services.canonicalize_bootstrap_address(address)
    except (ConnectionError, AttributeError, ValueError):  # none here: ray.init says so in its own words
        return address
    finally:
        services.setLevel(level)
    return found if isinstance(found, str) else address


def _first_sentence(error: BaseException) -> str:
    """Ray's message cut to one line: its first line, and of a line that leads into a list ("either:"), its first
    sentence."""
    text = str(error).strip()
    if not text:
        return type(error).__name__
    first = text.splitlines()[0]
    return first.split(". ")[0] + "." if first.endswith(":") and ". " in first else first


def unanswering(address: str) -> str | None:
    """Why nothing listens at a `host:port` address (Ray's client would wait for it for ever), None when it
    does or when the address names no port (`auto`: Ray itself says when there is no cluster)."""
    m = _HOST_PORT.fullmatch(address)
    if m is None:
        return None
    try:
        with socket.create_connection((m["host"].strip("[]"), int(m["port"])), timeout=CONNECT_WITHIN):
            return None
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__
