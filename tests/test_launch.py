import base64
import json

from autotuner.backends.launch import (
    Launcher,
    deepspeed_command,
    encode_config,
    optimal_command,
    with_autotuning,
    with_config_arg,
    without_autotuning,
)
from autotuner.core import Reservation

from helpers import experiment


def test_config_round_trips_through_urlsafe_base64():
    config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}, "note": "?>?>"}
    encoded = encode_config(config)
    assert "+" not in encoded and "/" not in encoded
    assert json.loads(base64.urlsafe_b64decode(encoded)) == config


def test_autotuning_section_is_injected_and_removable():
    base = {"train_micro_batch_size_per_gpu": 4, "autotuning": {"end_profile_step": 9}}
    tuned = with_autotuning(base, "/r/e/metrics.json", "throughput")
    assert tuned["autotuning"] == {"enabled": True, "metric_path": "/r/e/metrics.json", "metric": "throughput",
                                   "start_profile_step": 3, "end_profile_step": 9}
    assert base["autotuning"] == {"end_profile_step": 9}  # the experiment's own config is untouched
    assert without_autotuning(tuned) == {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1,
                                         "log_level": "info"}
    assert without_autotuning(base) == {"train_micro_batch_size_per_gpu": 4}


def test_deepspeed_prints_its_throughput_every_step_of_a_measured_run():
    """DeepSpeed's per-step throughput lines are the progress of a run that writes no progress file
    (spec/progress.py): asked for every step of the runs a sweep measures (a config's own steps_per_print, the
    example's 1000 among them, would hide every step of the profile window); the config the best run's command
    uses keeps its own."""
    assert with_autotuning({}, "/m.json", "throughput")["steps_per_print"] == 1
    assert with_autotuning({"steps_per_print": 1000}, "/m.json", "throughput")["steps_per_print"] == 1
    for level, runs in (("warning", "info"), (None, "info"), ("debug", "debug"), ("INFO", "INFO")):
        assert with_autotuning({"log_level": level}, "/m.json", "throughput")["log_level"] == runs


def test_config_arg_replaced_or_appended_on_a_fresh_list():
    user = ("--steps", "3", "--deepspeed_config", "ds.json")
    assert with_config_arg(user, "XYZ") == ["--steps", "3", "--deepspeed_config", "XYZ"]
    assert with_config_arg(("--deepspeed_config=a.json",), "XYZ") == ["--deepspeed_config=XYZ"]
    out = with_config_arg(("--steps", "3"), "XYZ")
    assert out == ["--steps", "3", "--deepspeed_config", "XYZ"]
    out.append("mutated")
    assert with_config_arg(("--steps", "3"), "XYZ")[-1] == "XYZ"


def test_command_targets_exactly_the_reserved_slots():
    exp = experiment("z1_mbs4", num_gpus=2, script="/w/train.py", args=("--steps", "3"), env={"A": "1"})
    cmd = deepspeed_command(exp, Reservation.of({"node-b": [1, 3]}), {"x": 1}, hostfile="/r/hostfile",
                            master_port=29555, metric_path="/r/z1_mbs4/metrics.json", tag="s.z1_mbs4.1",
                            cwd="/w", launcher=Launcher(("deepspeed",), "10.0.0.1"), env={"DS_ACCELERATOR": "cpu"})
    argv = list(cmd.argv)
    assert argv[:argv.index("/w/train.py")] == [
        "deepspeed", "--hostfile", "/r/hostfile", "--include", "node-b:1,3", "--no_ssh_check",
        "--master_addr", "10.0.0.1", "--master_port", "29555"]
    assert argv[-2:] == ["--deepspeed_config", encode_config({"x": 1})]
    assert cmd.env == {"DS_ACCELERATOR": "cpu", "A": "1", "AUTOTUNE_TAG": "s.z1_mbs4.1",
                       "AUTOTUNE_METRICS_PATH": "/r/z1_mbs4/metrics.json",
                       "AUTOTUNE_PROGRESS_PATH": "/r/z1_mbs4/progress.jsonl"}
    assert cmd.shell().startswith("cd /w && A=1 AUTOTUNE_METRICS_PATH=")


def test_optimal_command_is_not_pinned_to_slots():
    exp = experiment("best", num_gpus=2, num_nodes=2, script="/w/train.py", args=("--steps", "3"))
    line = optimal_command(exp, "/r/ds_config_optimal.json", env={"DS_ACCELERATOR": "cpu"})
    assert line == ("DS_ACCELERATOR=cpu deepspeed --num_nodes 2 --num_gpus 2 /w/train.py --steps 3 "
                    "--deepspeed_config /r/ds_config_optimal.json")
    assert "--include" not in line


def test_end_profile_step_is_read_from_the_injected_section():
    from autotuner.backends.launch import END_PROFILE_STEP, end_profile_step, with_autotuning

    assert end_profile_step(with_autotuning({}, "/m.json", "throughput")) == END_PROFILE_STEP
    assert end_profile_step(with_autotuning({"autotuning": {"end_profile_step": 9}}, "/m.json", "throughput")) == 9
    assert end_profile_step({}) is None and end_profile_step({"autotuning": {"enabled": False}}) is None
