"""A real Hugging Face Trainer script (experiments/hf_trainer.py: a tiny Llama built in code, synthetic tokens)
tuned end to end through the CLI, as its users run it: `autotune tune` where `deepspeed` stood, the config by
`--deepspeed`, "auto" values the Trainer fills, and the batch sizes handed over as the Trainer's own options
(`arg_mappings`), with the Trainer's `--gradient_checkpointing` searched as a script knob (tune/layout.py). Real
DeepSpeed on CPU, nothing downloaded (offline, an empty Hugging Face cache). Then the winner's cmd_optimal.txt is run
as the README says, as a normal training run.

What only the real Trainer under real DeepSpeed proves, and this keeps: the mapped options and the knob's values are
ones the Trainer's parser takes and trains with, its "auto" values filled, the engine's metrics written and the run
ended after the profile steps, and the winner's command training. One micro-batch size, both knob values on two
slots at once (two DeepSpeed starts, then the winner's): which sizes a lane measures is the search's, proven on the
stand-in (test_layout.py: checkpointing off measured at the largest size unless it could not beat the best)."""
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cli_rig import autotune, env

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "experiments"
STAGE, MBS = 1, 4  # one size: each DeepSpeed start of the Trainer costs 15-25 s of CI's minutes
CHECKPOINTING = ("false", "true")  # the script knob searched: the Trainer's --gradient_checkpointing
STEPS = 12  # past the profile's end (step 5): under autotune the engine ends each run there

pytestmark = pytest.mark.deepspeed  # one real DeepSpeed test at a time (conftest.py)


def offline(tmp_path: Path) -> dict[str, str]:
    """No hub access and an empty cache: a run that needed anything from the Hub would fail."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])  # deepspeed beside it
    return env(HF_HUB_OFFLINE=1, TRANSFORMERS_OFFLINE=1, HF_HOME=tmp_path / "hf-home", PATH=path)


def per_device_batch(log: str) -> list[int]:
    """The per-device batch sizes the Trainer logged when it began to train."""
    return [int(n) for n in re.findall(r"Instantaneous batch size per device = (\d+)", log)]


def on_a_free_port(command: str) -> str:
    """cmd_optimal.txt's `deepspeed` command on a port free now: DeepSpeed's default (29500) may be another run's at
    this moment on a shared machine (EADDRINUSE), and the launcher binds it a moment later."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert "deepspeed " in command, command
    return command.replace("deepspeed ", f"deepspeed --master_port {port} ", 1)


def optimal_command_trains(results: Path, environ: dict[str, str], cwd: Path, mbs: int, steps: int) -> str:
    """cmd_optimal.txt run as the README says (a normal run: all its steps, no autotuning section): it trains
    `steps` steps at micro-batch `mbs`; its stdout."""
    command = (results / "cmd_optimal.txt").read_text().strip()
    assert f"--deepspeed {results / 'ds_config_optimal.json'}" in command
    trained = subprocess.run(["bash", "-c", on_a_free_port(command)], env=environ, cwd=cwd,
                             capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    assert per_device_batch(trained.stdout + trained.stderr) == [mbs]
    assert f"trained {steps} steps of {mbs} samples per device" in trained.stdout
    return trained.stdout


def test_a_trainer_script_is_tuned_end_to_end_and_its_optimal_command_trains(tmp_path):
    config = json.loads((EXAMPLE / "ds_hf.json").read_text())  # narrowed: CI's minutes are few
    config["zero_optimization"]["stage"] = STAGE
    config["autotuning"] |= {"min_train_micro_batch_size_per_gpu": MBS, "max_train_micro_batch_size_per_gpu": MBS,
                             "script_knobs": {"--gradient_checkpointing": [False, True]}}
    (tmp_path / "ds_hf.json").write_text(json.dumps(config, indent=2))
    environ = offline(tmp_path)
    results = tmp_path / "results"
    tuned = autotune("tune", "--slots", "2", "-o", results, "--confirm", "0",
                     "hf_trainer.py", "--deepspeed", tmp_path / "ds_hf.json", "--per_device_train_batch_size", "4",
                     "--gradient_accumulation_steps", "1", "--output_dir", tmp_path / "out", "--max_steps", STEPS,
                     "--report_to", "none", "--save_strategy", "no", "--log_level", "info",
                     environ=environ, cwd=EXAMPLE, timeout=600)
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr

    report = json.loads(autotune("report", results, "--format", "json").stdout)
    runs = {r["parameters"]["--gradient_checkpointing"]: r for r in report["experiments"]}
    # One round on two slots: each checkpointing value at the one size (the lanes' sizes: test_layout.py).
    assert sorted(runs) == sorted(CHECKPOINTING), sorted(runs)
    assert {r["state"] for r in runs.values()} == {"succeeded"}, [(r["name"], r["reason"]) for r in runs.values()]
    for gc, run in runs.items():
        directory = results / run["name"]
        ran = json.loads((directory / "ds_config.json").read_text())
        assert ran["zero_optimization"]["stage"] == STAGE and ran["train_micro_batch_size_per_gpu"] == MBS
        command = (directory / "cmd.txt").read_text()
        assert f"--gradient_checkpointing {gc}" in command and f"_gc{int(gc == 'true')}_" in run["name"]
        assert f"--per_device_train_batch_size {MBS} " in command and "--deepspeed_config" not in command
        assert " --deepspeed " in command and "--gradient_accumulation_steps 1 " in command  # "auto": the user's
        logs = (directory / "stdout.log").read_text() + (directory / "stderr.log").read_text()
        assert per_device_batch(logs) == [MBS], f"{run['name']}: the Trainer did not train at its mapped batch"
        metrics = json.loads((directory / "metrics.json").read_text())  # written by DeepSpeed's engine
        assert metrics["throughput"] > 0 and metrics["latency"] > 0
        assert "trained " not in logs  # the engine ended the run after its profile steps, before the Trainer did

    best = runs[max(runs, key=lambda p: runs[p]["metric"])]
    assert f"best: {best['name']} with throughput" in tuned.stdout
    summary = (results / "summary.txt").read_text()
    assert f"| z{STAGE} " in summary and "| global " in summary and best["name"] in summary
    assert summary.rstrip().splitlines()[-1].startswith("Tuning completed in ")
    optimal = json.loads((results / "ds_config_optimal.json").read_text())
    gc = best["parameters"]["--gradient_checkpointing"]
    assert "autotuning" not in optimal and optimal["zero_optimization"]["stage"] == STAGE
    assert optimal["train_micro_batch_size_per_gpu"] == MBS
    assert optimal["optimizer"]["params"]["lr"] == "auto" and optimal["train_batch_size"] == "auto"  # the Trainer's

    # The README: cmd_optimal.txt trains with the winner as a normal run (all its steps: no autotuning section).
    command = (results / "cmd_optimal.txt").read_text().strip()
    assert f"--per_device_train_batch_size {MBS} " in command and f"--gradient_checkpointing {gc}" in command
    optimal_command_trains(results, environ, tmp_path, MBS, STEPS)
    assert not (tmp_path / "hf-home").exists()  # nothing was fetched into the Hugging Face cache, nor needed
