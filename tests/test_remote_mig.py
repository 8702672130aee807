"""MIG instances of hosts reached over SSH are slots of their own, as this machine's are (tests/test_mig.py).

The hostfile's hosts are probed over SSH before the sweep is prepared (ssh/probe.py): a host whose GPU is in MIG
mode, as its FAKE nvidia-smi (tests/fake_nvidia_smi.py, on the PATH of a real sshd node) lists it, gets its MIG
instances as slots, each of its profile's type, memory and UUID. A run on one goes through DeepSpeed's real
per-node launcher on that host, naming the UUID; a stand-in training script records what CUDA_VISIBLE_DEVICES
it saw. Multi-GPU experiments never land on a MIG instance.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_mig import STANDIN

import autotuner
from autotuner.backends.cluster import local_or_hostfile_cluster, with_hosts_mig
from autotuner.backends.ssh.probe import parse_mig_list, with_mig
from autotuner.errors import UserError
from autotuner.gpu.nvml import Gpu
from autotuner.ledger.store import Ledger

import fake_nvidia_smi as smi

GiB = 1 << 30
MIG_A = "MIG-aaaaaaaa-1111-2222-3333-444444444444"
MIG_B = "MIG-bbbbbbbb-1111-2222-3333-444444444444"
TYPE_3G = "A100-SXM4-40GB-MIG-3g.20gb"
LAUNCHER = Path(__file__).resolve().parent.parent / "benchmarks" / "standin.sh"


@pytest.fixture
def fake_gpus(ssh_nodes):
    """Each node's FAKE nvidia-smi (installed by the test), removed afterwards."""
    yield ssh_nodes
    for node in ssh_nodes:
        smi.uninstall(node.bin)


def mig_host() -> list[Gpu]:
    """node-1 as the probe lists it: GPU 0 in MIG mode with two 3g.20gb instances."""
    lines = ["GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-x)", f"  MIG 3g.20gb     Device  0: (UUID: {MIG_A})",
             f"  MIG 3g.20gb     Device  1: (UUID: {MIG_B})"]
    return with_mig([Gpu(0, "NVIDIA A100-SXM4-40GB", 40 * GiB, 40 * GiB, "GPU-x")], parse_mig_list(lines))


