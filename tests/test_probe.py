"""Host probe against real sshd nodes (the `ssh_nodes` fixture), and its parsing on canned output."""
from __future__ import annotations

import json
import re

import pytest

import autotuner
from autotuner.backends.ssh import HostReport, SSHPool, probe_hosts
from autotuner.backends.ssh.probe import parse_nvidia_smi, parse_probe, probe_script
from autotuner.gpu.nvml import Gpu

import fake_nvidia_smi as smi


def test_probe_two_up_one_down(ssh_nodes):
    ssh_nodes["node-3"].stop()
    with SSHPool(ssh_nodes.config_path) as pool:
        reports = probe_hosts(["node-1", "node-2", "node-3"], pool, timeout=60)
    assert [r.host for r in reports] == ["node-1", "node-2", "node-3"]
    for report in reports[:2]:
        assert report.reachable and report.reason is None
        assert report.gpus == [] and report.gpu_error is None  # a CPU host: no GPU is normal
        assert re.fullmatch(r"3\.\d+\.\d+", report.python)
        assert report.loadavg is not None and all(x >= 0 for x in report.loadavg)
        assert report.cpus and report.cpus >= 1
        # DeepSpeed's version if that python has it, else a note saying so; never an import of deepspeed.
        assert report.deepspeed is not None or any("deepspeed" in n for n in report.notes)
    down = reports[2]
    assert not down.reachable and "connection refused" in down.reason
    assert down.gpus == [] and down.python is None
    table = json.loads(json.dumps([r.to_json() for r in reports]))
    assert [row["reachable"] for row in table] == [True, True, False]


def test_hosts_check_probes_a_hostfile_through_the_registry(ssh_nodes, tmp_path):
    """`autotune hosts` of a hostfile as the API gives it: the backend the options name (none: SSH hosts)."""
    ssh_nodes["node-2"].stop()
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-1 slots=2\nnode-2 slots=1\n")
    check = autotuner.hosts_check(hostfile, autotuner.Ssh(ssh_nodes.config_path))
    assert check.title == f"hosts of {hostfile}" and not check.ok  # a host down: `autotune hosts` exits 1
    assert [row[:2] for row in check.rows] == [("node-1", "2"), ("node-2", "1")] and check.usable == (True, False)
    assert [(h["host"], h["reachable"], h["slots"]) for h in check.json] == [("node-1", True, 2), ("node-2", False, 1)]
    table = autotuner.render_hosts_check(check, "table")
    assert "node-1" in table and "down: " in table and "connection refused" in table
    assert json.loads(autotuner.render_hosts_check(check, "json"))[1]["reason"] == check.json[1]["reason"]


def test_probe_shows_a_nodes_gpus_from_its_nvidia_smi(ssh_nodes):
    """A node with GPUs: the FAKE nvidia-smi on its PATH stands in for the real one (same query, same output)."""
    node = ssh_nodes["node-1"]
    smi.install(node.bin, [smi.gpu(free_gib=10), smi.gpu(free_gib=79)])
    try:
        with SSHPool(ssh_nodes.config_path) as pool:
            report, = probe_hosts(["node-1"], pool, timeout=60)
    finally:
        smi.uninstall(node.bin)
    assert report.gpu_error is None and {g.name for g in report.gpus} == {"NVIDIA A100-SXM4-80GB"}
    assert [(g.index, g.memory_free, g.memory_total) for g in report.gpus] == [
        (0, 10 * 2**30, 80 * 2**30), (1, 79 * 2**30, 80 * 2**30)]


def test_probe_uses_pooled_connections(ssh_nodes):
    with SSHPool(ssh_nodes.config_path) as pool:
        probe_hosts(["node-1", "node-2"], pool)
        probe_hosts(["node-1", "node-2"], pool)
        assert pool.connect_count("node-1") == pool.connect_count("node-2") == 1


SMI = ["0, NVIDIA H100 80GB HBM3, 81000, 81559, GPU-aaaa",
       "1, NVIDIA H100 80GB HBM3, 1024, 81559, GPU-bbbb"]


def test_parse_nvidia_smi():
    gpus = parse_nvidia_smi(SMI)
    assert gpus[0] == Gpu(0, "NVIDIA H100 80GB HBM3", 81559 * 2**20, 81000 * 2**20, "GPU-aaaa")
    assert gpus[1].memory_free == 1024 * 2**20
    assert parse_nvidia_smi(["2, Some, Odd, Name, 10, 20, GPU-c"])[0].name == "Some, Odd, Name"
    with pytest.raises(ValueError):
        parse_nvidia_smi(["NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."])


def _canned(gpu_lines, gpu_rc=0, ds_lines=("0.19.8",), ds_rc=0) -> str:
    mark = "==autotune-probe"
    parts = [("loadavg", ["0.50 0.25 0.10 1/123 456"], 0), ("cpus", ["16"], 0), ("python", ["3.11.7"], 0),
             ("deepspeed", list(ds_lines), ds_rc), ("gpus", list(gpu_lines), gpu_rc)]
    out = ["motd noise from a login script"]
    for name, lines, rc in parts:
        out += [f"{mark} {name}", *lines, f"{mark}-rc {rc}"]
    return "\n".join(out) + "\n"


def test_parse_probe_gpu_host():
    report = parse_probe("gpu-1", _canned(SMI))
    assert report.reachable and len(report.gpus) == 2 and {g.name for g in report.gpus} == {"NVIDIA H100 80GB HBM3"}
    assert report.loadavg == (0.5, 0.25, 0.1) and report.cpus == 16
    assert report.python == "3.11.7" and report.deepspeed == "0.19.8" and report.notes == []


def test_parse_probe_broken_driver_and_no_deepspeed():
    report = parse_probe("gpu-2", _canned(["NVIDIA-SMI has failed because it couldn't communicate"], gpu_rc=9,
                                          ds_lines=["importlib.metadata.PackageNotFoundError: deepspeed"],
                                          ds_rc=1))
    assert report.gpus == [] and "exit 9" in report.gpu_error  # not the same as a CPU host
    assert report.deepspeed is None and report.notes == ["deepspeed: not installed for this python"]


def test_parse_probe_cpu_host():
    report = parse_probe("cpu-1", _canned(["none"]))
    assert report.gpus == [] and report.gpu_error is None


def test_probe_script_quotes_python():
    assert "'/opt/my env/bin/python3' -c" in probe_script("/opt/my env/bin/python3")


def test_to_json_roundtrips():
    report = HostReport("h", reachable=False, reason="connection refused")
    assert json.loads(json.dumps(report.to_json()))["reason"] == "connection refused"
