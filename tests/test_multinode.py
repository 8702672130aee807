"""Sweeps across real sshd nodes on loopback (tests/sshnodes.py): remote launches, multi-node DeepSpeed, a hung
remote run, host keys (a lost node, kill -9 then resume or cancel: tests/test_backend_suite.py, as on every
backend). Every node is this machine under another address, so "nothing left on any node" is checked once, on the
process table here."""
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from autotuner.backends import tags
from autotuner.ledger.store import Ledger

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "benchmarks" / "standin.sh"
TRAIN = ROOT / "experiments" / "train.py"


def autotune(*args, timeout=600, env=None):
    return subprocess.run([sys.executable, "-m", "autotuner.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def hostfile(tmp_path, *nodes_and_slots) -> Path:
    path = tmp_path / "hostfile"
    path.write_text("".join(f"{name} slots={slots} accelerator=cpu\n" for name, slots in nodes_and_slots))
    return path


def sweep(tmp_path, *, n=4, script=STANDIN, extra="", args='["--steps", "7", "--hidden", "64"]') -> Path:
    path = tmp_path / "sweep.hjson"
    path.write_text(f"""{{
  name: s
  script: {script}
  args: {args}
  {extra}
  ds_config: {{train_micro_batch_size_per_gpu: 4, optimizer: {{type: "Adam", params: {{lr: 0.001, torch_adam: true}}}}}}
  space: {{"gradient_accumulation_steps": {list(range(1, n + 1))}}}
}}""")
    return path


def latest(results):
    ledger = Ledger.open(results)
    try:
        return ledger.latest(), ledger.attempts(), ledger.meta().sweep_id
    finally:
        ledger.close()


def leftovers(sweep_id: str) -> list[int]:
    """Processes of this sweep anywhere on this machine (so on every test node)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(e.startswith(f"{tags.TAG_ENV}={sweep_id}.".encode()) for e in environ):
                found.append(int(entry.name))
    return found


def test_single_node_experiments_run_on_both_nodes(ssh_nodes, tmp_path):
    results = tmp_path / "r"
    out = autotune("run", sweep(tmp_path, n=4), "-H", hostfile(tmp_path, ("node-1", 2), ("node-2", 2)),
                   "--ssh-config", ssh_nodes.config_path, "--launcher", f"sh {STANDIN}", "-o", results)
    assert out.returncode == 0, out.stdout + out.stderr
    attempts, _, sweep_id = latest(results)
    assert {a.state for a in attempts} == {"succeeded"}
    assert {host for a in attempts for host in a.slots} == {"node-1", "node-2"}
    assert leftovers(sweep_id) == []


def test_deepspeeds_shared_memory_buffers_are_removed_on_the_nodes_when_a_run_ends(ssh_nodes, tmp_path):
    """DeepSpeed's CPU allreduce leaves a 69 MB file in /dev/shm per rank and never removes it (see
    test_executor's test of this machine's runs): a stand-in launcher run on the node makes one the same way, named
    by the master's address and port, and one of another port that is not ours."""
    launcher = tmp_path / "shm_standin.sh"
    launcher.write_text(f"""while [ $# -gt 0 ]; do case "$1" in --master_port) port=$2;; --master_addr) addr=$2;; esac
shift; done
echo "$addr $port" >> {tmp_path / 'buffers'}
: > "/dev/shm/deepspeed_allreduce_buffer_$(id -u)_${{addr}}_${{port}}_0"
exec sh {STANDIN}
""")
    # port 2: no run of ours has it, nor another file's test of this (an xdist worker may run one at once)
    other = Path(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_2_0")
    other.touch()
    try:
        out = autotune("run", sweep(tmp_path, n=3), "-H", hostfile(tmp_path, ("node-1", 2), ("node-2", 2)),
                       "--ssh-config", ssh_nodes.config_path, "--launcher", f"sh {launcher}", "-o", tmp_path / "r")
        assert out.returncode == 0, out.stdout + out.stderr
        made = [line.split() for line in (tmp_path / "buffers").read_text().splitlines()]
        assert len(made) == 3
        assert not [p for _, p in made if list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{p}_*"))]
        assert other.exists()  # not a run of ours
    finally:
        other.unlink(missing_ok=True)


def test_logs_come_back_over_sftp_from_a_remote_directory(ssh_nodes, tmp_path):
    results, remote = tmp_path / "r", tmp_path / "remote-side"
    out = autotune("run", sweep(tmp_path, n=2), "-H", hostfile(tmp_path, ("node-1", 2)), "--ssh-config",
                   ssh_nodes.config_path, "--launcher", f"sh {STANDIN}", "--remote-dir", remote, "-o", results)
    assert out.returncode == 0, out.stdout + out.stderr
    attempts, _, sweep_id = latest(results)
    for a in attempts:
        copied = json.loads((results / a.name / "metrics.json").read_text())
        assert copied["throughput"] == 1.0
        assert (remote / sweep_id / a.name / "metrics.json").is_file()  # written there, copied here
        assert (results / a.name / "stdout.log").is_file()


def test_a_real_multi_node_deepspeed_run(ssh_nodes, tmp_path):
    results = tmp_path / "r"
    extra = f'num_nodes: 2\n  env: {{GLOO_SOCKET_IFNAME: "lo", PDSH_SSH_ARGS_APPEND: "-F {ssh_nodes.config_path}"}}'
    out = autotune("run", sweep(tmp_path, n=1, script=TRAIN, extra=extra), "-H",
                   hostfile(tmp_path, ("node-1", 1), ("node-2", 1)), "--ssh-config", ssh_nodes.config_path,
                   "--timeout", "300", "-o", results)
    assert out.returncode == 0, out.stdout + out.stderr
    (attempt,), _, sweep_id = latest(results)
    assert attempt.slots == {"node-1": [0], "node-2": [0]}
    log = (results / attempt.name / "stdout.log").read_text() + (results / attempt.name / "stderr.log").read_text()
    # pdsh prefixes each node's lines: both nodes ran a rank of the same job (world size 2)
    assert "node-1: " in log and "node-2: " in log
    # each node's launcher saw its rank end: well, or (gloo's threads, at times) aborted at exit after measuring,
    # which the product counts as measured (outcome.aborted_at_exit)
    ended = re.findall(r"(node-\d): .*(exits successfully|exits with return code = -6)", log)
    assert sorted(node for node, _ in ended) == ["node-1", "node-2"], log[-3000:]
    assert all(how == "exits successfully" for _, how in ended) or "aborted at exit" in (attempt.detail or "")
    assert json.loads((results / attempt.name / "metrics.json").read_text())["throughput"] > 0
    assert leftovers(sweep_id) == []


def test_a_hung_remote_experiment_is_ended_by_timeout_with_nothing_left(ssh_nodes, tmp_path):
    hang = tmp_path / "hang.sh"
    hang.write_text("#!/bin/sh\nsleep 1000 &\nsleep 1000\n")  # a child too: the whole tree must go
    results = tmp_path / "r"
    out = autotune("run", sweep(tmp_path, n=1), "-H", hostfile(tmp_path, ("node-2", 1)), "--ssh-config",
                   ssh_nodes.config_path, "--launcher", f"sh {hang}", "--timeout", "3", "--grace", "1",
                   "-o", results, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    (attempt,), _, sweep_id = latest(results)
    assert (attempt.state, attempt.reason) == ("timed_out", "timeout")
    assert leftovers(sweep_id) == []


def test_an_unknown_host_key_is_refused_unless_accepted(ssh_nodes, tmp_path):
    config, known_hosts = ssh_nodes.client_files(tmp_path / "client", known=[ssh_nodes["node-1"]])
    hosts = hostfile(tmp_path, ("node-2", 1))
    probe = autotune("hosts", "-H", hosts, "--ssh-config", config, "--json")
    assert probe.returncode == 1
    (report,) = json.loads(probe.stdout)
    assert not report["reachable"] and "unknown host key" in report["reason"]

    refused = autotune("run", sweep(tmp_path, n=1), "-H", hosts, "--ssh-config", config, "--launcher",
                       f"sh {STANDIN}", "-o", tmp_path / "r1")
    assert refused.returncode == 2 and "no host of the sweep answers" in refused.stderr
    assert "node-2: unknown host key" in refused.stderr
    assert "node-2" not in known_hosts.read_text()
    assert not (tmp_path / "r1").exists()  # refused before its lock: the directory `run` made is gone again

    accepted = autotune("run", sweep(tmp_path, n=1), "-H", hosts, "--ssh-config", config, "--accept-new-hosts",
                        "--launcher", f"sh {STANDIN}", "-o", tmp_path / "r2")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert known_hosts.read_text().count("\n") == 2  # node-2's key recorded


def test_a_node_down_at_start_is_reported_and_left_out(ssh_nodes, tmp_path):
    ssh_nodes["node-3"].stop()
    results = tmp_path / "r"
    out = autotune("run", sweep(tmp_path, n=3), "-H", hostfile(tmp_path, ("node-1", 1), ("node-3", 1)),
                   "--ssh-config", ssh_nodes.config_path, "--launcher", f"sh {STANDIN}", "-o", results)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "host node-3" in out.stderr and "left out" in out.stderr
    attempts, _, _ = latest(results)
    assert all(a.state == "succeeded" and list(a.slots) == ["node-1"] for a in attempts)


def test_the_watcher_announces_a_host_that_comes_back(ssh_nodes):
    from autotuner.backends.ssh import SSHPool, host_watcher
    from autotuner.core import HostBack

    posted = []
    came_back = threading.Event()
    with SSHPool(ssh_nodes.config_path) as pool:
        ssh_nodes["node-2"].stop()
        watcher = host_watcher(pool, lambda event: (posted.append(event), came_back.set()), interval=0.5)
        watcher.watch("node-2")
        time.sleep(1.5)
        assert posted == []  # still down: nothing announced
        ssh_nodes["node-2"].start()
        assert came_back.wait(30)
        watcher.close()
    assert posted == [HostBack("node-2")]


def test_clean_up_fans_out_over_pdsh_to_every_node(ssh_nodes):
    import shutil

    from autotuner.backends.ssh import SSHPool, end_tagged_remote

    assert shutil.which("pdsh"), ".ci/setup-tests installs pdsh"
    tag = f"fanout{time.time_ns()}.e.1"
    with SSHPool(ssh_nodes.config_path) as pool:
        for host in ("node-1", "node-2"):
            pool.start(host, ["sleep", "300"], {tags.TAG_ENV: tag}, "/")
        deadline = time.monotonic() + 30  # ssh start-up on a loaded machine
        while len(tags.find_tagged(tag)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(tags.find_tagged(tag)) >= 2
        end_tagged_remote(pool, ["node-1", "node-2"], tag)
    assert tags.find_tagged(tag) == []


def test_hosts_table_shows_each_node_up_or_why_not(ssh_nodes, tmp_path):
    ssh_nodes["node-3"].stop()
    out = autotune("hosts", "-H", hostfile(tmp_path, ("node-1", 2), ("node-3", 4)), "--ssh-config",
                   ssh_nodes.config_path)
    assert out.returncode == 1, out.stdout + out.stderr  # not every host answers
    rows = {line.split("│")[1].strip(): line for line in out.stdout.splitlines() if line.count("│") > 3}
    assert "up" in rows["node-1"] and "none" in rows["node-1"]  # a CPU host: no GPU, not an error
    assert "down" in rows["node-3"]
    assert rows["node-1"].split("│")[2].strip() == "2" and rows["node-3"].split("│")[2].strip() == "4"
