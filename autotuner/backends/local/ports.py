"""Master ports for attempts on this machine: free now, and kept out of the way of everything else."""
from __future__ import annotations

import random
import socket

from ..launch import MASTER_PORTS


def free_port(taken: set[int]) -> int:
    """A master port free on this machine now, not handed to another running attempt, and outside the
    ephemeral range (see launch.MASTER_PORTS), so nothing else is given it before the launcher binds it."""
    while True:
        port = random.randint(*MASTER_PORTS)
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        return port
