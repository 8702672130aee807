"""Bad input a hostile tester found past the first two rounds (test_bad_input, test_bad_input_surfaces): bytes
that are not UTF-8, strings no encoder can write, numbers that made a check loop for minutes, config sections
every run would fail on. The rule is the same: exit 2, one line naming the file, line and problem, nothing
written or launched, memory and time bounded."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from test_bad_input import line_of, refused
from test_bad_input_surfaces import STANDIN, config, tune

from autotuner import limits
from autotuner.errors import LINE, one_line
from autotuner.ledger.store import open_sweep
from autotuner.spec import Experiment
from autotuner.spec.launchable import RUNNER_SECTION, launch_problem, may_be_too_long
from autotuner.spec.reading import Budget, read_source
from autotuner.tune.batches import keeping, largest_keeping
from autotuner.tune.memory_model import Facts, Training, bound, budget

from cli_rig import autotune, cli, env

NOT_UTF8 = "r\udcffes"  # how Python hands on the byte 0xff of an argument (surrogateescape)


@pytest.mark.parametrize("where", ["results", "script argument", "status"])
def test_an_argument_that_is_not_utf8_is_one_line_before_anything_is_written(tmp_path, where):
    """Non-UTF-8 bytes in an argument reached the ledger and failed there: a traceback after the results
    directory was made (tune -o), or after the sweep had started (a script's argument)."""
    config(tmp_path)
    if where == "status":
        result = autotune("status", tmp_path / NOT_UTF8, cwd=tmp_path)
    else:
        out, extra = (NOT_UTF8, "--steps") if where == "results" else ("results", NOT_UTF8)
        result = autotune("tune", "--slots", "1", "-o", out, "--launcher", f"sh {STANDIN}", "train.py",
                          "--deepspeed_config", "ds.json", extra,
                          environ=env(OOM_STANDIN_LOG=tmp_path / "launches.log"), cwd=tmp_path, timeout=60)
    refused(result, "argument ", "\\xff", "is not UTF-8 text", tmp_path=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.json", "train.py"]


@pytest.mark.parametrize("value", ['"a\\ud800"', '["ok", "\\udc00 alone"]', '"\\ude00\\ud83d"'])
def test_half_a_utf16_pair_in_a_config_is_located_not_written(tmp_path, value):
    """JSON's `\\ud800` escape parses to a string no encoder can write: tune made its results directory and
    ledger, then failed on the experiment's digest with a traceback."""
    config(tmp_path)
    path = tmp_path / "ds.json"
    path.write_text(path.read_text()[:-1] + f',\n "comment": {value}\n}}')
    refused(tune(tmp_path), f"{path}:{line_of(path, 'comment')}:", "half of a UTF-16 pair", tmp_path=tmp_path)
    assert not (tmp_path / "results").exists()


def test_a_whole_utf16_pair_is_one_character_and_read(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"a": "\\ud83d\\ude00", "b": "\\uD83D\\uDE00"}')
    assert read_source(path, Budget(), "DeepSpeed config").data == {"a": "\U0001F600", "b": "\U0001F600"}


def test_half_a_utf16_pair_in_a_sweep_file_is_located(tmp_path):
    (tmp_path / "train.py").touch()
    path = tmp_path / "sweep.hjson"
    path.write_text('{\n  script: train.py\n  name: "s\\udfff"\n  ds_config: {}\n}\n')
    refused(autotune("plan", "--slots", "1", path, cwd=tmp_path), f"{path}:3:", "half of a UTF-16 pair")


@pytest.mark.parametrize("key, value", [("train_batch_size", 10 ** 15 + 1), ("gradient_accumulation_steps", 10 ** 12),
                                        ("gradient_accumulation_steps", [1, 10 ** 10])])
def test_batch_numbers_past_what_is_meant_are_located(tmp_path, key, value):
    """A train_batch_size of 10^15 + 1 over two GPUs looped over every size below it looking for one that keeps
    it (hours); the batch keys are bounded as the autotuning section's whole numbers are."""
    path = config(tmp_path, {"max_train_micro_batch_size_per_gpu": None}, {key: value})
    refused(tune(tmp_path, "--slots", "2", "--num_gpus", "2"), f"{path}:{line_of(path, key)}:", key,
            "at most 1,000,000,000", tmp_path=tmp_path)


def test_a_batch_with_few_divisors_below_a_large_bound_is_found_from_its_divisors(tmp_path):
    """train_batch_size 2 x 499,999,993 (a prime) with sizes up to 8 x 10^8: the sizes that keep it are 1, 2 and
    the prime, found from the batch's divisors; trying every size down from the bound (and listing them all for
    the end of tune's note) took minutes and gigabytes."""
    config(tmp_path, {"max_train_micro_batch_size_per_gpu": 800_000_000}, {"train_batch_size": 2 * 499_999_993,
                                                                          "zero_optimization": {"stage": 1}})
    result = tune(tmp_path, "--slots", "1")
    assert result.returncode == 0, result.stderr
    assert "micro-batch sizes 1, 2, 499999993; 799999997 size(s) from 1 to 800000000 skipped" in result.stdout


@pytest.mark.parametrize("batch, dp, low, high, largest, every", [
    (12, 1, 1, 12, 12, [1, 2, 3, 4, 6, 12]), (12, 2, 1, 5, 3, [1, 2, 3]), (12, 5, 1, 12, None, []),
    (36, 1, 5, 8, 6, [6]), (36, 1, 7, 8, None, []), (49, 1, 2, 48, 7, [7]), (1, 1, 1, 1, 1, [1])])
def test_the_sizes_that_keep_a_batch_are_its_divisors(batch, dp, low, high, largest, every):
    assert largest_keeping(batch, dp, low, high) == largest
    assert keeping(batch, dp, low, high) == every
    assert every == [m for m in range(low, high + 1) if batch % (m * dp) == 0]


@pytest.mark.parametrize(("zero", "key", "fragment"), [
    ({"stage": 2, "offload_optimizer": "cpu"}, "offload_optimizer", "must be an object"),
    ({"stage": 2, "offload_optimizer": [{"device": "cpu"}]}, "offload_optimizer", "must be an object"),
    ({"stage": 3, "offload_param": {"device": "gpu"}}, "device", "device 'gpu': one of none, cpu, nvme"),
    ({"stage": 3, "offload_param": {"device": None}}, "device", "device null"),
    ({"stage": 3, "offload_param": {"device": "nvme"}}, "offload_param", "nvme needs nvme_path"),
    ({"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": 5}}, "nvme_path", "nvme needs nvme_path"),
])
def test_an_offload_section_every_run_would_fail_on_is_located(tmp_path, zero, key, fragment):
    """`offload_optimizer: "cpu"` was accepted: every run failed in DeepSpeed's engine, and the search took the
    failures for "nothing fits" and went on to offload levels built on the broken section."""
    path = config(tmp_path, extra={"zero_optimization": zero})
    refused(tune(tmp_path, "--slots", 1), f"{path}:{line_of(path, key)}:", fragment, tmp_path=tmp_path)
    assert not (tmp_path / "launches.log").exists()


@pytest.mark.parametrize("section", [None, {"device": "none"}, {"device": "cpu", "pin_memory": True}])
def test_an_offload_section_deepspeed_takes_is_tuned(tmp_path, section):
    config(tmp_path, extra={"zero_optimization": {"stage": 2, "offload_optimizer": section}})
    result = tune(tmp_path, "--slots", 1)
    assert result.returncode == 0, result.stderr


def test_cancel_of_thousands_of_unknown_names_is_one_short_line(tmp_path):
    """`autotune cancel DIR x1 ... x3000` listed every unknown name: one line of 17,000 characters."""
    results = tmp_path / "results"
    sweep = tmp_path / "sweep.hjson"
    (tmp_path / "train.py").touch()
    sweep.write_text("{\n  script: train.py\n  ds_config: {}\n  space: {train_micro_batch_size_per_gpu: [1]}\n}\n")
    launcher = tmp_path / "ok.sh"
    launcher.write_text('#!/bin/sh\nprintf \'{"throughput": 1}\' > "$AUTOTUNE_METRICS_PATH"\n')
    assert autotune("run", "--slots", "1", "-q", "-o", results, "--launcher", f"sh {launcher}", sweep,
                    cwd=tmp_path).returncode == 0
    names = [f"x{i}" for i in range(3000)]
    line = refused(autotune("cancel", results, *names, cwd=tmp_path), f"{results}: no experiment named x0, x1,",
                   "x9 and 2990 more in this sweep")
    assert len(line) < 200


@pytest.mark.parametrize("text", ["short", "a\nb\rc", "x" * 479, "y" * 5000, "start " + "z" * 2000 + " end"])
def test_an_error_is_one_bounded_line_whatever_its_message_joins(text):
    line = one_line(text)
    assert "\n" not in line and "\r" not in line and len(line) <= LINE
    if len(text) < LINE:
        assert line == " ".join(text.split())
    else:
        assert line.startswith(text[:100]) and line.endswith(text[-50:])


@pytest.mark.parametrize(("extra", "fragment"), [
    ('env: {A: "' + "a" * 140_000 + '"}', "env A is more than the OS takes in one variable (128 KiB)"),
    ('args: ["--x", "' + "a" * 140_000 + '"]', "an argument of 137 KiB is more than the OS takes in one"),
    ('ds_config: {pad: "' + "é" * 20_000 + '"}', "its ds_config, 117 KiB as JSON, is handed to the script as one "
                                               "base64 argument"),
], ids=["env", "args", "ds_config"])
def test_an_experiment_the_os_would_not_start_is_refused_before_the_sweep(tmp_path, extra, fragment):
    """Linux refuses one argument or environment string over 128 KiB: each such sweep started, then failed every
    attempt (retries too) with "Argument list too long"."""
    (tmp_path / "train.py").touch()
    path = tmp_path / "sweep.hjson"
    path.write_text("{\n  script: train.py\n" + ("" if "ds_config" in extra else "  ds_config: {}\n") +
                    f"  {extra}\n}}\n")
    launcher = tmp_path / "ok.sh"
    launcher.write_text('#!/bin/sh\nprintf \'{"throughput": 1}\' > "$AUTOTUNE_METRICS_PATH"\n')
    result = autotune("run", "--slots", "1", "-o", tmp_path / "results", "--launcher", f"sh {launcher}", path,
                      cwd=tmp_path)
    refused(result, f"{path}: experiment sweep: ", fragment, tmp_path=tmp_path)


def test_a_tune_config_the_os_would_not_take_as_an_argument_is_refused(tmp_path):
    path = config(tmp_path, extra={"pad": "x" * 100_000})
    refused(tune(tmp_path, "--slots", 1), f"{path}: experiment train_z1_mbs1: ", "its ds_config, 98 KiB as JSON",
            tmp_path=tmp_path)
    assert not (tmp_path / "launches.log").exists()


def test_a_config_just_under_the_limit_still_launches():
    config_bytes = limits.ARGUMENT * 3 // 4 - RUNNER_SECTION - 100
    base = Experiment("e", {"pad": ""}, 1, 1, "/t.py")
    pad = config_bytes - len(json.dumps(base.ds_config))
    assert launch_problem(Experiment("e", {"pad": "x" * pad}, 1, 1, "/t.py")) is None
    assert launch_problem(Experiment("e", {"pad": "x" * (pad + 4000)}, 1, 1, "/t.py")) is not None
    assert not may_be_too_long(10_000) and may_be_too_long(20_000)


def tiny_sweep(tmp_path: Path, more: str = "") -> tuple[Path, Path]:
    """A sweep file of an empty script (`more`: its further lines) and a launcher that writes its metrics at once."""
    (tmp_path / "train.py").touch()
    sweep = tmp_path / "sweep.hjson"
    sweep.write_text("{\n  script: train.py\n  ds_config: {}" + more + "\n}\n")
    launcher = tmp_path / "ok.sh"
    launcher.write_text('#!/bin/sh\nprintf \'{"throughput": 1}\' > "$AUTOTUNE_METRICS_PATH"\n')
    return sweep, launcher


def test_stdout_that_cannot_be_written_is_one_note_never_a_traceback(tmp_path):
    """`autotune report DIR > /dev/full` (and status, compare, --help, ...) ended in a traceback; `run` in one after
    it had made its results directory, before it launched anything. Now one note, the command goes on: a sweep
    ends as it would (its exit status), a command whose output is its product exits 1."""
    results = tmp_path / "results"
    sweep, launcher = tiny_sweep(tmp_path, "\n  space: {train_micro_batch_size_per_gpu: [1, 2]}")
    note = "autotune: note: stdout cannot be written (No space left on device): what this command prints is left out"
    for args, code in ((("run", "--slots", "1", "-o", results, "--launcher", f"sh {launcher}", sweep), 0),
                       (("status", results), 1), (("report", results, "--format", "json"), 1),
                       (("compare", results, results), 1), (("--help",), 1)):
        with open("/dev/full", "w") as full:
            done = subprocess.run(cli(*args), env=env(), stdout=full, stderr=subprocess.PIPE, text=True, timeout=120,
                                  cwd=tmp_path)
        assert done.stderr.splitlines() == [note], (args, done.stderr)
        assert done.returncode == code, (args, done.returncode)
    with open_sweep(results) as ledger:
        assert sorted(a.state.value for a in ledger.latest()) == ["succeeded", "succeeded"]


@pytest.mark.parametrize(("key", "value", "fragment"), [
    ("enabled", "no", "enabled must be true or false, not 'no'"), ("overwrite", 1, "overwrite must be true or false"),
    ("results_dir", 5, "results_dir must be a path (a string), not 5"), ("exps_dir", [], "exps_dir must be a path")])
def test_deepspeed_bookkeeping_keys_of_the_wrong_kind_are_located(tmp_path, key, value, fragment):
    """`"enabled": "no"` was accepted and tuned anyway: the section's keys are read as typed, never ignored."""
    path = config(tmp_path, {key: value})
    refused(tune(tmp_path, "--slots", 1), f"{path}:{line_of(path, key)}:", fragment, tmp_path=tmp_path)


@pytest.mark.parametrize("activation", [1e-300, 1e-3, 5e-324])
def test_an_activation_figure_below_a_byte_bounds_the_size_not_overflows(activation):
    """`model_info.activation_mem_per_gpu: 1e-300` (or a slope the loop measured that small) made the largest
    size infinite: tune failed with a traceback (OverflowError) before it wrote anything."""
    found = bound(Facts(10 ** 6, activation), Training(), 1, 80 << 30, 1)
    assert found.largest == limits.COUNT


def test_an_activation_figure_in_bytes_still_divides_as_before():
    assert bound(Facts(1, 1 << 20), Training(), 0, 80 << 30, 1).largest == int((budget(80 << 30) - 16) // (1 << 20))


@pytest.mark.parametrize("target", ["ledger.sqlite", "summary.txt"])
def test_an_output_through_a_link_to_a_sweeps_own_file_is_refused(tmp_path, target):
    """`resume DIR --events LINK`, LINK a link to DIR/ledger.sqlite, was accepted: a resume that ran anything
    would have appended its events to the ledger. A sweep's own files are found where links lead."""
    results = tmp_path / "results"
    sweep, launcher = tiny_sweep(tmp_path)
    assert autotune("run", "--slots", "1", "-q", "-o", results, "--launcher", f"sh {launcher}", sweep,
                    cwd=tmp_path).returncode == 0
    link = tmp_path / "events.jsonl"
    link.symlink_to(results / target)
    ledger = (results / "ledger.sqlite").read_bytes()
    refused(autotune("resume", results, "--events", link, cwd=tmp_path), f"{link}: is one of the sweep's own files")
    refused(autotune("plan", "--slots", "1", "--duration", "1", "--plot", link, sweep, cwd=tmp_path),
            f"{link}: is one of the sweep's own files")
    assert (results / "ledger.sqlite").read_bytes() == ledger


@pytest.mark.parametrize(("space", "fragment"), [
    ('{"' + ".".join(["a"] * 5000) + '": [1, 2]}', "nests 5000 levels, more than 64, the limit"),
    ('{"a.b": [1, 2], "a": [{"b": 3}, {"c": 4}]}', "space keys 'a' and 'a.b' overlap"),
    ('{"zero_optimization": [{"stage": 1}], "zero_optimization.stage": [2, 3]}',
     "space keys 'zero_optimization' and 'zero_optimization.stage' overlap"),
], ids=["deep", "overlap", "overlap-after"])
def test_space_keys_that_build_no_sane_config_are_located(tmp_path, space, fragment):
    """A space key of 5,000 dotted segments built a config 5,000 levels deep: plan and run failed with a
    RecursionError traceback of 3,000 lines. Keys where one holds the other (`a`, `a.b`) made experiments
    alike under two names (the one set last undoes the other)."""
    (tmp_path / "train.py").touch()
    path = tmp_path / "sweep.hjson"
    path.write_text(f"{{\n  script: train.py\n  ds_config: {{}}\n  space: {space}\n}}\n")
    refused(autotune("plan", "--slots", "1", "--duration", "1", path, cwd=tmp_path), f"{path}:4:", fragment)


def test_sibling_space_keys_are_no_overlap(tmp_path):
    (tmp_path / "train.py").touch()
    path = tmp_path / "sweep.hjson"
    path.write_text('{\n  script: train.py\n  ds_config: {}\n  space: {"zero_optimization.stage": [1, 2], '
                    '"zero_optimization.reduce_bucket_size": [5, 6], "zero": [1], "--zero_optimization.x": [1]}\n}\n')
    assert autotune("plan", "--slots", "1", "--duration", "1", path, cwd=tmp_path).returncode == 0


def test_runs_that_only_crash_do_not_send_the_search_to_offload(tmp_path):
    """A script that fails at once (no run out of memory) failed each stage, then the search went on to offload
    the optimizer and ran every stage again, `_oo`, to fail the same way: runs spent on nothing offload changes."""
    config(tmp_path)
    failing = tmp_path / "fail.sh"
    failing.write_text("#!/bin/sh\necho 'ImportError: no module named mylib' >&2\nexit 1\n")
    result = autotune("tune", "--slots", "1", "-o", tmp_path / "results", "--launcher", f"sh {failing}", "train.py",
                      "--deepspeed_config", "ds.json", cwd=tmp_path, timeout=60)
    assert result.returncode == 1, result.stderr
    ran = sorted(p.name for p in (tmp_path / "results").iterdir() if (p / "exp.json").exists())
    assert ran == ["train_z1_mbs8", "train_z2_mbs8"]


def test_a_nul_in_a_swept_script_option_is_located(tmp_path):
    """`args` holding a NUL were refused, a swept option's value holding one was not: the sweep started and every
    launch of it failed ("embedded null byte")."""
    (tmp_path / "train.py").touch()
    path = tmp_path / "sweep.hjson"
    path.write_text('{\n  script: train.py\n  ds_config: {}\n  space: {"--tag": ["a\\u0000b", "c"]}\n}\n')
    refused(autotune("plan", "--slots", "1", "--duration", "1", path, cwd=tmp_path), f"{path}:4:",
            "space key --tag: a value holds a NUL character")
