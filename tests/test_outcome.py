import json

import pytest

from autotuner.core.outcome import classify, judge
from autotuner.spec.metrics import metric_named
from autotuner.states import Reason, State

THROUGHPUT = metric_named("throughput")


def write(path, text):
    path.write_text(text)
    return path


def test_success_needs_exit_zero_and_valid_metrics(tmp_path):
    metrics = write(tmp_path / "metrics.json", json.dumps({"throughput": 10.5, "latency": 3.0}))
    outcome = judge(0, metrics, THROUGHPUT, [])
    assert outcome.state == State.SUCCEEDED and outcome.metrics["throughput"] == 10.5
    assert judge(1, metrics, THROUGHPUT, []).state == State.FAILED  # metrics alone are not success


@pytest.mark.parametrize("content", [None, "not json", "[1]", '{"latency": 3}', '{"throughput": "fast"}'])
def test_exit_zero_without_valid_metrics_is_a_metrics_failure(tmp_path, content):
    path = tmp_path / "metrics.json"
    if content is not None:
        path.write_text(content)
    outcome = judge(0, path, THROUGHPUT, [])
    assert (outcome.state, outcome.reason) == (State.FAILED, Reason.METRICS)
    assert outcome.detail


@pytest.mark.parametrize("line, reason", [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", Reason.OOM),
    ("MemoryError", Reason.OOM),
    ("RuntimeError: The server socket has failed to listen on any local network address. "
     "port: 29500, useIPv6: 0, code: -98, name: EADDRINUSE, message: address already in use", Reason.LAUNCH),
    ("bash: deepspeed: command not found", Reason.LAUNCH),
    ("AssertionError: Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
     "gradient_acc_step * world_size 16 != 4 * 1 * 2", Reason.CONFIG),
    ("train.py: error: unrecognized arguments: --bogus", Reason.CONFIG),
])
def test_failures_are_classified_with_the_telling_line(tmp_path, line, reason):
    log = write(tmp_path / "stderr.log", f"noise\nTraceback (most recent call last):\n{line}\nmore noise\n")
    got, telling = classify(1, [log])
    assert got == reason and telling == line.strip()[:300]


def test_unknown_failures_keep_the_last_error_line(tmp_path):
    log = write(tmp_path / "stderr.log", "ok\nValueError: something odd\nbye\n")
    assert classify(3, [log]) == (Reason.EXIT, "ValueError: something odd")
    assert classify(127, [tmp_path / "missing.log"])[0] == Reason.LAUNCH


def test_a_c10d_connection_warning_does_not_hide_a_config_error(tmp_path):
    warning = ("[W socket.cpp:697] [c10d] The client socket has failed to connect to [localhost]:29500 "
               "(errno: 111 - Connection refused).")
    error = "deepspeed.runtime.config.DeepSpeedConfigError: train_micro_batch_size_per_gpu must be positive"
    log = write(tmp_path / "stderr.log", f"{warning}\nTraceback (most recent call last):\n{error}\n{warning}\n")
    assert classify(1, [log]) == (Reason.CONFIG, error)
    only_warning = write(tmp_path / "warning.log", f"{warning}\nValueError: bad\n")
    assert classify(1, [only_warning]) == (Reason.EXIT, "ValueError: bad")  # a c10d warning alone is no launch failure
