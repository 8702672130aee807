"""What `autotune run` / `resume` exit with, and `--fail-on`: whether a sweep with failures (an OOM) counts as
failed. Real sweeps through the CLI with stand-in launchers, and the rule itself as a table."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import autotuner
from autotuner.sweep.verdict import FailOn, exit_code

ROOT = Path(__file__).resolve().parent.parent

# OOM for the experiments named in $FAIL (a space-separated list of names); the others write their metric.
LAUNCHER = """\
#!/bin/sh
name=$(basename "$(dirname "$AUTOTUNE_METRICS_PATH")")
for bad in $FAIL; do
  if [ "$name" = "$bad" ]; then echo "torch.OutOfMemoryError: CUDA out of memory" >&2; exit 1; fi
done
printf '{"throughput": %s}\\n' "${name#s_mbs}" > "$AUTOTUNE_METRICS_PATH"
"""


def autotune(*args: object, fail: str = "", cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotuner", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "FAIL": fail}, cwd=cwd, timeout=120)


@pytest.fixture
def sweep(tmp_path) -> tuple[Path, str]:
    """Three experiments (s_mbs1, s_mbs2, s_mbs4) and the --launcher that runs them."""
    (tmp_path / "launcher.sh").write_text(LAUNCHER)
    spec = tmp_path / "s.hjson"
    spec.write_text("{\n  name: s\n  script: /bin/true\n  ds_config: {gradient_accumulation_steps: 1}\n"
                    "  space: {train_micro_batch_size_per_gpu: [1, 2, 4]}\n}\n")
    return spec, f"sh {tmp_path / 'launcher.sh'}"


def run(spec: Path, launcher: str, out: Path, *extra: object, fail: str = "") -> subprocess.CompletedProcess:
    return autotune("run", spec, "--slots", "2", "--launcher", launcher, "--results", out, "--quiet", *extra,
                    fail=fail)


def test_by_default_one_oom_makes_the_sweep_exit_1(sweep, tmp_path):
    spec, launcher = sweep
    result = run(spec, launcher, tmp_path / "out", fail="s_mbs2")
    assert result.returncode == 1, result.stderr
    assert "3 experiments: 1 failed, 2 succeeded" in result.stdout and "best: s_mbs4" in result.stdout
    assert run(spec, launcher, tmp_path / "ok").returncode == 0


def test_fail_on_no_result_exits_0_when_a_best_config_was_written_despite_an_oom(sweep, tmp_path):
    spec, launcher = sweep
    result = run(spec, launcher, tmp_path / "out", "--fail-on", "no-result", fail="s_mbs2")
    assert result.returncode == 0, result.stderr
    best = json.loads((tmp_path / "out" / "ds_config_optimal.json").read_text())
    assert best["train_micro_batch_size_per_gpu"] == 4
    assert "1 failed" in result.stdout  # the failure is still reported; it just does not fail the command


def test_fail_on_no_result_still_exits_1_without_a_result(sweep, tmp_path):
    spec, launcher = sweep
    result = run(spec, launcher, tmp_path / "out", "--fail-on", "no-result", fail="s_mbs1 s_mbs2 s_mbs4")
    assert result.returncode == 1, result.stderr
    assert "no experiment succeeded" in result.stdout
    assert not (tmp_path / "out" / "ds_config_optimal.json").exists()


def test_resume_takes_fail_on_too(sweep, tmp_path):
    spec, launcher = sweep
    assert run(spec, launcher, tmp_path / "out", fail="s_mbs2").returncode == 1
    again = autotune("resume", tmp_path / "out", "--quiet", fail="s_mbs2")
    assert again.returncode == 1, again.stderr
    tolerant = autotune("resume", tmp_path / "out", "--quiet", "--fail-on", "no-result", fail="s_mbs2")
    assert tolerant.returncode == 0, tolerant.stderr


def test_a_bad_fail_on_is_a_usage_error_of_one_line(sweep, tmp_path):
    spec, launcher = sweep
    result = run(spec, launcher, tmp_path / "out", "--fail-on", "some")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "--fail-on" in result.stderr and "no-result" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()
    for command in ("run", "tune", "resume"):  # the choices are listed in --help
        assert "any|no-result" in autotune(command, "--help").stdout


def test_the_api_refuses_an_unknown_policy_before_it_touches_the_sweep(tmp_path):
    with pytest.raises(autotuner.UserError, match="fail_on 'some': choose from any, no-result"):
        autotuner.execute(tmp_path / "nothing", autotuner.Options(fail_on="some"))


@pytest.mark.parametrize(("interrupted", "all_succeeded", "best_written", "fail_on", "expected"), [
    (False, True, True, FailOn.ANY, 0),
    (False, False, True, FailOn.ANY, 1),  # an OOM among successes
    (False, False, False, FailOn.ANY, 1),
    (False, True, True, FailOn.NO_RESULT, 0),
    (False, False, True, FailOn.NO_RESULT, 0),
    (False, False, False, FailOn.NO_RESULT, 1),
    (True, True, True, FailOn.NO_RESULT, 130),  # interrupted is never a success: resume finishes it
    (True, False, False, FailOn.ANY, 130),
])
def test_the_rule(interrupted, all_succeeded, best_written, fail_on, expected):
    assert exit_code(interrupted=interrupted, all_succeeded=all_succeeded, best_written=best_written,
                     fail_on=fail_on) == expected


# A tune's stand-in: a run whose name holds $FAIL fails (not out of memory); the others measure their size.
TUNE_LAUNCHER = """\
#!/bin/sh
name=$(basename "$(dirname "$AUTOTUNE_METRICS_PATH")")
case "$name" in *$FAIL*) echo "ValueError: boom" >&2; exit 1;; esac
mbs=${name#*_mbs}; mbs=${mbs%%_*}
printf '{"throughput": %s}\\n' "$mbs" > "$AUTOTUNE_METRICS_PATH"
"""


def test_tune_takes_fail_on_and_format_as_run_does(tmp_path):
    # The README: every command that prints takes --format; a tune's failed run (a profile run, say) counts for
    # the exit status unless --fail-on no-result.
    (tmp_path / "launcher.sh").write_text(TUNE_LAUNCHER)
    (tmp_path / "train.py").touch()
    (tmp_path / "ds.json").write_text('{"gradient_accumulation_steps": 1, "zero_optimization": {"stage": [0, 1]},\n'
                                      ' "autotuning": {"min_train_micro_batch_size_per_gpu": 1,'
                                      ' "max_train_micro_batch_size_per_gpu": 4}}\n')

    def tune(out: str, *extra: object) -> subprocess.CompletedProcess:
        return autotune("tune", "--slots", "2", "--launcher", f"sh {tmp_path / 'launcher.sh'}", "-o", tmp_path / out,
                        *extra, "train.py", "--deepspeed_config", "ds.json", fail="z1_", cwd=tmp_path)

    strict = tune("strict", "--format", "json")
    assert strict.returncode == 1, strict.stderr
    outcome = json.loads(strict.stdout)  # stdout is the one JSON object, nothing else
    assert outcome["exit_code"] == 1 and outcome["counts"]["failed"] >= 1
    assert outcome["best"]["name"].startswith("train_z0_mbs4") and outcome["confirmed"] is True
    tolerant = tune("tolerant", "--fail-on", "no-result", "--quiet")
    assert tolerant.returncode == 0, tolerant.stderr
    assert "failed" in tolerant.stdout and "best: train_z0_mbs4" in tolerant.stdout
