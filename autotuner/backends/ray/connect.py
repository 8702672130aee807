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
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import IO

from ...errors import UserError
from .address import parse, probe

ADDRESS_ENV = "RAY_ADDRESS"
RAY_LOG = "ray.log"  # in the results directory: what Ray itself says to the runner (a raylet's death, its log lines)
NAMESPACE = "autotune"  # every placement group and actor of ours is named in it: `<sweep id>.<attempt>...`


def address_of(given: str | None) -> str:
    """The address to connect to: the one given, else RAY_ADDRESS, else `auto`."""
    return given or os.environ.get(ADDRESS_ENV) or "auto"


def source_of(given: str | None) -> str:
    """Where the address `address_of(given)` comes from, as a refusal names it."""
    return "--ray" if given or not os.environ.get(ADDRESS_ENV) else ADDRESS_ENV


def is_connected() -> bool:
    """Whether this process is connected to a Ray cluster now (Ray not imported yet: it is not)."""
    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


@contextlib.contextmanager
def owned() -> Iterator[None]:
    """The connection to Ray made inside the block (`connect` by the cluster's reading, reused by the backend),
    shut at its end, however it ends; one this process held before (a program's own `ray.init`) is its owner's
    and is left open."""
    before = is_connected()
    try:
        yield
    finally:
        if not before and is_connected():
            sys.modules["ray"].shutdown()


def import_ray() -> ModuleType:
    """Ray, or a UserError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UserError("--ray needs Ray: pip install 'ds-autotune[ray]'") from None
    return ray


def connect(address: str, where: Path | None = None, source: str = "--ray") -> ModuleType:
    """This process connected to the cluster at `address` (once; again is a no-op), or a UserError naming
    `source` (the option or variable that gave the address). The address is read (address.parse) before Ray is
    imported, and probed (address.probe) before Ray is handed it: Ray's own client retries for minutes."""
    parsed = parse(address, source)
    ray = import_ray()
    if ray.is_initialized():
        return ray
    if parsed is None:  # auto: the cluster this machine is a node of, if any (none: ray.init says so at once)
        found = _bootstrap_address(ray, address)
        parsed = parse(found, f"{source} {address} ({found})") if found != address else None
    silent = probe(parsed) if parsed is not None else None
    if silent:
        shown_as = address if parsed is None or parsed.text == address else f"{address} ({parsed.text})"
        raise UserError(f"{source}: no Ray cluster answers at {shown_as}: {silent}", where)
    if parsed is not None and parsed.client:  # Ray's client fails to connect (after 40 s) while RAY_ADDRESS names a GCS
        os.environ.pop("RAY_ADDRESS", None)
    MESSAGES.divert(ray)
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stderr(quiet):
            ray.init(address=address if parsed is None else parsed.text, namespace=NAMESPACE, log_to_driver=False,
                     logging_level=logging.ERROR, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
        raise UserError(f"{source}: no Ray cluster answers at {address}: {_first_sentence(e)}", where) from None
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


class Messages(logging.Handler):
    """What Ray itself tells this process (the errors it relays to every driver, such as a raylet's "Raylet is
    terminated" banner with the node's last log lines, and its Python loggers' records), kept off the terminal:
    the runner's output is its own. Appended to the sweep's ray.log while a runner holds one (`to`), else
    dropped (Ray keeps its own logs on its nodes)."""

    def __init__(self) -> None:
        super().__init__()
        self._file: IO[str] | None = None
        self._guard = threading.Lock()

    def divert(self, ray: ModuleType) -> None:
        """Ray's printing of relayed errors (`print_to_stdstream`, looked up as each one comes) and its loggers
        sent here instead of stdout and stderr."""
        ray._private.worker.print_to_stdstream = self.relayed
        for name in ("ray", "ray._private", "ray.util"):
            logger = logging.getLogger(name)
            logger.handlers[:] = [self]
            logger.propagate = False

    def to(self, path: Path | None) -> None:
        """From now on into `path` (appended), or nowhere (None)."""
        opened = open(path, "a", encoding="utf-8", errors="replace") if path is not None else None  # noqa: SIM115
        with self._guard:
            old, self._file = self._file, opened
        if old is not None:
            old.close()

    def relayed(self, data: Mapping[str, object], ignore_prefix: bool = False) -> None:
        """Ray's `print_to_stdstream(data, ignore_prefix)`: lines a raylet, a worker or the autoscaler sent."""
        lines = data.get("lines")
        self.lines(str(data.get("pid", "ray")), [str(line) for line in lines] if isinstance(lines, list) else [])

    def emit(self, record: logging.LogRecord) -> None:
        self.lines(record.name, [record.getMessage()])

    def lines(self, who: str, lines: Sequence[str]) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with self._guard:
            if self._file is None:
                return
            with contextlib.suppress(OSError, ValueError):
                self._file.write("".join(f"{stamp} ({who}) {line}\n" for line in lines))
                self._file.flush()


MESSAGES = Messages()
