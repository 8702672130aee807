"""SSH transport against real sshd nodes on loopback (the `ssh_nodes` fixture, tests/sshnodes.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from autotuner.backends import tags
from autotuner.backends.ssh import (
    CommandTimeout,
    HostDown,
    HostKeyError,
    RemoteFiles,
    RemoteStartError,
    SSHPool,
    run_many,
    signal_name,
    signal_tagged,
)
from autotuner.backends.ssh.process import start_command

from sshnodes import descendants


@pytest.fixture
def pool(ssh_nodes):
    with SSHPool(ssh_nodes.config_path) as p:
        yield p


@pytest.fixture
def files(pool):
    remote = RemoteFiles(pool)
    yield remote
    remote.close()


def find_tagged(pool, host, tag) -> list[int]:
    """PIDs on `host` carrying the tag, by the same snippet clean-up uses."""
    return sorted(int(word) for word in pool.run(host, tags.find_command(tag), 30).stdout.split())


def find_tagged_many(pool, hosts, tag, fanout="pool") -> dict:
    results = run_many(pool, hosts, tags.find_command(tag), 30, fanout=fanout)
    return {h: sorted(int(word) for word in r.stdout.split()) for h, r in results.items()}


def _tag(request) -> str:
    return f"test-{request.node.name}-{os.getpid()}".replace("[", "-").replace("]", "")


def _gone(pool, host, tag, timeout=5.0) -> bool:
    deadline = time.monotonic() + timeout
    while find_tagged(pool, host, tag):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _cmdline(pid: int) -> str:
    """The process's command line; "" once it is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read()
    except FileNotFoundError:
        return ""


# --- short commands ------------------------------------------------------------------------------------------

def test_run_on_two_nodes(ssh_nodes, pool):
    for node in ssh_nodes.nodes[:2]:
        result = pool.run(node.name, "echo $SSH_CONNECTION; echo oops >&2; exit 5", timeout=30)
        assert result.exit_code == 5 and not result.ok
        assert result.stdout.split()[2:] == [node.address, str(node.port)]  # it really went to that node
        assert result.stderr == "oops\n"


