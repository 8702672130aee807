import socket
from pathlib import Path

from autotuner import ports
from autotuner.launch import MASTER_PORTS
from autotuner.ports import free_port


def test_master_ports_are_outside_the_ephemeral_range_and_never_handed_out_twice():
    taken: set[int] = set()
    for _ in range(50):
        port = free_port(taken)
        assert MASTER_PORTS[0] <= port <= MASTER_PORTS[1] and port not in taken
        taken.add(port)
    low, _ = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert MASTER_PORTS[1] < low  # outgoing connections are never given one of them


def test_a_port_in_use_or_already_handed_out_is_skipped(monkeypatch):
    busy_port, handed_out, good = free_port(set()), free_port(set()), free_port(set())
    draws = iter([busy_port, handed_out, good])
    monkeypatch.setattr(ports.random, "randint", lambda a, b: next(draws))
    with socket.socket() as busy:
        busy.bind(("", busy_port))
        busy.listen()
        assert free_port({handed_out}) == good
