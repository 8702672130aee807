"""Shared pytest fixtures."""
from __future__ import annotations

import os
import socket

import pytest

# --- real sshd nodes on loopback (tests/sshnodes.py) -------------------------------------------------------------

@pytest.fixture(scope="session")
def _ssh_nodes_session(tmp_path_factory):
    import sshnodes

    reason = sshnodes.unavailable_reason()
    if reason:
        message = f"no sshd test nodes: {reason} (.ci/setup-tests installs them)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI installs them: a skip there would hide a broken setup
        pytest.skip(message)
    nodes = sshnodes.start_nodes(3, tmp_path_factory.mktemp("sshnodes"))
    try:
        yield nodes
    finally:
        nodes.close()


@pytest.fixture
def ssh_nodes(_ssh_nodes_session):
    """Three real sshd nodes, `node-1`..`node-3` on 127.0.0.2..4 (port 22 unless taken), started once per session
    and all up again at the start of every test (a test may `stop()` one to simulate a lost node).

    `ssh_nodes.config_path` is an ssh config naming them (use with `ssh -F`, `SSHPool(ssh_nodes.config_path)`,
    or pdsh with `ssh_nodes.pdsh_env()`); `ssh_nodes.known_hosts_path` holds their host keys;
    `ssh_nodes["node-2"]` / `ssh_nodes[1]` is a `sshnodes.Node` with `.stop()`, `.start()`, `.address`, `.port`.
    """
    _ssh_nodes_session.start()
    return _ssh_nodes_session


# --- background `autotune` processes (tests/cli_rig.py) ---------------------------------------------------------

@pytest.fixture
def runners():
    """`cli_rig.Runners`: the test's background `autotune` processes, whatever is left of them killed at the end."""
    from cli_rig import Runners

    r = Runners()
    yield r
    r.cleanup()


# --- a real Slurm cluster on this machine (tests/slurm_lab.py) --------------------------------------------------

@pytest.fixture(scope="session")
def slurm_lab(tmp_path_factory):
    """A real Slurm cluster, started once per session: nodes `n1`..`n3` (CPUs=2, Gres=gpu:2 each, fake GPUs that
    set CUDA_VISIBLE_DEVICES), partition `debug`. Pass `slurm_lab.env` to every Slurm command (SLURM_CONF).
    Helpers: `allocate(nodes, gpus_per_node, *salloc_args) -> job id`, `release(job)`, `steps(job)`,
    `drain(node)`, `resume_node(node)`, `down(node)` / `start_node(node)`, `node_state(node)`, `run(*args)`.
    A test leaves what it changed as it found it (its jobs released, its nodes resumed).

    A missing Slurm fails, never skips: .ci/setup-tests installs it.
    """
    import slurm_lab

    reason = slurm_lab.unavailable_reason()
    if reason:
        pytest.fail(f"no Slurm lab: {reason} (.ci/setup-tests installs it)")
    lab = slurm_lab.SlurmLab(tmp_path_factory.mktemp("slurm"))
    lab.start()
    try:
        yield lab
    finally:
        lab.stop()


# --- a real Ray cluster on this machine (tests/ray_lab.py) ------------------------------------------------------

@pytest.fixture(scope="session")
def ray_lab():
    """A real Ray cluster, started once per session: a head and two worker nodes, two fake GPUs each, on
    loopback. Pass `ray_lab.env` to every `autotune --ray` (RAY_ADDRESS, and Ray kept on loopback). The test
    process is connected too: `placement_groups()`, `actors(prefix)`, `alive()`, `kill_worker(i)`."""
    import ray_lab as lab

    with lab.running() as held:
        yield held


@pytest.fixture
def silent_ssh(tmp_path):
    """An ssh config that sends localhost and 127.0.0.1 to a port where nothing listens (a bound socket that
    never listens refuses every connection), so no test depends on this machine's own sshd."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        config = tmp_path / "ssh_config"
        config.write_text(f"Host localhost 127.0.0.1\n  HostName 127.0.0.1\n  Port {sock.getsockname()[1]}\n"
                          "  ConnectTimeout 5\n")
        yield config