def test_connection_is_pooled_and_reused(pool):
    for _ in range(4):
        assert pool.run("node-1", "true").ok
    threads = [threading.Thread(target=pool.run, args=("node-1", "true")) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pool.connect_count("node-1") == 1
    assert pool.connect_count("node-2") == 0  # lazily opened: never used


def test_channels_are_bounded(ssh_nodes, request):
    with SSHPool(ssh_nodes.config_path, max_channels=3) as pool:
        results = []
        threads = [threading.Thread(target=lambda: results.append(pool.run("node-2", "sleep 0.3")))
                   for _ in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 10 and all(r.ok for r in results)
        assert pool.peak_channels("node-2") == 3

        # Long processes fill the bound, yet a control command (a clean-up) still gets through.
        tag = _tag(request)
        procs = [pool.start("node-2", ["sleep", "60"], {"AUTOTUNE_TAG": tag}) for _ in range(3)]
        assert pool.run("node-2", "echo still", timeout=10).stdout == "still\n"
        assert pool.peak_channels("node-2") == 4
        assert sorted(find_tagged(pool, "node-2", tag)) == sorted(p.pid for p in procs)
        signal_tagged(pool, ["node-2"], tag, "KILL")
        assert [p.wait(10) for p in procs] == [137, 137, 137]


def test_run_timeout(pool):
    with pytest.raises(CommandTimeout) as err:
        pool.run("node-1", "sleep 5", timeout=0.5)
    assert isinstance(err.value, HostDown) and "timed out" in str(err.value)
    assert pool.run("node-1", "echo ok", timeout=10).stdout == "ok\n"  # the connection is still good


def test_large_output_both_streams(pool):
    result = pool.run("node-1", "head -c 3000000 /dev/zero | tr '\\0' a; head -c 2000000 /dev/zero | tr '\\0' b >&2")
    assert result.ok and len(result.stdout) == 3_000_000 and len(result.stderr) == 2_000_000


# --- long processes -----------------------------------------------------------------------------------------

def test_wait_returns_exit_status(ssh_nodes, pool, tmp_path):
    out, err = tmp_path / "logs" / "out.log", tmp_path / "logs" / "err.log"
    proc = pool.start("node-1", ["sh", "-c", 'echo "$GREETING from $(pwd)"; echo bad >&2; exit 3'],
                      env={"GREETING": "hello world"}, cwd="/tmp", stdout_path=str(out), stderr_path=str(err))
    assert proc.pid > 1
    assert proc.wait(timeout=30) == 3
    assert proc.returncode == 3 and not proc.lost
    assert out.read_text() == "hello world from /tmp\n"  # env exported, cwd honoured, log dir created
    assert err.read_text() == "bad\n"


def test_argv_is_passed_literally(pool, tmp_path):
    nasty = ["a b", "it's", '"q"', "$(touch /tmp/pwned)", "; rm -rf /", "*", "$HOME", "back\\slash", "\n"]
    out = tmp_path / "argv.txt"
    proc = pool.start("node-1", ["printf", "%s|", *nasty], env={"X": "$(id)"}, stdout_path=str(out))
    assert proc.wait(30) == 0
    assert out.read_text() == "".join(a + "|" for a in nasty)


def test_start_own_session_and_signal_group(pool, request):
    tag = _tag(request)
    proc = pool.start("node-1", ["sh", "-c", "sleep 60 & sleep 60; wait"], {"AUTOTUNE_TAG": tag})
    pids = find_tagged(pool, "node-1", tag)
    assert proc.pid in pids and len(pids) == 3
    ids = pool.run("node-1", f"ps -o pgid=,sid= -p {proc.pid}").stdout.split()
    assert ids == [str(proc.pid), str(proc.pid)]  # leader of its own group and session
    assert proc.signal("TERM") is True
    assert proc.wait(30) == 128 + 15
    assert _gone(pool, "node-1", tag)
    # Nothing left to signal, once the orphaned `sleep` is reaped too (a zombie still counts as a group member).
    deadline = time.monotonic() + 20
    while proc.signal("TERM") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.signal("TERM") is False


def test_find_and_kill_by_tag(pool, request):
    # The test nodes share one machine, so a tag is seen from every node: each host gets its own tag here.
    tag = _tag(request)
    procs = {host: pool.start(host, ["sleep", "60"], {"AUTOTUNE_TAG": f"{tag}-{host}"})
             for host in ("node-1", "node-2")}
    assert find_tagged(pool, "node-1", f"{tag}-node-1") == [procs["node-1"].pid]
    assert signal_tagged(pool, ["node-1"], f"{tag}-node-1", "KILL")["node-1"] == [procs["node-1"].pid]
    assert procs["node-1"].wait(30) == 137
    assert find_tagged(pool, "node-1", f"{tag}-node-1") == []
    assert find_tagged(pool, "node-2", f"{tag}-node-2") == [procs["node-2"].pid]  # another tag is never hit
    assert signal_tagged(pool, ["node-2"], f"{tag}-node-2", "TERM")["node-2"] == [procs["node-2"].pid]
    assert procs["node-2"].wait(30) == 143
    assert find_tagged(pool, "node-2", f"{tag}-node-2") == []


def test_find_and_kill_by_tag_on_many_hosts(pool, request):
    tag = _tag(request)
    procs = [pool.start(host, ["sleep", "60"], {"AUTOTUNE_TAG": tag}) for host in ("node-1", "node-2")]
    pids = sorted(p.pid for p in procs)
    # One machine: both nodes see both processes.
    assert find_tagged_many(pool, ["node-1", "node-2"], tag) == {"node-1": pids, "node-2": pids}
    killed = signal_tagged(pool, ["node-1", "node-2"], tag)
    assert sorted(set(killed["node-1"]) | set(killed["node-2"])) == pids
    assert [p.wait(30) for p in procs] == [137, 137]
    assert find_tagged_many(pool, ["node-1", "node-2"], tag) == {"node-1": [], "node-2": []}


def test_start_failure_is_not_host_down(pool):
    with pytest.raises(RemoteStartError) as err:
        pool.start("node-1", ["true"], cwd="/nonexistent/dir")
    assert not isinstance(err.value, HostDown) and "nonexistent" in str(err.value)
    missing = pool.start("node-1", ["/no/such/program"])
    assert missing.wait(30) == 127  # started, then exec failed: a failed run


def test_start_command_validates_env():
    with pytest.raises(ValueError):
        start_command(["true"], {"BAD NAME": "x"}, ".", "/dev/null", "/dev/null")
    with pytest.raises(ValueError):
        start_command([], {}, ".", "/dev/null", "/dev/null")
    assert signal_name(15) == signal_name("SIGTERM") == signal_name("term") == "TERM"


# --- lost nodes ---------------------------------------------------------------------------------------------

def test_node_lost_mid_command(ssh_nodes, pool, request):
    node = ssh_nodes["node-3"]
    tag = _tag(request)
    proc = pool.start("node-3", ["sleep", "60"], {"AUTOTUNE_TAG": tag})
    below = descendants(node.pid)
    assert below  # the session and the command hang below the listener
    node.stop()
    assert proc.wait(timeout=30) is None  # lost, which is not a failed run
    assert proc.lost and proc.returncode is None
    assert not any(_cmdline(pid) for pid in below)
    with pytest.raises(HostDown) as err:
        pool.run("node-3", "true")
    assert "connection refused" in str(err.value)
    assert pool.is_up("node-3", timeout=2) is False
    node.start()
    assert pool.is_up("node-3", timeout=10) is True  # re-opened on the next use
    assert pool.run("node-3", "echo back").stdout == "back\n"
    assert pool.connect_count("node-3") == 2
    assert find_tagged(pool, "node-3", tag) == []  # the lost node took its processes with it


def test_short_command_on_lost_node_raises(ssh_nodes, pool):
    node = ssh_nodes["node-3"]
    assert pool.run("node-3", "true").ok
    errors = []

    def run():
        try:
            pool.run("node-3", "sleep 30")
        except HostDown as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.5)
    node.stop()
    t.join(30)
    assert not t.is_alive() and len(errors) == 1 and errors[0].host == "node-3"


def test_unreachable_address():
    with SSHPool(connect_timeout=2) as pool, pytest.raises(HostDown) as err:
        pool.run("127.0.0.254", "true")  # nothing listens there
    assert err.value.host == "127.0.0.254"


# --- host keys ----------------------------------------------------------------------------------------------

def test_unknown_host_key_is_refused_unless_accepted(ssh_nodes, tmp_path):
    config, known_hosts = ssh_nodes.client_files(tmp_path, known=[ssh_nodes["node-1"]])
    with SSHPool(config) as pool:
        assert pool.run("node-1", "true").ok
        with pytest.raises(HostKeyError) as err:
            pool.run("node-3", "true")
    assert isinstance(err.value, HostDown)
    assert str(err.value) == ("host node-3: unknown host key (not in known_hosts); pass --accept-new-hosts to "
                              "trust it")
    assert ssh_nodes["node-3"].host_key.split()[1] not in known_hosts.read_text()

    with SSHPool(config, accept_new_hosts=True) as pool:
        assert pool.run("node-3", "echo hi").stdout == "hi\n"
    assert ssh_nodes["node-3"].host_key.split()[1] in known_hosts.read_text()  # recorded in the user's file
    with SSHPool(config) as pool:  # and trusted from now on
        assert pool.run("node-3", "true").ok
    # OpenSSH agrees with what was written.
    ssh = subprocess.run(["ssh", "-F", str(config), "node-3", "true"], capture_output=True, text=True, timeout=30)
    assert ssh.returncode == 0, ssh.stderr


def test_changed_host_key_is_refused_even_when_accepting_new(ssh_nodes, tmp_path):
    config, known_hosts = ssh_nodes.client_files(tmp_path)
    wrong = ssh_nodes["node-2"].host_key
    lines = [line.split(" ", 1)[0] + " " + wrong if line.startswith("node-1") or "127.0.0.2" in line.split()[0]
             else line for line in known_hosts.read_text().splitlines()]
    known_hosts.write_text("\n".join(lines) + "\n")
    with SSHPool(config, accept_new_hosts=True) as pool, pytest.raises(HostKeyError) as err:
        pool.run("node-1", "true")
    assert "does not match known_hosts" in str(err.value)


def test_fabric_alone_would_trust_any_key():
    """Why the pool installs its own policy: fabric's Connection auto-adds unknown keys by default."""
    import paramiko
    from fabric import Connection

    assert isinstance(Connection("example.invalid").client._policy, paramiko.AutoAddPolicy)


def test_proxyjump_hops_are_checked_too(ssh_nodes, tmp_path):
    config, known_hosts = ssh_nodes.client_files(tmp_path)
    node1, node2 = ssh_nodes["node-1"], ssh_nodes["node-2"]
    jump = "\n".join(["Host via-1", f"    HostName {node2.address}", f"    Port {node2.port}", "    User root",
                      f"    IdentityFile {node2.client_key_path}", f"    UserKnownHostsFile {known_hosts}",
                      "    ProxyJump node-1", ""])
    config.write_text(jump + config.read_text())
    with SSHPool(config) as pool:
        result = pool.run("via-1", "echo $SSH_CONNECTION")
        assert result.stdout.split()[2] == node2.address
        node1.stop()  # the route goes through node-1: without it, via-1 cannot be reached
        with pytest.raises(HostDown):
            pool.run("via-1", "true")
    node1.start()

    # The hop's key unknown: refused, naming the hop.
    known_hosts.write_text(node2.known_hosts_line() + "\n")
    with SSHPool(config) as pool, pytest.raises(HostKeyError) as err:
        pool.run("via-1", "true")
    assert err.value.host == "node-1"


# --- files --------------------------------------------------------------------------------------------------

def test_sftp_get(ssh_nodes, pool, files, tmp_path):
    remote = tmp_path / "remote"
    pool.run("node-2", f"mkdir -p {remote}/sub && echo metrics > {remote}/m.json && echo deep > {remote}/sub/x")
    local = tmp_path / "local" / "copy.json"
    assert files.get("node-2", str(remote / "m.json"), local) is True
    assert local.read_text() == "metrics\n"
    assert files.get_dir("node-2", str(remote), tmp_path / "tree") == 2
    assert (tmp_path / "tree" / "sub" / "x").read_text() == "deep\n"
    for i in range(3):  # one SFTP session, reused
        files.get("node-2", str(remote / "m.json"), tmp_path / f"c{i}")
    assert pool.connect_count("node-2") == 1
    with pytest.raises(FileNotFoundError):
        files.get("node-2", str(remote / "missing"), tmp_path / "missing")
    assert not list((tmp_path).glob("missing*"))  # no partial file left


def test_shares_filesystem(files, tmp_path):
    # The test nodes are this machine, so they see our files: get() of the same path copies nothing.
    assert files.shares_filesystem("node-1", tmp_path) is True
    assert not list(tmp_path.iterdir())  # the marker is gone
    f = tmp_path / "same.txt"
    f.write_text("x")
    assert files.get("node-1", str(f), f) is False
    assert f.read_text() == "x"


def test_shares_filesystem_false_when_host_sees_other_files(pool, files, tmp_path, monkeypatch):
    # Stand in for another machine: the "remote" reads a different directory than the one we wrote to.
    real_run = pool.run
    monkeypatch.setattr(pool, "run", lambda host, cmd, timeout=None: real_run(host, cmd.replace(str(tmp_path),
                                                                                                  "/nonexistent")))
    assert files.shares_filesystem("node-1", tmp_path) is False


# --- pdsh fan-out -------------------------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("pdsh") is None, reason="pdsh not installed")
def test_pdsh_fanout(ssh_nodes, pool, request):
    ssh_nodes["node-3"].stop()
    results = run_many(pool, ["node-1", "node-2", "node-3"], "echo out-$((6*7)); echo err >&2; exit 4",
                            timeout=30, fanout="pdsh")
    for host in ("node-1", "node-2"):
        assert results[host].exit_code == 4  # each host's own status, not pdsh's summary
        assert results[host].stdout == "out-42\n" and results[host].stderr == "err\n"
    assert isinstance(results["node-3"], HostDown) and "refused" in results["node-3"].reason

    tag = _tag(request)
    procs = [pool.start(h, ["sleep", "60"], {"AUTOTUNE_TAG": tag}) for h in ("node-1", "node-2")]
    pids = sorted(p.pid for p in procs)
    found = find_tagged_many(pool, ["node-1", "node-2"], tag, fanout="pdsh")
    assert found == {"node-1": pids, "node-2": pids}  # one machine: both nodes see both
    killed = signal_tagged(pool, ["node-1", "node-2"], tag, "KILL", fanout="pdsh")
    assert sorted(set(killed["node-1"]) | set(killed["node-2"])) == pids
    assert [p.wait(30) for p in procs] == [137, 137]


# --- the module stays cheap to import -----------------------------------------------------------------------

def test_import_is_cheap():
    code = ("import sys, autotuner.backends.ssh, autotuner.backends.hosts.routing; "
            "print(sorted(m for m in ('fabric', 'paramiko', 'invoke', 'torch', 'deepspeed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
