"""Opt-in: the GPU paths on this machine's real NVIDIA GPU, which the rest of the suite runs through fakes (NVML's
reading of the GPUs against the nvidia-smi probe of `autotune hosts`, a run with NCCL whose peak memory NVML
measures, a real CUDA out-of-memory judged as one, a tune with the memory model on). Marked `gpu`: deselected by
default (pyproject's addopts), run by `python -m pytest -m gpu tests/test_real_gpu.py`; selected on a machine
without a GPU, its driver or a CUDA build of torch, they are skipped with the reason. benchmarks/gpu_check.sh
checks the same by hand and prints what it saw."""
import json
import shutil
import subprocess
import sys

import pytest
from test_hf_trainer import on_a_free_port

from autotuner.backends.ssh.probe import parse_probe, probe_script
from autotuner.gpu.nvml import Gpu, find_gpus

from cli_rig import ROOT, autotune

pytestmark = pytest.mark.gpu
TRAIN = ROOT / "experiments" / "train.py"
MiB = 1 << 20


@pytest.fixture(scope="module")
def gpus() -> list[Gpu]:
    """This machine's GPUs through NVML; the tests are skipped, saying why, where one cannot run on them."""
    found, why = find_gpus()
    if not found:
        pytest.skip(f"no GPU through NVML ({why})")
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not on the PATH")
    cuda = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                          capture_output=True, text=True, timeout=120)
    if cuda.stdout.strip() != "True":
        pytest.skip(f"this Python's torch cannot use CUDA: {(cuda.stdout + cuda.stderr).strip()[-200:]}")
    return found


def test_nvml_and_the_hosts_probe_read_the_same_gpus(gpus):
    """What `autotune hosts` reads over SSH (nvidia-smi), run here, against what the runner reads (NVML)."""
    out = subprocess.run(["sh", "-c", probe_script(sys.executable)], capture_output=True, text=True, timeout=60)
    probed = parse_probe("localhost", out.stdout)
    assert probed.gpu_error is None and len(probed.gpus) == len(gpus), (probed, gpus)
    for nvml, smi in zip(gpus, probed.gpus, strict=True):
        assert (nvml.index, nvml.uuid, nvml.mig) == (smi.index, smi.uuid, smi.mig)
        if nvml.mig is None:
            assert nvml.memory_total // MiB == smi.memory_total // MiB and nvml.name == smi.name


def test_a_run_on_one_gpu_measures_its_peak_and_an_oversized_micro_batch_is_out_of_memory(tmp_path, gpus):
    sweep = tmp_path / "run.hjson"
    sweep.write_text(json.dumps({
        "name": "gpu", "script": str(TRAIN), "args": ["--steps", "8", "--hidden", "4096"], "num_gpus": 1,
        "timeout": 240, "env": {"NCCL_DEBUG": "INFO"},
        "ds_config": {"gradient_accumulation_steps": 1, "steps_per_print": 1000,
                      "optimizer": {"type": "Adam", "params": {"lr": 0.001, "torch_adam": True}}},
        # 16,777,216 samples x 4,096 activations: 256 GiB for one layer's output, more than any GPU holds.
        "space": {"train_micro_batch_size_per_gpu": [4096, 16777216]}}))
    results = tmp_path / "results"
    ran = autotune("run", sweep, "-o", results, "--include", f"localhost:{gpus[0].slot_id}", "--placement", "memory",
                   "--fail-on", "no-result", timeout=600)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    runs = {r["name"]: r for r in json.loads(autotune("report", results, "--format", "json").stdout)["experiments"]}
    fits, oom = runs["gpu_mbs4096"], runs["gpu_mbs16777216"]
    assert fits["state"] == "succeeded" and fits["metric"] > 0, fits
    assert 0 < (fits["peak_memory"] or 0) <= gpus[0].memory_total, fits  # NVML's reading of the run's processes
    assert (oom["state"], oom["reason"]) == ("failed", "oom") and "out of memory" in oom["detail"].lower(), oom
    logs = "".join(p.read_text(errors="replace") for p in (results / "gpu_mbs4096").glob("std*.log"))
    assert "NCCL INFO" in logs and "terminate called" not in logs


def test_a_tune_on_one_gpu_with_the_memory_model_names_a_best_whose_command_trains(tmp_path, gpus):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({
        "gradient_accumulation_steps": 1, "steps_per_print": 1000, "zero_optimization": {"stage": [0, 3]},
        "optimizer": {"type": "Adam", "params": {"lr": 0.001, "torch_adam": True}},
        "autotuning": {"enabled": True, "metric": "throughput", "start_profile_step": 3, "end_profile_step": 5,
                       "min_train_micro_batch_size_per_gpu": 1024, "max_train_micro_batch_size_per_gpu": 1 << 24}}))
    results = tmp_path / "results"
    tuned = autotune("tune", "--num_gpus", "1", "--include", f"localhost:{gpus[0].slot_id}", "-o", results,
                     "--confirm", "0", "--deadline", "240", TRAIN, "--deepspeed_config", config, "--steps", "8",
                     "--hidden", "1024", timeout=600)
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr
    report = json.loads(autotune("report", results, "--format", "json").stdout)
    runs = {r["name"]: r for r in report["experiments"]}
    profile = runs["train_profile"]
    assert profile["state"] == "succeeded" and profile["metrics"]["num_params"] > 0, profile
    assert "GPUs of" in report["memory"] and report["best"], report["memory"]
    assert any(r["peak_memory"] for r in runs.values())
    command = (results / "cmd_optimal.txt").read_text().strip()
    trained = subprocess.run(["bash", "-c", on_a_free_port(command)], cwd=tmp_path, capture_output=True, text=True,
                             timeout=300)
    assert trained.returncode == 0 and "trained 8 steps" in trained.stdout, trained.stdout[-2000:] + trained.stderr
