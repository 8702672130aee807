"""Ending an attempt's processes, on every host it used, until none is left.

The process group goes first (it holds the launcher and the ranks it started); then every process that carries
the attempt's tag, which also finds ranks that left the group and processes on other nodes. Used after every
attempt, on cancel, timeout and Ctrl-C, and by `recovery` when `cancel` finds what a dead runner left running.
"""
from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable

from .. import tags


def end_group(pgid: int | None, tag: str, grace: float, gone_within: Callable[[float], bool]) -> None:
    """SIGTERM the group, give it `grace` seconds (`gone_within` says when it is gone), SIGKILL it, then
    end whatever else carries the tag. No `pgid` (an adopted attempt whose leader was gone): the tag only."""
    if pgid is None:
        end_tagged(tag, grace)
        return
    _killpg(pgid, signal.SIGTERM)
    if not gone_within(grace):
        _killpg(pgid, signal.SIGKILL)
    end_tagged(tag, 0)


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def end_tagged(tag: str, grace: float) -> None:
    """SIGTERM what carries the tag here, wait up to `grace` for it to go, SIGKILL the rest, check none remain."""
    if not tags.signal_tagged(tag, signal.SIGTERM):
        return
    deadline = time.monotonic() + grace
    while tags.find_tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.05)  # processes we do not parent: there is nothing to block on
    for _ in range(50):
        if not tags.signal_tagged(tag, signal.SIGKILL):
            return
        time.sleep(0.02)
    raise RuntimeError(f"processes tagged {tag} survive SIGKILL")