def test_a_hosts_mig_instances_become_its_slots_and_a_disagreeing_slots_count_is_said_once(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-1 slots=4 gpu=A100-40GB\nnode-2 slots=2\n")
    lines: list[str] = []
    cluster = with_hosts_mig(local_or_hostfile_cluster(hostfile), {"node-1": mig_host(), "node-2": []}, hostfile,
                             lines.append)
    assert dict(cluster.slots) == {"node-1": (1, 2), "node-2": (0, 1)}
    assert cluster.capacity["node-1"] == 1 and "node-1" not in cluster.types  # no whole GPU: no host type
    assert {i: (d.gpu_type, d.memory, d.mig) for i, d in cluster.devices["node-1"].items()} == {
        1: (TYPE_3G, 20 * 10**9, MIG_A), 2: (TYPE_3G, 20 * 10**9, MIG_B)}
    assert lines == [f"{hostfile}: node-1 slots=4, but the host has 1 GPU(s), in MIG mode or not: using its 2 slot(s) "
                     "(2 MIG instance(s))"]
    beside = [*mig_host(), Gpu(1, "NVIDIA A100-SXM4-80GB", 80 * GiB, 80 * GiB, "GPU-y")]  # a whole GPU 1 too
    mixed = with_hosts_mig(local_or_hostfile_cluster(hostfile), {"node-1": beside}, hostfile, lines.append)
    assert mixed.slots["node-1"] == (1, 2, 3) and set(mixed.devices["node-1"]) == {2, 3}  # as this machine's
    assert mixed.types["node-1"] == "A100-40GB"  # the hostfile's gpu= for its whole GPU(s), as ever
    with pytest.raises(UserError, match="pick slots 0 of node-1, whose GPUs are in MIG mode"):
        with_hosts_mig(local_or_hostfile_cluster(hostfile, include="node-1:0"), {"node-1": mig_host()}, hostfile,
                       lines.append)


def autotune(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "autotuner.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def spec(directory: Path, name: str, extra: str, count: int) -> Path:
    (directory / "standin.py").write_text(STANDIN)
    path = directory / f"{name}.hjson"
    path.write_text("{\n  name: " + name + "\n  script: standin.py\n" + extra +
                    "  ds_config: {train_micro_batch_size_per_gpu: 1}\n"
                    f"  space: {{x: {list(range(1, count + 1))}}}\n}}\n")
    return path


def test_a_sweep_runs_each_attempt_on_node_1_on_exactly_its_mig_instance_and_two_gpus_on_node_2(fake_gpus, tmp_path):
    """node-1: one A100-40GB in MIG mode, two instances; node-2: two whole A100-80GB. The one-GPU experiments,
    pinned to the MIG type, run through DeepSpeed's per-node launcher on node-1, each seeing its UUID; the
    two-GPU ones only on node-2, through the (stand-in) launcher with --include."""
    smi.install(fake_gpus["node-1"].bin, [smi.gpu("NVIDIA A100-SXM4-40GB", 40, 39,
                                                  mig=[("3g.20gb", MIG_A), ("3g.20gb", MIG_B)])])
    smi.install(fake_gpus["node-2"].bin, [smi.gpu(), smi.gpu()])
    hosts = tmp_path / "hostfile"
    hosts.write_text("node-1 slots=1\nnode-2 slots=2 gpu=A100-80GB\n")
    one = spec(tmp_path, "one", f"  gpu_type: {TYPE_3G}\n", 4)
    two = spec(tmp_path, "two", "  num_gpus: 2\n", 2)
    out = autotune("run", one, two, "-H", hosts, "--ssh-config", fake_gpus.config_path, "--launcher",
                   f"sh {LAUNCHER}", "-o", tmp_path / "r")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "slots=1, but" not in out.stderr  # slots=1 is node-1's GPU count: nothing to say
    with Ledger.open(tmp_path / "r") as ledger:
        attempts = {a.name: a for a in ledger.latest()}
    assert len(attempts) == 6 and {a.state for a in attempts.values()} == {"succeeded"}
    uuids = {1: MIG_A, 2: MIG_B}
    used = set()
    for name, a in attempts.items():
        cmd = (tmp_path / "r" / name / "cmd.txt").read_text()
        if name.startswith("one"):
            ((host, (slot,)),) = a.slots.items()
            seen = json.loads((tmp_path / "r" / name / "seen.json").read_text())
            assert host == "node-1" and seen["CUDA_VISIBLE_DEVICES"] == uuids[slot] and seen["WORLD_SIZE"] == "1"
            assert "deepspeed.launcher.launch" in cmd and "--include" not in cmd
            used.add(slot)
        else:
            assert dict(a.slots) == {"node-2": [0, 1]} and "--include node-2:0,1" in cmd and "MIG" not in cmd
    assert used == {1, 2}  # both instances ran at once
    assert set(autotuner.snapshot(tmp_path / "r").types) == {TYPE_3G, "A100-80GB"}  # results kept per type


def test_a_sweep_needing_two_gpus_on_mig_instances_only_is_one_located_line(fake_gpus, tmp_path):
    smi.install(fake_gpus["node-1"].bin, [smi.gpu("NVIDIA A100-SXM4-40GB", 40, 39,
                                                  mig=[("3g.20gb", MIG_A), ("3g.20gb", MIG_B)])])
    hosts = tmp_path / "hostfile"
    hosts.write_text("node-1 slots=2\n")
    two = spec(tmp_path, "two", "  num_gpus: 2\n", 2)
    out = autotune("run", two, "-H", hosts, "--ssh-config", fake_gpus.config_path, "--launcher", f"sh {LAUNCHER}",
                   "-o", tmp_path / "r")
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if "error" in line]
    assert errors == [f"autotune: error: {two}:4: experiment two_x1 needs 1 node(s) with 2 GPU(s) each; the cluster "
                      "has only MIG instances, and a process can use one MIG instance only"], out.stderr
    assert len(out.stderr.splitlines()) == 1  # the note on slots=2 is not shown when nothing runs
    assert not (tmp_path / "r").exists()
