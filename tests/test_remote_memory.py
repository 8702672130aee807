"""GPU memory of SSH hosts for the memory placement (ssh/memory.py): the reader with a fake clock and a fake
transport (what the placement sees, when hosts are read, that a reading never blocks the placement), the core
placing again on `MemoryRead`, and sweeps on real sshd nodes whose FAKE nvidia-smi (tests/fake_nvidia_smi.py, on
the node's PATH) reports chosen free memory."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from autotuner.backends.ssh import SSHPool
from autotuner.backends.ssh.free_memory import RemoteMemory, nvidia_smi
from autotuner.core import Finished, MemoryRead, MemoryRecord, Queued, Reservation, Run, Scheduler, SlotPool
from autotuner.core.outcome import Outcome
from autotuner.core.placement import placement_named
from autotuner.ledger.store import Ledger
from autotuner.states import State

import fake_nvidia_smi as smi
from helpers import experiment

GiB = 1 << 30
OK = Outcome(State.SUCCEEDED, metrics={"throughput": 1.0})
ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "benchmarks" / "standin.sh"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Transport:
    """A fake transport: each host's GPUs as {index: (free, total)} (None: cannot be read); records each read."""

    def __init__(self, hosts: dict) -> None:
        self.hosts = hosts
        self.reads: list[str] = []
        self.threads: set[str] = set()

    def __call__(self, host: str):
        self.reads.append(host)
        self.threads.add(threading.current_thread().name)
        return self.hosts.get(host)


def run_on(host: str, ids: tuple[int, ...], name: str = "x") -> Run:
    return Run(experiment(name), 1, Reservation(((host, ids),)), f"sid.{name}.1", Path("/r") / name)


def reader(transport, slots=None, sizes=None, **options):
    clock = Clock()
    memory = RemoteMemory(transport, slots or {"w0": [0, 1], "w1": [0, 1]}, sizes, clock=clock, **options)
    return memory, clock


# --- the reader, with a fake clock and transport -----------------------------------------------------------------
def test_the_placement_sees_the_latest_reading_and_never_reads_itself():
    transport = Transport({"w0": {0: (10 * GiB, 80 * GiB), 1: (70 * GiB, 80 * GiB)}, "w1": None})
    memory, _ = reader(transport, sizes={"w1": 80 * 10**9})
    assert memory.free("w0") is None and transport.reads == []  # not read yet: not measured
    memory.read_now()
    assert sorted(transport.reads) == ["w0", "w1"]
    assert memory.free("w0") == {0: 10 * GiB, 1: 70 * GiB}
    assert memory.free("w1") is None  # its reading failed: judged by its type's size, as an unmeasured host
    assert memory.free("elsewhere") is None
    for _ in range(100):
        memory.free("w0")
    assert len(transport.reads) == 2  # looking is not reading


def test_a_host_whose_readings_stop_answering_is_judged_by_its_stated_size_after_the_bound():
    transport = Transport({"w0": {0: (10 * GiB, 80 * GiB), 1: (70 * GiB, 80 * GiB)}})
    memory, clock = reader(transport, {"w0": [0, 1, 2]}, {"w0": 80 * 10**9}, stale_after=60)
    memory.read_now()
    # GPU 2 is not among what nvidia-smi shows: the stated size stands in for it
    assert memory.free("w0") == {0: 10 * GiB, 1: 70 * GiB, 2: 80 * 10**9}
    transport.hosts["w0"] = None  # its driver fails from now on
    clock.now += 30
    memory.read_now()
    assert memory.free("w0") == {0: 10 * GiB, 1: 70 * GiB, 2: 80 * 10**9}  # answered 30 s ago: still used
    clock.now += 31
    assert memory.free("w0") is None  # no answer for 61 s: the placement judges it by its type's size


def test_a_gpu_that_a_run_of_the_sweep_holds_keeps_the_reading_from_before_the_run():
    """A reading taken while our run held GPU 0 shows our own run's memory, gone once it ends: it is not used for
    GPU 0, which keeps its value from before, however long our runs hold it. When the run ends the host is read
    again (once its period is up), and that reading counts."""
    free = {0: (79 * GiB, 80 * GiB), 1: (79 * GiB, 80 * GiB)}
    transport = Transport({"w0": free})
    memory, clock = reader(transport, {"w0": [0, 1]}, period=5)
    memory.read_now()
    run = run_on("w0", (0,))
    memory.note("started", run, None)
    free[0], free[1] = (9 * GiB, 80 * GiB), (50 * GiB, 80 * GiB)  # our run took 70 GiB; another user 29 GiB
    clock.now += 10
    memory.read_now()
    assert memory.free("w0") == {0: 79 * GiB, 1: 50 * GiB}
    clock.now += 300  # our runs keep GPU 0 busy for long: it keeps what other users held before, not its size
    memory.read_now()
    assert memory.free("w0") == {0: 79 * GiB, 1: 50 * GiB}
    free[0] = (78 * GiB, 80 * GiB)
    memory.note("finished", run, OK)
    assert memory._due_in(clock.now) == 5.0 and memory.round() == []
    clock.now += 5
    assert memory.round() == ["w0"] and memory.free("w0") == {0: 78 * GiB, 1: 50 * GiB}


