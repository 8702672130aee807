"""GPU types and memory needs as they are read: sizes, NVML's names, the hostfile's `gpu=`, the cluster (a
FakeNvml for this machine), the sweep file's keys, the ledger's record, and the checks made before a sweep is
created."""
from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import replace

import pytest
from test_inventory import FakeDevice, FakeNvml

from autotuner.backends.cluster import Cluster, check_fits, check_gpu_needs, local_or_hostfile_cluster
from autotuner.errors import UserError
from autotuner.gpu.nvml import FreeMemoryReader, gpu_type, local_inventory
from autotuner.gpu.types import parse_size, size_of_type, type_of_gpu, type_problem
from autotuner.ledger.store import Ledger
from autotuner.spec import Experiment, Sweep
from autotuner.spec.hostfile import format_hostfile, load_hostfile, parse_hostfile
from autotuner.spec.load import load_sweep
from autotuner.spec.metrics import THROUGHPUT
from autotuner.spec.model import canonical
from autotuner.sweep.create import prepare

from helpers import SWEEP_META, experiment

GiB = 1 << 30


# --- sizes and names ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "size"), [
    ("30GB", 30 * 10**9), ("30GiB", 30 * GiB), ("30000MB", 30 * 10**9), ("30 gib", 30 * GiB), ("1.5TB", 15 * 10**11),
    (123456789, 123456789), ("4096", 4096), ("512KiB", 512 * 1024)])
