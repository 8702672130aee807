import socket
from pathlib import Path

from autotuner.backends.launch import MASTER_PORTS
from autotuner.backends.local import ports
from autotuner.backends.local.ports import free_port


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


def test_deepspeeds_shared_memory_buffers_of_a_run_are_removed_when_it_ends(tmp_path):
    """DeepSpeed's CPU allreduce leaves a 69 MB file in /dev/shm per rank and never removes it; the stand-in
    makes one the same way (named by the master's address and port), and one of another port that is not ours."""
    import os

    from cli_rig import autotune, env, write_launcher, write_sweep

    launcher = write_launcher(tmp_path, """#!/bin/sh
while [ $# -gt 0 ]; do [ "$1" = --master_port ] && port=$2; shift; done
echo "$port" >> "$PORTS_LOG"
: > "/dev/shm/deepspeed_allreduce_buffer_$(id -u)_127.0.0.1_${port}_0"
printf '{"throughput": 1.0}\\n' > "$AUTOTUNE_METRICS_PATH"
""")
    # port 1: no run of ours has it, nor another file's test of this (an xdist worker may run one at once)
    other = Path(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_1_0")
    other.touch()
    try:
        done = autotune("run", write_sweep(tmp_path, range(3)), "--slots", "2", "--launcher", launcher, "-o",
                        tmp_path / "r", "-q", environ=env(PORTS_LOG=tmp_path / "ports"))
        assert done.returncode == 0, done.stderr
        ports = (tmp_path / "ports").read_text().split()
        assert len(ports) == 3
        assert not [p for p in ports if list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{p}_*"))]
        assert other.exists()  # not a run of ours
    finally:
        other.unlink(missing_ok=True)
