"""`--ray ADDRESS` as a new user gives it, with no Ray cluster running: every bad address is refused in one line
that names the option (or RAY_ADDRESS) and the problem, exit 2, nothing written, nothing started, and soon (the
subprocess timeouts here are far below what Ray's own retries took: minutes). Bad hosts are `.invalid` names
(they never resolve) and 127.0.0.x ports nobody listens on."""
from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from autotuner.backends.ray.address import CLIENT_PORT, parse
from autotuner.errors import UserError

from cli_rig import SLEEP_THEN_SUCCEED, autotune, quiet_env, refused, tree, write_launcher, write_sweep

# Hang guard only: each of these answered in seconds; before they were read here, some took Ray minutes.
WITHIN = 60


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port on 127.0.0.5 that accepts connections and never says a word (not Ray, nor anything else)."""
    with socket.socket() as server:
        server.bind(("127.0.0.5", 0))
        server.listen(16)
        yield server.getsockname()[1]


BAD = [
    ("a" * 5000 + ":6379", "5,005 characters"),
    ("head..svc:6379", "empty label"),
    ("head.invalid..:6379", "empty label"),
    ("x" * 64 + ".invalid:6379", "label of 64 characters"),
    ("head svc.invalid:6379", "holds a space"),
    ("head.invalid:6379\n", "holds '\\n'"),
    ("héad.invalid:6379", "holds 'é'"),
    ("head.invalid:\uff16\uff13\uff17\uff19", "holds '\uff16'"),  # fullwidth digits: int() reads them, no socket does
    ("head.invalid/x:6379", "no path"),
    ("ray://head.invalid:10001/", "no path"),
    ("user@head.invalid:6379", "no path, query or user"),
    ("head.invalid", "names no port"),
    ("head.invalid:0", "not a port number"),
    ("head.invalid:65536", "not a port number"),
    ("head.invalid:-1", "not a port number"),
    ("::1:6379", "in brackets"),
    ("[fe80::zz]:6379", "not an IPv6 address"),
    ("256.0.0.1:6379", "not an IP address"),
    ("-head.invalid:6379", "'-head'"),
    (":6379", "names no host"),
    ("ray://", "names no host"),
    ("http://127.0.0.1:8265", "http:// is not a Ray cluster's address"),
    ("local", "never starts one"),
    ("LOCAL", "never starts one"),
    ("ray://head.invalid", "'head.invalid' does not resolve"),  # Ray client's own port, 10001
    ("head.invalid:6379", "does not resolve"),
    ("127.0.0.1:1", "Connection refused"),
    ("ray://127.0.0.3:1", "Connection refused"),
    ("[::1]:1", "Connection refused"),
]


@pytest.mark.parametrize(("address", "says"), BAD, ids=[a[:30] for a, _ in BAD])
def test_a_bad_ray_address_is_one_line_and_nothing_is_written(tmp_path, address, says):
    spec = write_sweep(tmp_path, range(1), extra="num_gpus: 1")
    done = autotune("run", spec, f"--ray={address}", "-o", tmp_path / "r", environ=quiet_env(), timeout=WITHIN)
    refused(done, "--ray", says)
    assert not (tmp_path / "r").exists()
    assert not any(p.name.startswith("ray") for p in tmp_path.iterdir())


def test_something_that_is_not_ray_listening_is_refused_in_seconds(tmp_path, silent_port):
    spec = write_sweep(tmp_path, range(1), extra="num_gpus: 1")
    for address, what in ((f"127.0.0.5:{silent_port}", "GCS"), (f"ray://127.0.0.5:{silent_port}", "client")):
        done = autotune("run", spec, "--ray", address, "-o", tmp_path / "r", environ=quiet_env(), timeout=WITHIN)
        refused(done, "--ray", "does not answer as", what)
        assert not (tmp_path / "r").exists()


def test_ray_address_from_the_environment_is_named_as_such(tmp_path):
    spec = write_sweep(tmp_path, range(1), extra="num_gpus: 1")
    done = autotune("run", spec, "--ray", "-o", tmp_path / "r", environ=quiet_env(RAY_ADDRESS="head..svc:6379"),
                    timeout=WITHIN)
    refused(done, "RAY_ADDRESS 'head..svc:6379'", "empty label")


@pytest.mark.parametrize("address", ["head..svc:6379", "local", "127.0.0.1:1"])
def test_hosts_and_plan_refuse_a_bad_address_in_one_line(tmp_path, address):
    refused(autotune("hosts", f"--ray={address}", environ=quiet_env(), timeout=WITHIN), "--ray")
    spec = write_sweep(tmp_path, range(1), extra="num_gpus: 1")
    refused(autotune("plan", spec, f"--ray={address}", environ=quiet_env(), timeout=WITHIN), "--ray")


@pytest.mark.parametrize("address", ["127.0.0.1:1", "head..svc:6379", "local", "ray://head.invalid"])
def test_a_refused_resume_leaves_the_sweep_byte_for_byte_as_it_was(tmp_path, address):
    spec = write_sweep(tmp_path, range(2))
    results = tmp_path / "r"
    launcher = write_launcher(tmp_path, SLEEP_THEN_SUCCEED)
    first = autotune("run", spec, "--slots", "1", "--launcher", launcher, "-o", results, "-q",
                     environ=quiet_env(LAUNCH_LOG=tmp_path / "launches.log"))
    assert first.returncode == 0, first.stderr
    assert (results / "runner.lock").exists()  # left by the run: a refused resume must not rewrite it
    before = tree(results)
    refused(autotune("resume", results, f"--ray={address}", environ=quiet_env(), timeout=WITHIN), "--ray")
    assert tree(results) == before


def test_the_grammar_fills_in_ray_clients_port_and_keeps_what_ray_reads():
    assert parse("auto") is None
    assert parse("ray://head.invalid").text == f"ray://head.invalid:{CLIENT_PORT}"  # type: ignore[union-attr]
    assert parse("RAY://[::1]").text == f"ray://[::1]:{CLIENT_PORT}"  # type: ignore[union-attr]
    assert parse("head.invalid:6379").text == "head.invalid:6379"  # type: ignore[union-attr]
    assert parse("10.0.0.1:6379").host == "10.0.0.1"  # type: ignore[union-attr]
    assert parse("svc_name.ns.svc.cluster.local.:6379").port == 6379  # type: ignore[union-attr]
    with pytest.raises(UserError, match=r"^RAY_ADDRESS 'x y': holds a space"):
        parse("x y", "RAY_ADDRESS")