def test_a_reading_asked_for_before_a_run_was_placed_still_counts_for_its_gpu():
    """The order of a race: the reading is asked for, a run is placed on GPU 0 before it comes back. It shows GPU
    0 before the run allocated; the pool holds GPU 0 for the run until it ends, so that reading only ever
    speaks for GPU 0 once the run (and its memory) is gone."""
    gate = threading.Event()
    released = threading.Event()
    values = {0: (79 * GiB, 80 * GiB), 1: (79 * GiB, 80 * GiB)}

    def slow(host):
        released.set()
        gate.wait(5)
        return values

    memory, _ = reader(slow, {"w0": [0, 1]})
    worker = threading.Thread(target=memory.read_now)
    worker.start()
    assert released.wait(5)
    memory.note("started", run_on("w0", (0,)), None)
    gate.set()
    worker.join(5)
    assert memory.free("w0") == {0: 79 * GiB, 1: 79 * GiB}


def test_hosts_looked_at_or_where_runs_ended_are_read_every_period_and_no_more_often():
    transport = Transport({"w0": {0: (10 * GiB, 80 * GiB)}, "w1": {0: (79 * GiB, 80 * GiB)}})
    posted = []
    memory, clock = reader(transport, {"w0": [0], "w1": [0]}, period=5)
    memory._post = posted.append
    memory.read_now()
    assert memory._due_in(clock.now) is None and memory.round() == []  # nothing waits: nothing is read
    memory.free("w0")  # a placement looked at w0: something waits for memory there
    assert memory._due_in(clock.now) == 5.0 and memory.round() == []
    clock.now += 5
    assert memory.round() == ["w0"] and posted == [MemoryRead(("w0",))]
    memory.free("w0")
    for name in ("a", "b", "c"):  # short runs ending there: still one reading per period
        memory.note("finished", run_on("w0", (0,), name), OK)
    clock.now += 2
    assert memory._due_in(clock.now) == 3.0 and memory.round() == []
    clock.now += 3
    assert memory.round() == ["w0"]
    assert sorted(transport.reads[:2]) == ["w0", "w1"] and transport.reads[2:] == ["w0", "w0"]


def test_a_lost_host_is_not_read_until_it_is_back():
    transport = Transport({"w0": {0: (79 * GiB, 80 * GiB)}})
    memory, clock = reader(transport, {"w0": [0]})
    memory.note("host_down", "w0", None)
    memory.read_now()
    memory.free("w0")
    clock.now += 60
    assert transport.reads == [] and memory._due_in(clock.now) is None
    memory.note("host_up", "w0", None)
    assert memory.round() == ["w0"] and memory.free("w0") == {0: 79 * GiB}


def test_the_reading_runs_on_the_readers_thread_and_the_placement_never_waits_for_it():
    gate = threading.Event()
    entered = threading.Event()
    threads = []

    def blocked(host):
        threads.append(threading.current_thread().name)
        entered.set()
        gate.wait(10)
        return {0: (79 * GiB, 80 * GiB)}

    memory = RemoteMemory(blocked, {"w0": [0]}, {"w0": 80 * 10**9}, period=0.01)
    posted = []
    memory.start(posted.append)
    try:
        memory.free("w0")  # looked at, never read: the reader's thread reads it now
        assert entered.wait(5)
        started = time.perf_counter()
        for _ in range(1000):
            assert memory.free("w0") is None  # still unread: not measured, and no wait for the reading
        assert time.perf_counter() - started < 1.0  # (a wait would be the 10 s the transport holds)
        gate.set()
        deadline = time.monotonic() + 5
        while not posted and time.monotonic() < deadline:
            time.sleep(0.01)
        assert posted and posted[0] == MemoryRead(("w0",)) and memory.free("w0") == {0: 79 * GiB}
    finally:
        gate.set()
        memory.close()
    assert threads and all(name.startswith("gpu-memory") for name in threads)
    assert threading.current_thread().name not in threads


# --- the core places again on MemoryRead ------------------------------------------------------------------------
def test_the_scheduler_places_again_when_new_readings_come():
    """Our run keeps w1 busy; the experiment that needs 30 GiB waits, w0's GPU being another user's. When the
    reader finds it free (and posts MemoryRead), the next step places it there, with no run of ours ending."""
    values = {"w0": {0: (10 * GiB, 80 * GiB)}, "w1": {0: (79 * GiB, 80 * GiB)}}
    memory, _ = reader(Transport(values), {"w0": [0], "w1": [0]}, {"w0": 80 * 10**9, "w1": 80 * 10**9})
    memory.read_now()
    placement = placement_named("memory", {"w0": "A100-80GB", "w1": "A100-80GB"},
                                {"w0": 80 * 10**9, "w1": 80 * 10**9}, memory.free)
    exps = [replace(experiment(f"big{i}"), gpu_memory=30 * GiB) for i in range(2)]
    s = Scheduler(MemoryRecord(), SlotPool({"w0": [0], "w1": [0]}), "sid", Path("/r"), "throughput",
                  placement=placement)
    s.record.add_experiments(exps, 0.0)
    s.submit(Queued(e, 1) for e in exps)
    (first,) = s.step([], 0.0).start
    assert first.reservation.hosts == ("w1",)
    assert s.step([], 1.0).start == []
    values["w0"][0] = (79 * GiB, 80 * GiB)
    memory.read_now(["w0"])
    (second,) = s.step([MemoryRead(("w0",))], 2.0).start
    assert second.reservation.hosts == ("w0",)
    s.step([Finished(first, OK, 3.0), Finished(second, OK, 3.0)], 3.0)
    assert s.done


