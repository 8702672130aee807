"""A refused `cancel`, `resume`, `status` or `report` of a sweep leaves its results directory byte for byte as it
was, whichever backend refuses: every file hashed before and after. The clusters here are stand-ins that refuse
as real ones do (a Ray address nobody answers at, a Slurm sweep resumed with no allocation, SSH hosts that do
not resolve, a hostfile removed), so each test is a second or two."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

import autotuner
from autotuner.backends.cluster import Cluster
from autotuner.ledger.store import Ledger
from autotuner.states import State

from cli_rig import autotune, quiet_env, refused, tree, write_sweep

WITHIN = 60  # hang guard only: each refusal here comes in seconds


def prepared(tmp_path: Path, cluster: Cluster, left_running: bool = True) -> Path:
    """A sweep of two experiments on `cluster`, as a dead runner left it: the first one running (its attempt
    started and recorded, its runner gone), and a runner.lock of that runner's."""
    spec = write_sweep(tmp_path, range(2))
    results = autotuner.prepare(autotuner.load_sweep([spec]), cluster, tmp_path / "r", launcher=["true"])
    with Ledger.open(results) as ledger:
        if left_running:
            first = ledger.experiments()[0].name
            ledger.start(first, 1, slots={next(iter(cluster.slots)): [0]}, tag="autotune-gone-0",
                         dir=str(results / first / "attempt-1"), at=time.time())
    (results / "runner.lock").write_text("999999999\n")  # the dead runner's: a refusal must not rewrite it
    return results


def cpu_slots() -> Cluster:
    return autotuner.load_cluster(slots=2)


def ssh_hosts() -> Cluster:
    """Two hosts that never resolve (.invalid): lost, as far as SSH can tell."""
    hosts = ("n1.invalid", "n2.invalid")
    return Cluster({h: (0,) for h in hosts}, {h: 1 for h in hosts}, accelerator="cpu")


def test_a_cancel_refused_by_an_unreachable_ray_cluster_writes_neither_its_request_nor_the_lock(tmp_path):
    """With no runner alive, cancel ends what the dead one left running through Ray: a cluster that does not
    answer refused it only after the request was in the ledger and runner.lock rewritten."""
    results = prepared(tmp_path, cpu_slots())
    with Ledger.open(results) as ledger:
        ledger.set_meta("backend", {"kind": "ray", "data": {"address": "127.0.0.1:1", "nodes": {}}})
    before = tree(results)
    for command in (["cancel", results, "s_x1"], ["resume", results]):
        refused(autotune(*command, environ=quiet_env(), timeout=WITHIN), "no Ray cluster answers at 127.0.0.1:1")
        assert tree(results) == before, command
    for command in ("status", "report"):  # readers never reach the cluster
        done = autotune(command, results, environ=quiet_env(), timeout=WITHIN)
        assert done.returncode == 0, done.stderr
        assert tree(results) == before, command
    with Ledger.open(results) as ledger:
        assert not ledger.take_requests()


def test_a_cancel_with_nothing_left_running_needs_no_cluster(tmp_path):
    """Only what a dead runner left running is ended through the cluster: with nothing running, a Ray sweep whose
    cluster is gone is cancelled in its ledger."""
    results = prepared(tmp_path, cpu_slots(), left_running=False)
    with Ledger.open(results) as ledger:
        ledger.set_meta("backend", {"kind": "ray", "data": {"address": "127.0.0.1:1", "nodes": {}}})
    done = autotune("cancel", results, environ=quiet_env(), timeout=WITHIN)
    assert done.returncode == 0, done.stderr
    with Ledger.open(results) as ledger:
        assert {a.state for a in ledger.latest()} == {State.CANCELLED}


def test_a_slurm_sweep_resumed_without_an_allocation_is_refused_before_the_lock(tmp_path):
    """The allocation was checked at `attach`, holding the lock: runner.lock rewritten (and an older ledger
    migrated) before the refusal."""
    results = prepared(tmp_path, cpu_slots())
    with Ledger.open(results) as ledger:
        ledger.set_meta("backend", {"kind": "slurm", "data": {"job": "4242", "owned": False}})
    before = tree(results)
    with pytest.raises(autotuner.UserError, match="this sweep runs inside Slurm: resume it with --slurm"):
        autotuner.execute(results, autotuner.Options())
    assert tree(results) == before


