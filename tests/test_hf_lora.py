"""Frozen parameters, for real: LoRA fine-tuning (experiments/hf_lora.py: a tiny Llama built in code, adapters
added by `peft`, the Hugging Face Trainer under DeepSpeed on CPU) tuned by `autotune tune` with its memory model on.
The GPUs are fake, named as such: the hostfile's CPU slots state a type of 1.25 GB (`gpu=FAKE-CPU-1.25GB`), so
the memory model bounds the search while real DeepSpeed runs on CPU. The model's facts come from the profile run
(DeepSpeed's engine counts the parameters that require gradients apart), and at that size every stage fits only
because the frozen weights have no gradients or optimizer states: counted as all trainable, every stage tuned
would be skipped (with one GPU an experiment, every stage holds the same). Two DeepSpeed starts, one after the
other (the profile run, then the stage tuned): the winner's cmd_optimal.txt training as a normal run is
test_hf_trainer.py's (the same Trainer under DeepSpeed; each start costs 15-25 s of CI's minutes)."""
import json
import re

import pytest
from test_hf_trainer import EXAMPLE, offline

from autotuner.gpu.types import size_of_type
from autotuner.tune.memory_model import Facts, Training, bound

from cli_rig import autotune

GPU = "FAKE-CPU-1.25GB"  # a fake GPU: 1.25e9 bytes, 176 MB of it usable past the headroom (1 GiB)
STAGE, MBS = 2, 4  # one experiment: each DeepSpeed start costs 10-20 s here (imports, the engine)
STEPS = 6  # past the profile's end (step 5): the engine ends each run there
# 17.7e6 parameters (the embeddings and the head of a 32,000-token vocabulary), 8,192 of them trainable (rank-4
# adapters on q_proj and v_proj of 2 layers); 16 tokens a sample keep the activations a few MB a sample.
MODEL = ("--vocab_size", "32000", "--hidden_size", "256", "--num_layers", "2", "--seq_len", "16")

pytestmark = pytest.mark.deepspeed  # one real DeepSpeed test at a time (conftest.py)


def test_a_lora_model_is_tuned_counting_only_its_trainable_parameters_and_its_optimal_command_trains(tmp_path):
    config = json.loads((EXAMPLE / "ds_hf.json").read_text())
    config["zero_optimization"]["stage"] = [STAGE]
    config["autotuning"] |= {"min_train_micro_batch_size_per_gpu": MBS, "max_train_micro_batch_size_per_gpu": MBS}
    (tmp_path / "ds_hf.json").write_text(json.dumps(config, indent=2))
    (tmp_path / "hostfile").write_text(f"localhost slots=1 accelerator=cpu gpu={GPU}\n")
    environ = offline(tmp_path)
    results = tmp_path / "results"
    tuned = autotune("tune", "--hostfile", tmp_path / "hostfile", "--num_gpus", "1", "-o", results, "--confirm", "0",
                     "hf_lora.py", "--deepspeed", tmp_path / "ds_hf.json", "--per_device_train_batch_size", "4",
                     "--gradient_accumulation_steps", "1", "--output_dir", tmp_path / "out", "--max_steps", STEPS,
                     "--report_to", "none", "--save_strategy", "no", "--log_level", "info", *MODEL,
                     environ=environ, cwd=EXAMPLE, timeout=600)
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr

    # The profile run came first and DeepSpeed's engine counted what peft froze: the same counts as peft's own.
    report = json.loads(autotune("report", results, "--format", "json").stdout)
    runs = {r["name"]: r for r in report["experiments"]}
    profile = runs.pop("hf_lora_profile")
    assert profile["state"] == "succeeded"
    printed = (results / "hf_lora_profile" / "stdout.log").read_text()
    total, trainable = map(int, re.search(r"parameters: (\d+) \((\d+) trainable\)", printed).groups())
    assert profile["metrics"]["num_params"] == total and profile["metrics"]["trainable_num_params"] == trainable
    assert 0 < trainable < total // 1000  # LoRA: the adapters are a tiny share
    assert f"{total} parameters ({trainable} trainable)" in report["memory"]

    # The stage tuned ran (not skipped) ...
    assert list(runs) == [f"hf_lora_z{STAGE}_mbs{MBS}"] and runs[f"hf_lora_z{STAGE}_mbs{MBS}"]["state"] == "succeeded"
    ran = json.loads((results / f"hf_lora_z{STAGE}_mbs{MBS}" / "ds_config.json").read_text())
    assert ran["zero_optimization"]["stage"] == STAGE and ran["train_micro_batch_size_per_gpu"] == MBS
    assert "skipped" not in report["memory"] and f"z{STAGE} up to micro-batch" in report["memory"]
    # ... where the same model with every parameter counted as trainable skips it: its states alone are more
    # than the fake GPU holds past its headroom, while the trainable count leaves room for the micro-batch.
    gpu_memory = size_of_type(GPU)
    per_sample = profile["metrics"]["activation_mem_per_gpu"] / MBS
    training = Training.of(config)
    assert not bound(Facts(total, per_sample), training, STAGE, gpu_memory, dp=1).fits
    counted_apart = bound(Facts(total, per_sample, trainable=trainable), training, STAGE, gpu_memory, dp=1)
    assert counted_apart.largest is None or counted_apart.largest >= MBS

    # The tuned run trained the adapters over the frozen weights; the winner's command is that config, as a normal run.
    assert f"parameters: {total} ({trainable} trainable)" in \
        (results / f"hf_lora_z{STAGE}_mbs{MBS}" / "stdout.log").read_text()
    optimal = json.loads((results / "ds_config_optimal.json").read_text())
    assert "autotuning" not in optimal
    assert optimal["zero_optimization"]["stage"] == STAGE and optimal["train_micro_batch_size_per_gpu"] == MBS
    command = (results / "cmd_optimal.txt").read_text()
    assert "hf_lora.py" in command and f"--deepspeed {results / 'ds_config_optimal.json'}" in command
    assert not (tmp_path / "hf-home").exists()  # nothing fetched from the Hugging Face Hub
