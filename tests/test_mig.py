"""MIG: a GPU in MIG mode is no slot, each of its MIG instances is one, with its own UUID, type and memory.

This machine as the fake NVML shows it (`mixed_machine`): GPU 0, an A100-SXM4-40GB in MIG mode with a 3g.20gb
instance, an empty MIG index and a 2g.10gb one; GPU 1, a whole A100-SXM4-80GB. Inventory and cluster, placement
(one-GPU experiments on MIG instances, never more), the argv and environment a MIG attempt gets, checked
under DeepSpeed's real per-node launcher, and a whole sweep run by the real `deepspeed` launcher with a stand-in
training script that records what CUDA_VISIBLE_DEVICES each run saw.
"""
from __future__ import annotations

import base64
import inspect
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest
from test_inventory import FakeDevice, FakeNvml

import autotuner
from autotuner.backends.cluster import check_fits, local_or_hostfile_cluster
from autotuner.backends.launch import Launcher, deepspeed_command, mig_of
from autotuner.core.events import Queued
from autotuner.core.placement import placement_named
from autotuner.core.slots import Device, Reservation, SlotPool
from autotuner.errors import UserError
from autotuner.gpu.nvml import FreeMemoryReader, Gpu, find_gpus
from autotuner.ledger.store import Ledger
from autotuner.spec import Experiment

GiB = 1 << 30
MIG_3G = "MIG-11111111-2222-3333-4444-555555555555"
MIG_2G = "MIG-66666666-7777-8888-9999-000000000000"
TYPE_3G, TYPE_2G, WHOLE = "A100-SXM4-40GB-MIG-3g.20gb", "A100-SXM4-40GB-MIG-2g.10gb", "A100-SXM4-80GB"