def test_sizes_are_read_as_people_write_them(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize(("value", "fragment"), [
    ("30 GBs", "a size such as"), ("", "a size such as"), ("-3GB", "a size such as"), (True, "a size such as"),
    (3.5, "a size such as"), (0, "positive"), ("0GB", "positive"), ("99999TB", "the limit"), ("9" * 50, "a size")])
def test_a_bad_size_says_what_a_size_looks_like(value, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_size(value)


@pytest.mark.parametrize(("name", "total", "expected"), [
    ("NVIDIA A100-SXM4-80GB", 80 * GiB, "A100-SXM4-80GB"),
    ("NVIDIA H100 80GB HBM3", 79 * GiB + 700 * 2**20, "H100-80GB-HBM3"),
    ("NVIDIA H100 PCIe", 80 * GiB, "H100-PCIe-80GB"),
    ("Tesla V100-SXM2-16GB", 16 * GiB, "Tesla-V100-SXM2-16GB"),
    ("NVIDIA GeForce RTX 4090", 24 * GiB, "GeForce-RTX-4090-24GB"),
    ("NVIDIA", 8 * GiB, "8GB")])
def test_nvml_names_become_readable_types_that_state_their_size(name, total, expected):
    assert type_of_gpu(name, total) == expected and type_problem(expected) is None


def test_a_types_name_states_its_size_in_gb_never_more_than_the_gpu_has():
    assert size_of_type("A100-80GB") == 80 * 10**9 < 80 * GiB
    assert size_of_type("H100-80GB-HBM3") == 80 * 10**9 and size_of_type("X-24GiB") == 24 * GiB
    assert size_of_type("V100") is None and size_of_type("A10G") is None


# --- the hostfile -------------------------------------------------------------------------------------------
def test_the_hostfiles_gpu_attribute_types_its_hosts_and_the_hostfile_handed_to_deepspeed_has_none(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("w0 slots=4 gpu=A100-80GB\nw1 slots=2 gpu=V100\nw2 slots=2\n")
    cluster = Cluster.of(load_hostfile(path), {"w0": (0, 1, 2, 3), "w1": (0, 1), "w2": (0, 1)}, "cuda")
    assert cluster.types == {"w0": "A100-80GB", "w1": "V100"}
    assert cluster.memory == {"w0": 80 * 10**9}  # V100 states no size; w2 no type
    assert cluster.host_types == {"w0": "A100-80GB", "w1": "V100", "w2": None}
    assert format_hostfile(dict(cluster.capacity)) == "w0 slots=4\nw1 slots=2\nw2 slots=2\n"


@pytest.mark.parametrize("bad", ["a/b", ".hidden", "x" * 65, "A100+H100"])
def test_a_gpu_type_that_cannot_name_a_file_is_refused_at_its_line(bad):
    with pytest.raises(UserError) as info:
        parse_hostfile(f"ok slots=1 gpu=A100\nw slots=2 gpu={bad}\n", "hosts")
    assert (info.value.path, info.value.line) == ("hosts", 2) and "w: GPU type" in info.value.message


# --- this machine (NVML) -----------------------------------------------------------------------------------
def test_this_machines_gpus_give_the_clusters_type_and_size():
    nvml = FakeNvml([FakeDevice("NVIDIA A100-SXM4-80GB", 80 * GiB, 70 * GiB, "GPU-a"),
                     FakeDevice(b"NVIDIA A100-SXM4-80GB", 80 * GiB, 3 * GiB, b"GPU-b")])
    cluster = local_or_hostfile_cluster(None, nvml=nvml)
    assert cluster.slots == {"localhost": (0, 1)} and cluster.accelerator == "cuda"
    assert cluster.types == {"localhost": "A100-SXM4-80GB"} and cluster.memory == {"localhost": 80 * GiB}


def test_a_machine_of_two_models_or_cpu_slots_has_no_type():
    two = FakeNvml([FakeDevice("NVIDIA A100-SXM4-80GB", 80 * GiB, 1, "a"), FakeDevice("NVIDIA T4", 16 * GiB, 1, "b")])
    assert local_inventory(None, two).gpu_type is None
    assert local_or_hostfile_cluster(None, nvml=two).types == {}
    assert local_or_hostfile_cluster(None, cpu_slots=2, nvml=two).types == {}
    assert gpu_type([]) is None


def test_free_memory_is_read_per_gpu_in_one_session_and_no_driver_is_not_measured():
    nvml = FakeNvml([FakeDevice("NVIDIA A100-SXM4-80GB", 80 * GiB, 70 * GiB, "a"),
                     FakeDevice("NVIDIA A100-SXM4-80GB", 80 * GiB, 20 * GiB, "b")])
    reader = FreeMemoryReader(nvml)
    assert reader.read() == {0: 70 * GiB, 1: 20 * GiB}
    nvml.devices[1].free = 5 * GiB  # another user's process took more: the next read says so
    assert reader.read() == {0: 70 * GiB, 1: 5 * GiB}
    reader.close()
    assert nvml.calls == ["init", "shutdown"]
    import pynvml

    assert FreeMemoryReader(FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound)).read() is None


# --- the sweep file -----------------------------------------------------------------------------------------
def sweep_file(tmp_path, extra: str, name: str = "sweep.hjson"):
    (tmp_path / "train.py").touch()
    path = tmp_path / name
    path.write_text("{\n  name: s\n  script: train.py\n" + extra + "  space: {x: [1, 2]}\n}\n")
    return path


def test_sweep_file_keys_pin_a_type_allow_mixing_and_state_a_memory_need(tmp_path):
    sweep = load_sweep([sweep_file(tmp_path, '  gpu_type: A100-80GB\n  gpu_mixed: true\n  gpu_memory: "30GiB"\n')])
    e = sweep.experiments[0]
    assert (e.gpu_type, e.gpu_mixed, e.gpu_memory) == ("A100-80GB", True, 30 * GiB)
    assert Experiment.from_json(json.loads(json.dumps(e.to_json()))) == e
    assert sweep.origins[e.name].gpu_type == 4 and sweep.origins[e.name].gpu_memory == 6
    told = load_sweep([sweep_file(tmp_path, "  gpu_type: A100-80GB\n")], gpu_type="H100", gpu_mixed=True)
    assert {(x.gpu_type, x.gpu_mixed) for x in told.experiments} == {("H100", True)}  # the command line wins
    assert told.inputs is not None and told.inputs.to_json()["gpu_type"] == "H100"


def test_experiments_without_gpu_needs_keep_their_digest_and_json_and_a_pin_changes_the_digest():
    plain = experiment("e")
    assert "gpu_type" not in plain.to_json() and "gpu_memory" not in plain.to_json()
    # The digest of an experiment as every earlier version computed it: resume must not see a change.
    before = {"ds_config": plain.ds_config, "num_gpus": 1, "num_nodes": 1, "script": "/bin/true", "args": [],
              "env": {}}
    assert plain.digest == hashlib.sha256(canonical(before).encode()).hexdigest()
    pinned = replace(plain, gpu_type="A100")
    assert pinned.digest != plain.digest and replace(plain, gpu_mixed=True).digest != plain.digest
    assert replace(plain, gpu_memory=10 * GiB).digest == plain.digest  # a need, like a timeout: not the run


@pytest.mark.parametrize(("extra", "line", "fragment"), [
    ('  gpu_memory: "lots"\n', 4, "gpu_memory must be a size such as"),
    ("  gpu_memory: 0\n", 4, "gpu_memory must be a positive size"),
    ("  gpu_type: a/b\n", 4, "gpu_type: GPU type 'a/b'"),
    ("  gpu_mixed: yes\n", 4, "gpu_mixed must be true or false")])
def test_bad_gpu_keys_are_refused_at_their_line(tmp_path, extra, line, fragment):
    with pytest.raises(UserError) as info:
        load_sweep([sweep_file(tmp_path, extra)])
    assert info.value.line == line and fragment in info.value.message, info.value


def test_a_bad_gpu_type_option_is_one_line():
    with pytest.raises(UserError, match="--gpu-type: GPU type"):
        load_sweep(["unused"], gpu_type="../x")


# --- checked before a sweep is created ----------------------------------------------------------------------
TWO_TYPES = Cluster({"a0": (0, 1), "a1": (0, 1), "h0": (0, 1, 2, 3)}, {"a0": 2, "a1": 2, "h0": 4},
                    types={"a0": "A100-80GB", "a1": "A100-80GB", "h0": "RTX-24GB"},
                    memory={"a0": 80 * 10**9, "a1": 80 * 10**9, "h0": 24 * 10**9})


def test_a_pin_to_a_type_the_cluster_lacks_is_refused_at_its_line_and_nothing_is_created(tmp_path):
    sweep = load_sweep([sweep_file(tmp_path, "  gpu_type: V100\n")])
    with pytest.raises(UserError) as info:
        prepare(sweep, TWO_TYPES, tmp_path / "r")
    assert (info.value.line, str(info.value).count("\n")) == (4, 0)
    assert "pinned to GPU type V100, which the cluster lacks (GPU types: A100-80GB, RTX-24GB)" in str(info.value)
    assert not (tmp_path / "r").exists()
    told = load_sweep([sweep_file(tmp_path, "")], gpu_type="V100")
    with pytest.raises(UserError, match=r"^--gpu-type V100: the cluster has no GPU of that type"):
        check_fits(told, TWO_TYPES)


def test_an_experiment_that_fits_no_single_type_is_refused_unless_it_may_span_them(tmp_path):
    wide = load_sweep([sweep_file(tmp_path, "  num_nodes: 3\n")])
    with pytest.raises(UserError) as info:
        check_fits(wide, TWO_TYPES)
    assert info.value.line == 4 and "needs 3 node(s) with 1 slot(s) each of one GPU type; no type has that " \
        "(A100-80GB: 2 node(s), at most 2 slot(s) on one; RTX-24GB: 1 node(s), at most 4 slot(s) on one); " \
        "`gpu_mixed: true` lets it span types" in info.value.message
    check_fits(load_sweep([sweep_file(tmp_path, "  num_nodes: 3\n  gpu_mixed: true\n")]), TWO_TYPES)
    check_fits(wide, replace(TWO_TYPES, types={}, memory={}))  # untyped: as ever
    with pytest.raises(UserError, match="of one GPU type \\(A100-80GB\\)"):
        check_fits(load_sweep([sweep_file(tmp_path, "  num_gpus: 4\n  gpu_type: A100-80GB\n")]), TWO_TYPES)


def test_a_memory_need_no_gpu_can_hold_is_refused_at_its_line(tmp_path):
    check_gpu_needs(load_sweep([sweep_file(tmp_path, '  gpu_memory: "60GB"\n')]), TWO_TYPES)  # the A100s hold it
    with pytest.raises(UserError) as info:
        check_gpu_needs(load_sweep([sweep_file(tmp_path, '  gpu_memory: "79GB"\n')]), TWO_TYPES)
    assert info.value.line == 4 and "needs 73.6 GiB on each GPU; the GPUs it may use have 74.5 GiB, 3.7 GiB of it " \
        "kept free" in info.value.message
    pinned = load_sweep([sweep_file(tmp_path, '  gpu_type: RTX-24GB\n  gpu_memory: "30GB"\n')])
    with pytest.raises(UserError, match=r"the GPUs it may use have 22\.4 GiB"):
        check_gpu_needs(pinned, TWO_TYPES)
    check_gpu_needs(pinned, replace(TWO_TYPES, memory={}))  # sizes unknown: nothing to refuse


def test_a_sweep_made_in_python_is_checked_too():
    sweep = Sweep("py", (replace(experiment("e"), gpu_type="T4"),), THROUGHPUT, "py")
    with pytest.raises(UserError, match="experiment e is pinned to GPU type T4"):
        check_fits(sweep, TWO_TYPES)


# --- the ledger -----------------------------------------------------------------------------------------------
def test_the_ledger_records_types_and_sizes_and_an_old_ledger_has_none(tmp_path):
    typed = replace(SWEEP_META, gpu_types={"localhost": "A100-80GB"}, gpu_memory={"localhost": 80 * GiB},
                    placement="memory")
    Ledger.create(tmp_path, typed).close()
    with Ledger.open(tmp_path) as ledger:
        meta = ledger.meta()
    assert meta == typed and meta.gpu_types == {"localhost": "A100-80GB"} and meta.placement == "memory"
    old = tmp_path / "old"
    old.mkdir()
    Ledger.create(old, SWEEP_META).close()
    with Ledger.open(old) as ledger:
        assert "gpu_types" not in SWEEP_META.to_json() and ledger.meta().gpu_types is None
        assert ledger.meta().gpu_memory is None and ledger.meta().placement is None


@pytest.mark.parametrize(("key", "value", "fragment"), [
    ("gpu_types", ["A100"], "meta 'gpu_types' is not a dict"),
    ("gpu_types", {"h": 3}, "holds a type that is not a string"),
    ("gpu_memory", {"h": "80GB"}, "holds a size that is not a positive integer")])
def test_a_damaged_type_record_is_one_line(tmp_path, key, value, fragment):
    Ledger.create(tmp_path, SWEEP_META).close()
    db = sqlite3.connect(tmp_path / "ledger.sqlite")
    with db:
        db.execute("INSERT INTO meta VALUES (?, ?)", (key, json.dumps(value)))
    db.close()
    with pytest.raises(UserError, match=fragment):
        Ledger.open(tmp_path)