def test_a_resume_whose_ssh_hosts_are_all_lost_is_refused_before_the_lock(tmp_path):
    """No host answers: refused at `ready`, after the lock, the adoption of what was left running and the
    requeue had all been written."""
    results = prepared(tmp_path, ssh_hosts())
    before = tree(results)
    refused(autotune("resume", results, "--events", tmp_path / "events.jsonl", environ=quiet_env(),
                     timeout=WITHIN), "hostfile", "no host of the sweep answers")
    assert tree(results) == before and not (tmp_path / "events.jsonl").exists()


@pytest.mark.parametrize("gone", ["missing", "not a file"])
def test_a_resume_whose_hostfile_is_gone_is_one_line_naming_it(tmp_path, gone):
    """The sweep's other hosts run DeepSpeed's launcher from its hostfile: gone, the resume is refused at once,
    naming it (it was read only once experiments were dispatched: a traceback, after the lock)."""
    results = prepared(tmp_path, ssh_hosts())
    (results / "hostfile").unlink()
    if gone == "not a file":
        (results / "hostfile").mkdir()
    before = tree(results)
    refused(autotune("resume", results, environ=quiet_env(), timeout=WITHIN), f"r/hostfile: {gone}: it lists")
    assert tree(results) == before


def multi_node_here(tmp_path: Path, states: dict[str, State] | None = None) -> Path:
    """A sweep of two two-node experiments on this machine's two names (localhost, 127.0.0.1), the first one
    ended in `states`' state where given, and a dead runner's runner.lock."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    spec = write_sweep(tmp_path, range(2), extra="num_nodes: 2")
    results = autotuner.prepare(autotuner.load_sweep([spec]), autotuner.load_cluster(hostfile=hostfile),
                                tmp_path / "r", launcher=["true"])
    with Ledger.open(results) as ledger:
        for name, state in (states or {}).items():
            ledger.start(name, 1, slots={"localhost": [0], "127.0.0.1": [0]}, tag=f"gone.{name}.1",
                         dir=str(results / name / "attempt-1"), at=time.time())
            ledger.finish(name, 1, state, time.time(), exit_code=1)
    (results / "runner.lock").write_text("999999999\n")
    return results


@pytest.mark.parametrize("asked", [(), ("--placement", "spread"), ("--retry-failed",)])
def test_a_resume_whose_multi_node_experiments_cannot_run_here_is_refused_before_the_lock(tmp_path, silent_ssh,
                                                                                        asked):
    """No ssh answers this machine's names and every experiment left needs two nodes: `admit` refused it only
    once the lock was held, runner.lock rewritten and the placement asked for recorded; now before the lock,
    judging the queue as it will be (the failed one with --retry-failed, queued again)."""
    results = multi_node_here(tmp_path, {"s_x0": State.FAILED})
    before = tree(results)
    refused(autotune("resume", results, "--ssh-config", silent_ssh, *asked, environ=quiet_env(), timeout=WITHIN),
            "r/hostfile", "no experiment can run", "over ssh")
    assert tree(results) == before, asked


def test_a_new_multi_node_sweep_that_cannot_run_here_leaves_nothing(tmp_path, silent_ssh):
    """`run` refused by the same admission left the results directory it had made (its hostfile, its ledger of
    queued experiments, the parents it created): a refused command writes nothing."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    spec = write_sweep(tmp_path, range(2), extra="num_nodes: 2")
    (tmp_path / "results").mkdir()  # there before: it stays
    before = tree(tmp_path)
    refused(autotune("run", spec, "-H", hostfile, "--ssh-config", silent_ssh, "--launcher", "true", "-q",
                     "--results", tmp_path / "results" / "deep" / "r", "--events", tmp_path / "events.jsonl",
                     environ=quiet_env(), timeout=WITHIN),
            "no experiment can run", "over ssh")
    assert tree(tmp_path) == before  # the --events file outside the results directory too
    assert [p.name for p in (tmp_path / "results").iterdir()] == []
    out = autotune("run", spec, "-H", hostfile, "--ssh-config", silent_ssh, "--launcher", "true", "-q",
                   "--results", tmp_path / "results" / "r", environ=quiet_env(), timeout=WITHIN)
    assert "results/r/" not in out.stderr, out.stderr  # the message names no file of the directory withdrawn