def mixed_machine(free_3g: int = 19 * GiB) -> FakeNvml:
    mig = [FakeDevice("NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20 * GiB, free_3g, MIG_3G), None,
           FakeDevice(b"NVIDIA A100-SXM4-40GB MIG 2g.10gb", 10 * GiB, 9 * GiB, MIG_2G.encode())]
    return FakeNvml([FakeDevice("NVIDIA A100-SXM4-40GB", 40 * GiB, 0, "GPU-parent", mig=mig),
                     FakeDevice("NVIDIA A100-SXM4-80GB", 80 * GiB, 70 * GiB, "GPU-whole")])


def test_the_fake_has_pynvmls_names_and_parameters():
    """Every call the fake answers is pynvml's, with its required parameters (the fake omits optional ones)."""
    faked = [(name, fake) for name, fake in inspect.getmembers(FakeNvml, inspect.isfunction) if name.startswith("nvml")]
    assert {"nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex"} <= {
        name for name, _ in faked}
    for name, fake in faked:
        real = inspect.signature(getattr(pynvml, name)).parameters.values()
        required = [p.name for p in real if p.default is inspect.Parameter.empty]
        assert list(inspect.signature(fake).parameters)[1:] == required, name


# --- inventory -----------------------------------------------------------------------------------------------
def test_a_gpu_in_mig_mode_gives_its_instances_and_a_whole_gpu_stays_as_it_was():
    gpus, _ = find_gpus(mixed_machine())
    assert gpus == [Gpu(0, "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20 * GiB, 19 * GiB, MIG_3G, mig=0, slot=2),
                    Gpu(0, "NVIDIA A100-SXM4-40GB MIG 2g.10gb", 10 * GiB, 9 * GiB, MIG_2G, mig=2, slot=3),
                    Gpu(1, "NVIDIA A100-SXM4-80GB", 80 * GiB, 70 * GiB, "GPU-whole")]
    assert [g.slot_id for g in gpus] == [2, 3, 1]
    assert FreeMemoryReader(mixed_machine(free_3g=5 * GiB)).read() == {2: 5 * GiB, 3: 9 * GiB, 1: 70 * GiB}


def test_free_memory_follows_the_recorded_instances_by_uuid_when_the_mig_layout_changed():
    nvml = mixed_machine()
    assert nvml.devices[0].mig is not None
    nvml.devices[0].mig[1] = FakeDevice("NVIDIA A100-SXM4-40GB MIG 1g.5gb", 5 * GiB, 4 * GiB, "MIG-new")
    assert [g.slot_id for g in find_gpus(nvml)[0]] == [2, 3, 4, 1]  # the 2g.10gb would now read as slot 4
    reader = FreeMemoryReader(nvml, mig={2: MIG_3G, 3: MIG_2G})  # as the sweep recorded them
    assert reader.read() == {2: 19 * GiB, 3: 9 * GiB, 1: 70 * GiB}
    nvml.devices[0].mig[2] = None  # the 2g.10gb destroyed: no reading, so the memory placement never picks it
    assert reader.read() == {2: 19 * GiB, 1: 70 * GiB}


def test_a_gpu_in_mig_mode_without_instances_gives_no_slot_and_says_why():
    nvml = FakeNvml([FakeDevice("NVIDIA A100-SXM4-40GB", 40 * GiB, 0, "GPU-parent", mig=[None] * 7)])
    with pytest.raises(UserError, match=r"no GPU found on this machine \(NVML: device 0 is in MIG mode without MIG "):
        local_or_hostfile_cluster(None, nvml=nvml)


def test_a_mig_instance_named_without_its_profile_still_reads_as_mig():
    nvml = mixed_machine()
    instance = nvml.devices[0].mig[0]  # type: ignore[index]
    assert instance is not None
    instance.name = "NVIDIA A100-SXM4-40GB"  # a driver that names the instance as its GPU
    assert find_gpus(nvml)[0][0].name == "NVIDIA A100-SXM4-40GB MIG 20gb"


@pytest.mark.parametrize(("name", "gpu_type", "size"), [
    ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", TYPE_3G, 20 * 10**9),
    ("NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb", "A100-SXM4-40GB-MIG-1c.3g.20gb", 20 * 10**9),  # a compute instance
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", "H100-80GB-HBM3-MIG-1g.10gb-me", 10 * 10**9),
])
def test_a_mig_type_states_its_profiles_memory_not_its_gpus(name, gpu_type, size):
    from autotuner.gpu.types import size_of_type, type_of_gpu

    assert type_of_gpu(name, size) == gpu_type and size_of_type(gpu_type) == size


def test_this_machine_as_a_cluster_has_a_slot_per_mig_instance_of_its_own_type():
    cluster = local_or_hostfile_cluster(None, nvml=mixed_machine())
    assert cluster.slots == {"localhost": (1, 2, 3)} and cluster.capacity == {"localhost": 4}
    assert cluster.types == {"localhost": WHOLE} and cluster.memory == {"localhost": 80 * GiB}
    assert cluster.devices == {"localhost": {2: Device(TYPE_3G, 20 * GiB, MIG_3G),
                                             3: Device(TYPE_2G, 10 * GiB, MIG_2G)}}
    assert local_or_hostfile_cluster(None, "localhost:2", nvml=mixed_machine()).slots == {"localhost": (2,)}
    with pytest.raises(UserError, match=r"--exclude leaves no slot on this machine \(a GPU in MIG mode is no slot "
                                        r"itself; its MIG instances are: slots 2, 3 of localhost\)"):
        local_or_hostfile_cluster(None, "", "localhost:1,2,3", nvml=mixed_machine())


@pytest.mark.parametrize(("include", "exclude"), [("localhost:0", ""), ("localhost:0,2", ""), ("", "localhost:0"),
                                                  ("", "localhost:0,1")])
def test_naming_a_gpu_in_mig_mode_in_include_or_exclude_is_refused_naming_its_instances(include, exclude):
    """GPU 0 is in MIG mode: no slot. Picking it would silently run elsewhere, leaving it out would still run on
    its instances: neither is guessed."""
    option = "--include" if include else "--exclude"
    with pytest.raises(UserError, match=rf"{option} '.*': slot 0 is GPU 0, in MIG mode: no slot itself; its MIG "
                                        r"instances are slots 2, 3 of localhost$"):
        local_or_hostfile_cluster(None, include, exclude, nvml=mixed_machine())


# --- placement -----------------------------------------------------------------------------------------------
def queued(name: str, num_gpus: int = 1, **extra) -> Queued:
    return Queued(Experiment(name, {}, num_gpus, 1, "/t.py", **extra), 1)


def placement_on(nvml: FakeNvml, name: str = "pack"):
    cluster = local_or_hostfile_cluster(None, nvml=nvml)
    reader = FreeMemoryReader(nvml)
    placement = placement_named(name, cluster.host_types, cluster.memory, lambda host: reader.read(),
                                cluster.devices, cluster.slots)
    return SlotPool(cluster.slots), placement


def test_one_gpu_experiments_use_every_slot_two_gpu_ones_never_a_mig_instance():
    nvml = FakeNvml([FakeDevice("NVIDIA A100-SXM4-80GB", 80 * GiB, 70 * GiB, f"GPU-{i}") for i in range(2)])
    nvml.devices.insert(0, mixed_machine().devices[0])  # GPU 0 in MIG mode, GPUs 1 and 2 whole
    pool, placement = placement_on(nvml)
    two = placement.place(pool, queued("two", 2))
    assert two == Reservation.of({"localhost": [1, 2]})
    pool.take(two)
    assert placement.place(pool, queued("two-again", 2)) is None  # two MIG instances are free: not for it
    assert placement.could_fit(pool, queued("two-again", 2))  # it waits for the whole GPUs
    assert placement.place(pool, queued("mixed", 2, gpu_mixed=True)) is None
    ones = []
    for i in range(2):
        ones.append(placement.place(pool, queued(f"one{i}")))
        pool.take(ones[-1])
    assert ones == [Reservation.of({"localhost": [3]}), Reservation.of({"localhost": [4]})]  # the 3g, then the 2g
    pinned = placement.place(SlotPool({"localhost": (1, 2, 3, 4)}), queued("pinned", gpu_type=TYPE_2G))
    assert pinned == Reservation.of({"localhost": [4]})


def test_the_memory_placement_reads_each_mig_instances_own_free_memory():
    need = {"gpu_memory": 8 * 10**9}  # 7.5 GiB: the 2g.10gb (9 GiB free) holds it, not with 3g.20gb's 5 GiB free
    pool, placement = placement_on(mixed_machine(free_3g=5 * GiB), "memory")
    pool.take(Reservation.of({"localhost": [1]}))  # the whole GPU is busy with a run of the sweep
    assert placement.place(pool, queued("m", **need)) == Reservation.of({"localhost": [3]})
    pool, placement = placement_on(mixed_machine(free_3g=19 * GiB), "memory")
    pool.take(Reservation.of({"localhost": [1]}))
    assert placement.place(pool, queued("m", gpu_memory=12 * 10**9)) == Reservation.of({"localhost": [2]})
    assert placement.place(pool, queued("m", gpu_memory=20 * 10**9)) is None  # 20 GiB less the margin: no MIG has it


def sweep_file(directory: Path, extra: str = "", script: str = "train.py", count: int = 3) -> Path:
    (directory / "train.py").touch()
    spec = directory / "sweep.hjson"
    spec.write_text("{\n  name: s\n  script: " + script + "\n" + extra +
                    "  ds_config: {train_micro_batch_size_per_gpu: 1}\n"
                    f"  space: {{x: {list(range(1, count + 1))}}}\n}}\n")
    return spec


def test_a_sweep_that_needs_more_than_one_gpu_on_mig_instances_only_is_refused_at_its_line(tmp_path):
    only_mig = FakeNvml([mixed_machine().devices[0]])
    cluster = local_or_hostfile_cluster(None, nvml=only_mig)
    assert cluster.types == {} and set(cluster.devices["localhost"]) == {1, 2}
    sweep = autotuner.load_sweep([sweep_file(tmp_path, "  num_gpus: 2\n")])
    with pytest.raises(UserError) as info:
        check_fits(sweep, cluster)
    assert str(info.value) == (f"{tmp_path / 'sweep.hjson'}:4: experiment s_x1 needs 1 node(s) with 2 GPU(s) each; "
                               "the cluster has only MIG instances, and a process can use one MIG instance only")
    check_fits(autotuner.load_sweep([sweep_file(tmp_path)]), cluster)  # one GPU each: fine
    beside_one_gpu = local_or_hostfile_cluster(None, nvml=mixed_machine())  # one whole GPU, two MIG instances
    with pytest.raises(UserError) as info:
        check_fits(autotuner.load_sweep([sweep_file(tmp_path, "  num_gpus: 2\n")]), beside_one_gpu)
    assert str(info.value).endswith(f"({WHOLE}: 1 node(s), at most 1 slot(s) on one; {TYPE_3G}: MIG instances, one "
                                    f"GPU each; {TYPE_2G}: MIG instances, one GPU each)")  # no hint to mix types


# --- launch --------------------------------------------------------------------------------------------------
def mig_command(tmp_path: Path, script: str):
    experiment = Experiment("s_x1", {"train_micro_batch_size_per_gpu": 1}, 1, 1, script, args=("--epochs", "1"))
    reservation = Reservation.of({"localhost": [2]})
    mig = mig_of(reservation, {"localhost": {2: Device(TYPE_3G, 20 * GiB, MIG_3G)}})
    return deepspeed_command(experiment, reservation, {"x": 1}, hostfile=str(tmp_path / "hostfile"),
                             master_port=29555, metric_path=str(tmp_path / "metrics.json"), tag="sweep.s_x1.1",
                             cwd=str(tmp_path), launcher=Launcher((sys.executable, "-m", "deepspeed.launcher.runner")),
                             mig=mig)


def test_a_mig_attempt_goes_through_deepspeeds_per_node_launcher_naming_its_uuid(tmp_path):
    command = mig_command(tmp_path, "train.py")
    argv = list(command.argv)
    assert argv[:4] == [sys.executable, "-u", "-m", "deepspeed.launcher.launch"]
    world = argv[4].removeprefix("--world_info=")
    assert json.loads(base64.urlsafe_b64decode(world)) == {"localhost": [MIG_3G]}
    assert argv[5:8] == ["--master_addr=127.0.0.1", "--master_port=29555", "train.py"]
    assert argv[8:10] == ["--epochs", "1"] and "--deepspeed_config" in argv and "--include" not in argv
    assert command.env["CUDA_VISIBLE_DEVICES"] == MIG_3G
    assert mig_of(Reservation.of({"localhost": [1]}), {"localhost": {2: Device(TYPE_3G, mig=MIG_3G)}}) is None


STANDIN = """\
import json, os, sys
keys = ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_SIZE", "AUTOTUNE_TAG")
seen = {k: os.environ.get(k) for k in keys} | {"argv": sys.argv[1:]}
path = os.environ["AUTOTUNE_METRICS_PATH"]
with open(os.path.join(os.path.dirname(path), "seen.json"), "w") as f:
    json.dump(seen, f)
with open(path, "w") as f:
    json.dump({"throughput": 1.0 + len(path) % 7, "latency": 1.0}, f)
"""


def test_deepspeeds_real_per_node_launcher_gives_the_rank_exactly_that_mig_instance(tmp_path):
    (tmp_path / "train.py").write_text(STANDIN)
    command = mig_command(tmp_path, str(tmp_path / "train.py"))
    env = {k: v for k, v in __import__("os").environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    out = subprocess.run(command.argv, env={**env, **command.env}, cwd=command.cwd, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert {k: seen[k] for k in ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_SIZE")} == {
        "CUDA_VISIBLE_DEVICES": MIG_3G, "LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_SIZE": "1"}
    assert seen["argv"][0] == "--local_rank=0" and seen["argv"][1:3] == ["--epochs", "1"]


# --- a sweep ---------------------------------------------------------------------------------------------------
def test_a_sweep_on_mig_instances_and_a_whole_gpu_runs_each_attempt_on_its_own_device(tmp_path, monkeypatch):
    """The real `deepspeed` launcher (the default, beside this Python) runs a stand-in script: the whole GPU's
    run through `--include localhost:1`, each MIG instance's through the per-node launcher with its UUID."""
    nvml = mixed_machine()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)  # what inventory imports: this machine is the fake's
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (tmp_path / "standin.py").write_text(STANDIN)
    sweep = autotuner.load_sweep([sweep_file(tmp_path, script="standin.py", count=3)])
    cluster = autotuner.load_cluster()
    directory = autotuner.prepare(sweep, cluster, tmp_path / "r")
    result = autotuner.execute(directory, autotuner.Options(grace=1.0))
    assert result.exit_code == 0, [(a.name, a.state, a.reason) for a in Ledger.open(directory).latest()]
    with Ledger.open(directory) as ledger:
        attempts = {a.name: a for a in ledger.latest()}
    devices = {1: "1", 2: MIG_3G, 3: MIG_2G}
    assert sorted(a.slots["localhost"][0] for a in attempts.values()) == [1, 2, 3]  # one run on each slot at once
    for name, a in attempts.items():
        (slot,) = a.slots["localhost"]
        seen = json.loads((directory / name / "seen.json").read_text())
        assert (seen["CUDA_VISIBLE_DEVICES"], seen["WORLD_SIZE"], seen["LOCAL_RANK"]) == (devices[slot], "1", "0")
        cmd = (directory / name / "cmd.txt").read_text()
        assert ("deepspeed.launcher.launch" in cmd) == (slot != 1) and (f"CUDA_VISIBLE_DEVICES={devices[slot]}"
                                                                        in cmd) == (slot != 1)
    snap = autotuner.snapshot(directory)
    assert snap.types == [WHOLE, TYPE_3G, TYPE_2G] and set(snap.best_by_type) == set(snap.types)
    # Each type's best, runnable as it ran: a MIG type's through the per-node launcher on its instance.
    words = shlex.split((directory / f"cmd_optimal.{TYPE_3G}.txt").read_text())
    assert words[0] == f"CUDA_VISIBLE_DEVICES={MIG_3G}" and words[2:5] == ["-u", "-m", "deepspeed.launcher.launch"]
    assert json.loads(base64.urlsafe_b64decode(words[5].removeprefix("--world_info="))) == {"localhost": [MIG_3G]}
    assert words[-2:] == ["--deepspeed_config", str((directory / f"ds_config_optimal.{TYPE_3G}.json").resolve())]
    whole = shlex.split((directory / f"cmd_optimal.{WHOLE}.txt").read_text())
    assert "--num_gpus" in whole and not any("MIG" in w for w in whole)


# --- autotune hosts ------------------------------------------------------------------------------------------
NVIDIA_SMI = f"""\
#!/bin/sh
# Stands in for nvidia-smi (this machine has no GPU): the two queries the probe makes, as a driver >= R470 answers
# them on a host whose GPU 0 is in MIG mode.
if [ "$1" = "-L" ]; then
  echo "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)"
  echo "  MIG 3g.20gb     Device  0: (UUID: {MIG_3G})"
  echo "  MIG 2g.10gb     Device  1: (UUID: {MIG_2G})"
  echo "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-whole)"
else
  echo "0, NVIDIA A100-SXM4-40GB, 40000, 40960, GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77"
  echo "1, NVIDIA A100-SXM4-80GB, 70000, 81920, GPU-whole"
fi
"""


def test_hosts_shows_a_gpu_in_mig_mode_as_its_mig_instances(tmp_path):
    """The probe's own shell script, run here with a stand-in nvidia-smi first on PATH."""
    from autotuner.backends.ssh.probe import parse_probe, probe_script
    from autotuner.spec.hostfile import parse_hostfile

    from helpers import render_hosts

    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(NVIDIA_SMI)
    smi.chmod(0o755)
    path = f"{smi.parent}:{__import__('os').environ['PATH']}"
    out = subprocess.run(["sh", "-c", probe_script(sys.executable)], capture_output=True, text=True,
                         env={"PATH": path}, timeout=60)
    report = parse_probe("gpu-1", out.stdout)
    assert [(g.index, g.mig, g.name, g.memory_total, g.memory_free, g.uuid) for g in report.gpus] == [
        (0, 0, "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20 * 10**9, None, MIG_3G),
        (0, 1, "NVIDIA A100-SXM4-40GB MIG 2g.10gb", 10 * 10**9, None, MIG_2G),
        (1, None, "NVIDIA A100-SXM4-80GB", 81920 << 20, 70000 << 20, "GPU-whole")]
    table = render_hosts("t", parse_hostfile("gpu-1 slots=3\n"), [report], "table")
    row = " ".join(table.split())
    assert "NVIDIA A100-SXM4-40GB MIG 3g.20gb 19 GiB" in row and "NVIDIA A100-SXM4-80GB 68/80 GiB free" in row


def test_the_memory_placement_of_a_sweep_puts_runs_only_on_the_instance_with_room(tmp_path, monkeypatch):
    """Through the runner: another user's process fills the whole GPU, the 2g.10gb is too small for 12 GB, so
    both runs go to the 3g.20gb instance, one after the other, read by its UUID."""
    nvml = mixed_machine()
    nvml.devices[1].free = 2 * GiB
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (tmp_path / "standin.py").write_text(STANDIN)
    sweep = autotuner.load_sweep([sweep_file(tmp_path, '  gpu_memory: "12GB"\n', script="standin.py", count=2)])
    directory = autotuner.prepare(sweep, autotuner.load_cluster(), tmp_path / "r")
    assert autotuner.execute(directory, autotuner.Options(placement="memory", grace=1.0)).exit_code == 0
    with Ledger.open(directory) as ledger:
        attempts = ledger.latest()
    assert [a.slots for a in attempts] == [{"localhost": [2]}] * 2
    assert {json.loads((directory / a.name / "seen.json").read_text())["CUDA_VISIBLE_DEVICES"]
            for a in attempts} == {MIG_3G}


# gpu.pid appears whole (written aside, then renamed): the peak reader polls it, and may do so mid-write.
HOLDING = STANDIN + """\
import time
pid_path = os.path.join(os.path.dirname(path), "gpu.pid")
with open(pid_path + ".part", "w") as f:
    f.write(f"{os.getpid()} {os.environ['CUDA_VISIBLE_DEVICES']}")
os.replace(pid_path + ".part", pid_path)
time.sleep(2.5)  # past two of the peak reader's readings (one a second)
"""


def hold_on_instances(parent: FakeDevice, processes) -> None:
    """Each MIG instance of `parent` lists, as NVML's compute processes, what `processes(its UUID)` says."""
    for instance in parent.mig or []:
        if instance is not None:
            uuid = instance.uuid.decode() if isinstance(instance.uuid, bytes) else str(instance.uuid)
            instance.processes = lambda uuid=uuid: processes(uuid)


def test_the_peak_memory_of_a_run_on_a_mig_instance_is_read_from_that_instance(tmp_path, monkeypatch):
    """A MIG instance's slot id is no NVML index: the reader finds the instance by its UUID and records what the
    run holds there (each device of the fake lists the stand-in runs that saw it as theirs)."""
    nvml = mixed_machine()
    holds = {MIG_3G: 15 * GiB, MIG_2G: 7 * GiB, "1": 50 * GiB}
    directory = tmp_path / "r"

    def processes(device: str) -> list[tuple[int, int | None]]:
        found = []
        for pid_file in directory.glob("*/gpu.pid"):
            pid, seen = pid_file.read_text().split()
            if seen == device:
                found.append((int(pid), holds[device]))
        return found

    whole, parent = nvml.devices[1], nvml.devices[0]
    whole.processes = lambda: processes("1")
    hold_on_instances(parent, processes)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (tmp_path / "standin.py").write_text(HOLDING)
    sweep = autotuner.load_sweep([sweep_file(tmp_path, script="standin.py", count=3)])
    autotuner.prepare(sweep, autotuner.load_cluster(), directory)
    assert autotuner.execute(directory, autotuner.Options(grace=1.0)).exit_code == 0
    with Ledger.open(directory) as ledger:
        slot_of = {a.name: a.slots["localhost"][0] for a in ledger.latest()}
        peaks = ledger.peaks()
    assert {slot_of[name]: peak for name, peak in peaks.items()} == {1: 50 * GiB, 2: 15 * GiB, 3: 7 * GiB}


def test_a_config_measured_on_a_mig_instance_is_never_made_too_big_for_it_by_the_margin(tmp_path, monkeypatch):
    """A machine of MIG instances only (3g: 20 GiB, 19 free; 2g: 10 GiB). s_x1 held 18 GiB on the 3g instance: the
    10% margin would make it 20 GiB, which no instance has; capped at what the biggest instance holds less the
    headroom (19 GiB), the sweep that learns it (--from) runs it there again."""
    nvml = FakeNvml([mixed_machine().devices[0]])
    first, second = tmp_path / "first", tmp_path / "second"

    def processes(uuid: str) -> list[tuple[int, int | None]]:
        return [(int(pid), 18 * GiB if uuid == MIG_3G else 1 * GiB) for d in (first, second)
                for pid, seen in (f.read_text().split() for f in d.glob("*/gpu.pid")) if seen == uuid]

    hold_on_instances(nvml.devices[0], processes)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (tmp_path / "standin.py").write_text(HOLDING)
    sweep = autotuner.load_sweep([sweep_file(tmp_path, script="standin.py", count=1)])
    autotuner.prepare(sweep, autotuner.load_cluster(), first)
    assert autotuner.execute(first, autotuner.Options(grace=1.0)).exit_code == 0
    with Ledger.open(first) as ledger:
        assert ledger.peaks() == {"s_x1": 18 * GiB} and ledger.latest()[0].slots == {"localhost": [1]}
    autotuner.prepare(sweep, autotuner.load_cluster(), second, memory_from=first)
    with Ledger.open(second) as ledger:
        assert ledger.meta().learned_memory == {"s_x1": 19 * GiB}  # 20 GiB less its 1 GiB of headroom
    result = autotuner.execute(second, autotuner.Options(grace=1.0))
    with Ledger.open(second) as ledger:
        attempts = ledger.latest()
    assert result.exit_code == 0, [(a.name, a.state, a.detail) for a in attempts]
    assert attempts[0].slots == {"localhost": [1]}