# --- on real sshd nodes, with a fake nvidia-smi -------------------------------------------------------------------
@pytest.fixture
def fake_gpus(ssh_nodes):
    """Each node's FAKE nvidia-smi (installed by the test), removed afterwards."""
    yield ssh_nodes
    for node in ssh_nodes:
        smi.uninstall(node.bin)


def autotune(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "autotuner.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def sweep_files(tmp_path: Path, n: int) -> tuple[Path, Path]:
    spec = tmp_path / "sweep.hjson"
    spec.write_text(f"""{{
  name: s
  script: {STANDIN}
  gpu_memory: "30GiB"
  ds_config: {{train_micro_batch_size_per_gpu: 1}}
  space: {{gradient_accumulation_steps: {list(range(1, n + 1))}}}
}}""")
    hosts = tmp_path / "hostfile"
    hosts.write_text("node-1 slots=2 accelerator=cpu gpu=A100-80GB\nnode-2 slots=2 accelerator=cpu gpu=A100-80GB\n")
    return spec, hosts


def hosts_used(results: Path) -> dict[str, set[str]]:
    with Ledger.open(results) as ledger:
        return {a.name: set(a.slots) for a in ledger.latest() if a.state == "succeeded"}


def test_the_reader_asks_nvidia_smi_over_the_pooled_connection(fake_gpus):
    node = fake_gpus["node-1"]
    smi.install(node.bin, [smi.gpu(free_gib=10), smi.gpu(free_gib=70.5)])
    with SSHPool(fake_gpus.config_path) as pool:
        read = nvidia_smi(pool)
        assert read("node-1") == {0: (10 * GiB, 80 * GiB), 1: (int(70.5 * 1024) << 20, 80 * GiB)}
        assert read("node-2") is None  # no nvidia-smi there: a CPU host, not measured
        smi.set_gpus(node.bin, [smi.gpu()], failing=True)
        assert read("node-1") is None  # the driver fails: not measured, never an error
        assert pool.connect_count("node-1") == 1
    assert len(smi.calls(node.bin)) == 2


def test_experiments_that_need_memory_go_only_to_the_host_whose_gpus_hold_it(fake_gpus, tmp_path):
    """node-1's two A100s are mostly used by another user's processes (10 GiB free), node-2's are free: each
    experiment needs 30 GiB, so every run goes to node-2, though the hostfile states one type for both and pack
    (fewest free slots, then hostfile order) would start on node-1."""
    smi.install(fake_gpus["node-1"].bin, [smi.gpu(free_gib=10), smi.gpu(free_gib=10)])
    smi.install(fake_gpus["node-2"].bin, [smi.gpu(free_gib=79), smi.gpu(free_gib=79)])
    spec, hosts = sweep_files(tmp_path, 4)
    out = autotune("run", spec, "-H", hosts, "--ssh-config", fake_gpus.config_path, "--launcher", f"sh {STANDIN}",
                   "--placement", "memory", "-o", tmp_path / "r")
    assert out.returncode == 0, out.stdout + out.stderr
    used = hosts_used(tmp_path / "r")
    assert len(used) == 4 and set().union(*used.values()) == {"node-2"}
    assert smi.calls(fake_gpus["node-1"].bin) and smi.calls(fake_gpus["node-2"].bin)  # both were read


def test_a_host_whose_reading_fails_is_judged_by_its_stated_type_size(fake_gpus, tmp_path):
    """node-1's nvidia-smi fails (its driver): it is judged by its stated type, A100-80GB, which holds 30 GiB;
    node-2 reads as mostly used by another user. Every run goes to node-1."""
    smi.install(fake_gpus["node-1"].bin, [smi.gpu(), smi.gpu()], failing=True)
    smi.install(fake_gpus["node-2"].bin, [smi.gpu(free_gib=10), smi.gpu(free_gib=10)])
    spec, hosts = sweep_files(tmp_path, 3)
    out = autotune("run", spec, "-H", hosts, "--ssh-config", fake_gpus.config_path, "--launcher", f"sh {STANDIN}",
                   "--placement", "memory", "-o", tmp_path / "r")
    assert out.returncode == 0, out.stdout + out.stderr
    used = hosts_used(tmp_path / "r")
    assert len(used) == 3 and set().union(*used.values()) == {"node-1"}
    assert smi.calls(fake_gpus["node-1"].bin)  # it was asked, and failed
