import json

import pytest

from autotuner.backends.exitstatus import judge_files
from autotuner.core.outcome import classify, judge
from autotuner.spec.metrics import metric_named
from autotuner.states import Reason, State

from cli_rig import PREAMBLE, autotune, env, write_launcher, write_sweep

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


def test_srun_saying_which_task_ended_does_not_hide_why(tmp_path):
    log = write(tmp_path / "stderr.log", "RuntimeError: the rank failed\n"
                "srun: error: n2: task 1: Exited with exit code 1\n"
                "slurmstepd-n1: error: *** STEP 4.1 ON n1 CANCELLED AT 2026-11-26T08:10:16 ***\n"
                "srun: error: n1: task 0: Terminated\n")
    assert classify(143, [log]) == (Reason.EXIT, "RuntimeError: the rank failed")
    unended = write(tmp_path / "unended.log", "RuntimeError: the rank failed\n"
                    "step 3 loss 0.25srun: error: n2: task 1: Exited with exit code 1\n"
                    "srun: error: n1: task 0: Terminated\n")  # a rank's last line had no newline
    assert classify(1, [unended]) == (Reason.EXIT, "RuntimeError: the rank failed")
    alone = write(tmp_path / "alone.log", "srun: error: n1: task 0: Terminated\n")
    assert classify(143, [alone]) == (Reason.EXIT, "srun: error: n1: task 0: Terminated")  # nothing else tells


def test_a_c10d_connection_warning_does_not_hide_a_config_error(tmp_path):
    warning = ("[W socket.cpp:697] [c10d] The client socket has failed to connect to [localhost]:29500 "
               "(errno: 111 - Connection refused).")
    error = "deepspeed.runtime.config.DeepSpeedConfigError: train_micro_batch_size_per_gpu must be positive"
    log = write(tmp_path / "stderr.log", f"{warning}\nTraceback (most recent call last):\n{error}\n{warning}\n")
    assert classify(1, [log]) == (Reason.CONFIG, error)
    only_warning = write(tmp_path / "warning.log", f"{warning}\nValueError: bad\n")
    assert classify(1, [only_warning]) == (Reason.EXIT, "ValueError: bad")  # a c10d warning alone is no launch failure


TEARDOWN = "terminate called without an active exception"


@pytest.mark.parametrize("exit_code", [-6, 134, 250])
def test_metrics_written_then_an_abort_at_exit_is_a_measurement(tmp_path, exit_code):
    """DeepSpeed's autotuning mode ends a run by exit() inside its engine after writing the metrics; a gloo or NCCL
    thread still joinable at exit can then abort the process (SIGABRT: -6, 134 from a shell, 250 through
    DeepSpeed's launcher). The metrics are whole: the run counts, and its detail says how it ended."""
    metrics = write(tmp_path / "metrics.json", json.dumps({"throughput": 10.5, "latency": 3.0}))
    log = write(tmp_path / "stderr.log", f"[INFO] Wrote metrics to {metrics}\n{TEARDOWN}\n"
                                         "[ERROR] launch.py: ... exits with return code = -6\n")
    outcome = judge(exit_code, metrics, THROUGHPUT, [log])
    assert (outcome.state, outcome.metrics["throughput"], outcome.exit_code) == (State.SUCCEEDED, 10.5, exit_code)
    assert "aborted at exit" in outcome.detail and str(exit_code) in outcome.detail


@pytest.mark.parametrize("exit_code, metrics_text, extra, reason", [
    (-6, None, "", Reason.EXIT),  # aborted before it measured: no metrics
    (-6, '{"latency": 3}', "", Reason.EXIT),  # metrics without the metric
    (-6, '{"throughput": 10.5}', "torch.OutOfMemoryError: CUDA out of memory.", Reason.OOM),
    (-6, '{"throughput": 10.5}', "Traceback (most recent call last):\nRuntimeError: NCCL error", Reason.EXIT),
    (1, '{"throughput": 10.5}', "", Reason.EXIT),  # not an abort
    (-11, '{"throughput": 10.5}', "", Reason.EXIT),  # a segfault is not a teardown abort
])
def test_an_abort_is_a_failure_unless_it_came_after_whole_metrics_and_nothing_else_went_wrong(
        tmp_path, exit_code, metrics_text, extra, reason):
    metrics = tmp_path / "metrics.json"
    if metrics_text is not None:
        metrics.write_text(metrics_text)
    log = write(tmp_path / "stderr.log", f"{extra}\n{TEARDOWN}\n")
    outcome = judge(exit_code, metrics, THROUGHPUT, [log])
    assert (outcome.state, outcome.reason) == (State.FAILED, reason)


def test_an_abort_without_the_teardown_line_is_a_failure(tmp_path):
    metrics = write(tmp_path / "metrics.json", json.dumps({"throughput": 10.5}))
    log = write(tmp_path / "stderr.log", "free(): invalid pointer\n")
    assert judge(-6, metrics, THROUGHPUT, [log]).state == State.FAILED


def test_a_run_that_aborts_at_exit_after_its_metrics_counts_through_the_runner(tmp_path):
    """Through the real runner and a stand-in launcher (a shell that writes the metrics, says what C++ says and
    is killed by SIGABRT): x1 wrote its metrics first and counts; x2 aborted before writing any and fails."""
    launcher = write_launcher(tmp_path, PREAMBLE + f"""
if [ "$name" = s_x1 ]; then printf '{{"throughput": 42, "latency": 1.0}}\\n' > "$AUTOTUNE_METRICS_PATH"; fi
echo "{TEARDOWN}" >&2
kill -ABRT $$
""")
    sweep = write_sweep(tmp_path, [1, 2])
    ran = autotune("run", sweep, "--slots", "1", "-o", tmp_path / "res", "--launcher", launcher, "--retries", "0",
                   environ=env(LAUNCH_LOG=tmp_path / "launches"))
    assert ran.returncode == 1, ran.stdout + ran.stderr  # x2 failed
    runs = {r["name"]: r for r in json.loads(autotune("report", tmp_path / "res", "--format", "json").stdout)[
        "experiments"]}
    assert (runs["s_x1"]["state"], runs["s_x1"]["metric"]) == ("succeeded", 42)
    assert "aborted at exit" in runs["s_x1"]["detail"]
    assert (runs["s_x2"]["state"], runs["s_x2"]["reason"]) == ("failed", "exit")


@pytest.mark.parametrize("teardown, state", [(True, State.SUCCEEDED), (False, State.FAILED)])
def test_a_profile_run_that_aborts_at_exit_after_its_model_info_counts(tmp_path, teardown, state):
    """The profile run ends the same way (exit() in the engine's forward, after writing model_info.json)."""
    write(tmp_path / "model_info.json", json.dumps({"num_params": 1000, "trainable_num_params": 10}))
    write(tmp_path / "stderr.log", TEARDOWN + "\n" if teardown else "Segmentation fault\n")
    outcome = judge_files(250, tmp_path, THROUGHPUT)
    assert outcome.state == state
    assert state == State.FAILED or outcome.metrics["trainable_num_params"] == 10
