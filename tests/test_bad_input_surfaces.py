"""Bad input on the surfaces added after the first hardening (issue 21): `tune` and its `autotuning` section,
`plan`, `--slurm`, and the outputs of every command. The rule is test_bad_input's: exit 2, one line naming the
file, line and problem, nothing written or launched, memory and time bounded.

Slurm's ordering is shown without a cluster: a fake `sbatch` on PATH records being called (and refuses, as Slurm
does a bad partition): a check that needs no cluster must come first, so it is never called for them.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from test_bad_input import OK_STANDIN, line_of, refused
from test_mig import TYPE_2G, mixed_machine

import autotuner
from autotuner import UserError
from autotuner.backends.slurm.allocation import COMMAND_TIMEOUT, TIMEOUT_ENV, command_timeout
from autotuner.backends.slurm.watch import POLL, POLL_ENV, poll_interval
from autotuner.gpu.types import size_of_type
from autotuner.spec.reading import Budget, read_source

from cli_rig import autotune, cli, env, write_launcher

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "oom_standin.sh"
MEMORY_LIMIT = 2 << 30  # address space for the CLI where an input could make it read without end


def config(tmp_path: Path, autotuning: dict | None = None, extra: dict | None = None, name: str = "ds.json") -> Path:
    """train.py and a DeepSpeed config with an autotuning section, one key a line (for the lines errors name)."""
    (tmp_path / "train.py").write_text("# stand-in: the launcher never runs it\n")
    ds = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": [1, 2]},
          "autotuning": {"enabled": True, "max_train_micro_batch_size_per_gpu": 8} | (autotuning or {})} | (
              extra or {})
    path = tmp_path / name
    path.write_text(json.dumps(ds, indent=1))
    return path


def tune(tmp_path: Path, *options: object, config_option: str = "--deepspeed_config", name: str = "ds.json",
         environ: dict | None = None) -> subprocess.CompletedProcess:
    return autotune("tune", *options, "-o", tmp_path / "results", "--launcher", f"sh {STANDIN}", "train.py",
                    config_option, name, environ=environ or env(OOM_STANDIN_LOG=tmp_path / "launches.log"),
                    cwd=tmp_path, timeout=60)


def bounded(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    """The CLI with its address space capped: an input read without a bound ends in MemoryError, not in a
    machine out of memory."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    return subprocess.run(cli(*args), env=env(), capture_output=True, text=True, timeout=60, cwd=cwd,
                          preexec_fn=cap)


# --- files a config names: the one bounded reader ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["device", "pipe", "directory", "huge"])
def test_a_model_info_path_is_read_as_every_input_is(tmp_path, kind):
    """/dev/zero grew the process until MemoryError; a FIFO with no writer hung `tune` for ever."""
    fifo, huge = tmp_path / "info.fifo", tmp_path / "huge.json"
    os.mkfifo(fifo)
    with open(huge, "wb") as f:
        f.truncate(4 << 30)  # sparse
    named = {"device": "/dev/zero", "pipe": str(fifo), "directory": str(tmp_path), "huge": str(huge)}[kind]
    said = {"device": "a device", "pipe": "a pipe", "directory": "a directory", "huge": "larger than 1 MiB"}[kind]
    path = config(tmp_path, {"model_info_path": named})
    result = bounded("tune", "--slots", 1, "-o", tmp_path / "results", "train.py", "--deepspeed_config", path,
                     cwd=tmp_path)
    refused(result, f"{path}:{line_of(path, 'model_info_path')}:", "model_info_path", said, tmp_path=tmp_path)


def test_a_model_info_file_that_is_not_json_or_holds_nan_is_located(tmp_path):
    info = tmp_path / "info.json"
    info.write_text('{"num_params": 1000,\n "activation_mem_per_gpu": NaN}\n')
    path = config(tmp_path, {"model_info_path": "info.json"})
    line = refused(tune(tmp_path, "--slots", 1), f"{path}:{line_of(path, 'model_info_path')}:", "(line 2)", "NaN",
                   tmp_path=tmp_path)
    assert "info.json" in line
    info.write_text('{"num_params": 1' + "0" * 400 + "}")  # a whole number no float holds
    refused(tune(tmp_path, "--slots", 1), f"{path}:", "num_params", "10^15", tmp_path=tmp_path)


# --- numbers at the edge -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("word", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_nan_and_infinity_in_a_json_config_are_located_at_their_line(tmp_path, word):
    """hjson read `NaN,` as a string (a tune ran with it), or refused it at the end of the file."""
    path = tmp_path / "ds.json"
    config(tmp_path)
    text = json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0,
                       "zero_optimization": {"stage": 1}}, indent=1).replace("1.0", word)
    path.write_text(text)
    fragment = "out of range" if word == "1e999" else f"{word} is not a number"
    refused(tune(tmp_path, "--slots", 1), f"{path}:{line_of(path, 'gradient_clipping')}:", fragment,
            tmp_path=tmp_path)
    sweep = tmp_path / "sweep.hjson"
    sweep.write_text("{\n  script: train.py\n  ds_config: ds.json\n}\n")  # a sweep's ds_config file: the same
    refused(autotune("run", sweep, "--slots", 1, "-o", tmp_path / "results"),
            f"{path}:{line_of(path, 'gradient_clipping')}:", fragment, tmp_path=tmp_path)


def test_nan_in_a_string_is_no_number(tmp_path):
    config(tmp_path, extra={"note": "NaN Infinity 1e999"})
    result = tune(tmp_path, "--slots", 1, "--confirm", 0)
    assert result.returncode in (0, 1) and "not a number" not in result.stderr, result.stderr


@pytest.mark.parametrize(("value", "fragment"), [("1e300", "from 0 to 10"), ("nan", "nan"), ("inf", "inf"),
                                                  ("-1", "-1")])
def test_plan_spread_at_the_edge_is_refused(tmp_path, value, fragment):
    """1e300 overflowed the draws: makespans of 0 s against a 10-minute lower bound."""
    (tmp_path / "train.py").touch()
    sweep = tmp_path / "sweep.hjson"
    sweep.write_text("{\n  script: train.py\n  ds_config: {}\n  space: {x: [1, 2, 3]}\n}\n")
    refused(autotune("plan", sweep, "--slots", 2, "--spread", value), "--spread", fragment)


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1001"])
def test_min_improvement_at_the_edge_says_what_it_takes(tmp_path, value):
    """nan was refused with a message about the upper bound."""
    config(tmp_path)
    line = refused(tune(tmp_path, "--slots", 1, "--min-improvement", value), "--min-improvement",
                   "from 0 to 1000", tmp_path=tmp_path)
    assert value in line


@pytest.mark.parametrize(("section", "key"), [
    ({"max_train_micro_batch_size_per_gpu": 10 ** 30}, "max_train_micro_batch_size_per_gpu"),
    ({"tuner_num_trials": 10 ** 12}, "tuner_num_trials"),
    ({"model_info": {"num_params": 10 ** 400}}, "num_params"),
    ({"model_info": {"num_params": 10, "activation_mem_per_gpu": 1e300}}, "activation_mem_per_gpu"),
])
def test_autotuning_numbers_past_what_is_meant_are_located(tmp_path, section, key):
    path = config(tmp_path, section)
    refused(tune(tmp_path, "--slots", 1), f"{path}:{line_of(path, key)}:", key, tmp_path=tmp_path)


# --- one rule for arg_mappings, in sweep files and tune ------------------------------------------------------------


@pytest.mark.parametrize(("flag", "mappings", "fragment"), [
    ("--deepspeed", {"train_micro_batch_size_per_gpu": "--deepspeed"}, "the option the config itself"),
    ("--deepspeed_config", {"train_micro_batch_size_per_gpu": "--deepspeed_config"}, "the option the config itself"),
    ("--deepspeed", {"train_micro_batch_size_per_gpu": "--deepspeed_config"}, "DeepSpeed's own config option"),
    ("--deepspeed_config", {"train_micro_batch_size_per_gpu": "--bs", "gradient_accumulation_steps": "--bs"},
     "hands both"),
])
def test_arg_mappings_follow_one_rule_in_sweep_files_and_tune(tmp_path, flag, mappings, fragment):
    """Mapped onto the config option, every run got the script's own batch size while its config said
    another (a Trainer script failed all runs but one); tune took what a sweep file refused."""
    path = config(tmp_path, {"arg_mappings": mappings})
    needle = f'"{list(mappings)[-1]}": "'  # the mapping's line, not the config's own key
    where = f"{path}:{line_of(path, needle)}:"
    refused(tune(tmp_path, "--slots", 1, config_option=flag), where, fragment, tmp_path=tmp_path)
    assert not (tmp_path / "launches.log").exists()
    sweep = tmp_path / "sweep.hjson"
    sweep.write_text(json.dumps({"script": "train.py", "config_flag": flag, "arg_mappings": mappings,
                                 "ds_config": {"train_micro_batch_size_per_gpu": 1}}, indent=1))
    refused(autotune("run", sweep, "--slots", 1, "-o", tmp_path / "results"),
            f"{sweep}:{line_of(sweep, needle)}:", fragment, tmp_path=tmp_path)


# --- every local check before a cluster is asked -------------------------------------------------------------------


def fake_slurm(tmp_path: Path) -> dict[str, str]:
    """An environment whose `sbatch` records that it was called, then refuses as Slurm refuses a bad partition."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f'#!/bin/sh\necho called >> "{tmp_path / "sbatch.log"}"\n'
                      'echo "sbatch: error: Batch job submission failed: Invalid partition name specified" >&2\n'
                      'exit 1\n')
    sbatch.chmod(0o755)
    environ = env(OOM_STANDIN_LOG=tmp_path / "launches.log", PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for name in ("SLURM_JOB_ID", "SLURM_JOBID"):
        environ.pop(name, None)
    return environ


SLURM = ("--slurm", "--nodes", "1", "--gpus-per-node", "1")


@pytest.mark.parametrize(("case", "options", "where", "fragment"), [
    ("missing config", (), "missing.json", "no such file"),
    ("bad autotuning", (), "ds.json:", "tuner_type 'nope'"),
    ("bad time", ("--time", "1h"), "--time", "not a time limit"),
    ("bad partition", ("--partition", "a b"), "--partition", "not a name"),
    ("include", ("--include", "localhost:0"), "--include", "with --slurm"),
    ("too many gpus", ("--gpus-per-node", "100000"), "--gpus-per-node", "1,024"),
    ("bad deadline", ("--deadline", "nan"), "--deadline", "nan"),
    ("impossible min-improvement", ("--min-improvement", "nan"), "--min-improvement", "0 to 1000"),
])
def test_tune_checks_everything_local_before_slurm_is_asked(tmp_path, case, options, where, fragment):
    """`tune --slurm` asked for an allocation before it read the script and its config: on a busy cluster the
    user waited in the queue to learn of a typo."""
    environ = fake_slurm(tmp_path)
    config(tmp_path, {"tuner_type": "nope"} if case == "bad autotuning" else None)
    name = "missing.json" if case == "missing config" else "ds.json"
    result = tune(tmp_path, *SLURM, *options, name=name, environ=environ)
    refused(result, tmp_path / where if where.endswith((".json", ".json:")) else where, fragment, tmp_path=tmp_path)
    assert not (tmp_path / "sbatch.log").exists(), f"{case}: Slurm was asked before the local checks"


def test_run_and_resume_check_everything_local_before_slurm_is_asked(tmp_path):
    environ = fake_slurm(tmp_path)
    (tmp_path / "train.py").touch()
    sweep = tmp_path / "sweep.hjson"
    sweep.write_text("{\n  script: train.py\n  ds_config: {}\n  space: {x: [1, 2]}\n}\n")
    for options, fragment in ((("--exclude", "a"), "with --slurm"), (("--time", "soon"), "not a time limit"),
                              (("--events", sweep), "an input of this command"), (("-o", ""), "empty path"),
                              (("--from", tmp_path), "no sweep here")):
        args = ("-o", tmp_path / "results", *options) if options[0] != "-o" else options
        result = autotune("run", sweep, *SLURM, *args, environ=environ, cwd=tmp_path)
        refused(result, "", fragment, tmp_path=tmp_path)
    result = autotune("resume", tmp_path / "nowhere", *SLURM, "--account", "x y", environ=environ, cwd=tmp_path)
    refused(result, "--account", "not a name")
    assert not (tmp_path / "sbatch.log").exists()


def test_a_request_slurm_refuses_is_its_one_line(tmp_path):
    """The "asking Slurm for ..." note came before the refusal, so the refusal was not one line. Once every
    local check passed, sbatch is asked (once), and what it says is the line."""
    environ = fake_slurm(tmp_path)
    config(tmp_path)
    refused(tune(tmp_path, *SLURM, "--partition", "nope", environ=environ),
            "sbatch: error: Batch job submission failed: Invalid partition", tmp_path=tmp_path)
    assert (tmp_path / "sbatch.log").read_text() == "called\n"


# --- no output over an input ---------------------------------------------------------------------------------------


def plan_inputs(tmp_path: Path) -> tuple[Path, Path, Path]:
    (tmp_path / "train.py").touch()
    ds = tmp_path / "ds.json"
    ds.write_text('{"train_micro_batch_size_per_gpu": 1}\n')
    sweep = tmp_path / "sweep.hjson"
    sweep.write_text("{\n  script: train.py\n  ds_config: ds.json\n  space: {x: [1, 2]}\n}\n")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    return sweep, ds, hostfile


@pytest.mark.parametrize("target", ["sweep", "ds_config", "hostfile", "script", "link", "hard link"])
def test_plan_plot_never_writes_over_an_input(tmp_path, target):
    """`plan sweep.hjson --plot sweep.hjson` wrote a PNG over the sweep file."""
    sweep, ds, hostfile = plan_inputs(tmp_path)
    if target == "link":
        (tmp_path / "other.png").symlink_to(sweep)
    if target == "hard link":
        os.link(ds, tmp_path / "other.png")
    plot = {"sweep": sweep, "ds_config": ds, "hostfile": hostfile, "script": tmp_path / "train.py",
            "link": tmp_path / "other.png", "hard link": tmp_path / "other.png"}[target]
    before = {p: p.read_bytes() for p in (sweep, ds, hostfile, tmp_path / "train.py")}
    refused(autotune("plan", sweep, "--hostfile", hostfile, "--plot", plot, cwd=tmp_path), plot,
            "--plot would write over", "an input of this command")
    assert {p: p.read_bytes() for p in before} == before


def test_events_never_write_over_an_input(tmp_path):
    sweep, ds, hostfile = plan_inputs(tmp_path)
    for events in (sweep, ds, hostfile, tmp_path / "train.py"):
        before = events.read_bytes()
        refused(autotune("run", sweep, "--hostfile", hostfile, "-o", tmp_path / "results", "--events", events),
                events, "--events would write over", tmp_path=tmp_path)
        assert events.read_bytes() == before
    tuned = config(tmp_path, name="tune.json")
    refused(tune(tmp_path, "--slots", 1, "--events", tuned, name="tune.json"), tuned, "--events would write over",
            tmp_path=tmp_path)
    launcher = write_launcher(tmp_path, OK_STANDIN)
    done = autotune("run", sweep, "--slots", 1, "-o", tmp_path / "results", "--launcher", launcher, "-q")
    assert done.returncode == 0, done.stderr
    before = sweep.read_bytes()
    refused(autotune("resume", tmp_path / "results", "--events", sweep), sweep, "--events would write over")
    assert sweep.read_bytes() == before


def test_a_results_directory_never_writes_over_an_input(tmp_path):
    """`run sweep.hjson --hostfile hostfile -o .` wrote the sweep's own hostfile over the user's (its comments,
    its gpu= attributes lost); a directory of experiment files as the results would be read again by `resume`,
    the best config written there one more experiment."""
    sweep, _, hostfile = plan_inputs(tmp_path)
    hostfile.write_text("localhost slots=2  # the user's own\n")
    before = hostfile.read_text()
    launcher = write_launcher(tmp_path, OK_STANDIN)
    result = autotune("run", sweep, "--hostfile", hostfile, "-o", ".", "--launcher", launcher, cwd=tmp_path)
    refused(result, ".", "writes its own hostfile here", "pick another --results")
    assert hostfile.read_text() == before and not (tmp_path / "ledger.sqlite").exists()
    exps = tmp_path / "exps"
    exps.mkdir()
    (exps / "a.json").write_text(json.dumps({"name": "a", "ds_config": {}, "num_gpus": 1}))
    result = autotune("run", exps, "--script", tmp_path / "train.py", "--slots", 1, "-o", exps, "--launcher",
                      launcher, cwd=tmp_path)
    refused(result, exps, "directory of experiment files")
    assert sorted(p.name for p in exps.iterdir()) == ["a.json"]


def test_a_results_directory_with_someone_elses_files_of_our_names_is_refused(tmp_path):
    """A `hostfile` or `summary.txt` in a directory that holds no sweep was written over by the new sweep; one
    hostfile is ours to write again: the one a `run` killed before its ledger was in place left behind."""
    sweep, _, _ = plan_inputs(tmp_path)
    launcher = write_launcher(tmp_path, OK_STANDIN)
    results = tmp_path / "results"
    results.mkdir()
    stray = results / "hostfile"
    stray.write_text("worker-1 slots=8  # a note of someone's\n")
    run = ("run", sweep, "--slots", 1, "-o", results, "--launcher", launcher, "-q")
    refused(autotune(*run, cwd=tmp_path), f"{stray}:", "a hostfile this sweep did not write")
    assert stray.read_text() == "worker-1 slots=8  # a note of someone's\n"
    assert sorted(p.name for p in results.iterdir()) == ["hostfile"]
    stray.unlink()
    (results / "summary.txt").write_text("my notes\n")
    refused(autotune(*run, cwd=tmp_path), results, "holds summary.txt but no sweep")
    assert (results / "summary.txt").read_text() == "my notes\n"
    (results / "summary.txt").unlink()
    stray.write_text("localhost slots=1\n")  # what the killed run wrote: taken again
    done = autotune(*run, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (results / "ledger.sqlite").exists() and stray.read_text() == "localhost slots=1\n"


# --- an impossible tune ------------------------------------------------------------------------------------------


def test_a_tune_the_memory_model_rules_out_is_refused_up_front(tmp_path):
    """model_info saying the model fits no GPU at any stage: a sweep was made, nothing ran, exit 1 "no best
    configuration". Refused as `run` refuses an experiment no GPU could hold: exit 2, nothing written."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2 gpu=A100-80GB\n")
    path = config(tmp_path, {"model_info": {"num_params": 50_000_000_000}})
    result = tune(tmp_path, "--hostfile", hostfile, "--num_gpus", 2)
    refused(result, f"{path}:{line_of(path, 'num_params')}", "fits no GPU", "any ZeRO stage tuned (1, 2)",
            tmp_path=tmp_path)
    assert not (tmp_path / "launches.log").exists()
    assert "even with offload" in result.stderr  # stage 2 with the optimizer offloaded holds 100e9 of parameters
    # with the optimizer and parameters offloaded and ZeRO-3 over the two GPUs it fits (and its 1.8e9 of offloaded
    # states, this machine's RAM): tuned, not refused
    config(tmp_path, {"model_info": {"num_params": 100_000_000}}, {
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}})
    result = tune(tmp_path, "--hostfile", hostfile, "--num_gpus", 2, "--confirm", 0)
    assert "fits no GPU" not in result.stderr and (tmp_path / "results" / "ledger.sqlite").exists(), result.stderr


def test_a_plot_or_page_is_never_renamed_over_a_device_or_a_pipe(tmp_path):
    """`plan --plot /dev/full` renamed a PNG over the device (as root): a plot or page is written whole and
    renamed into place, so what is there must be a regular file."""
    sweep, _, _ = plan_inputs(tmp_path)
    fifo = tmp_path / "timeline.png"
    os.mkfifo(fifo)
    refused(autotune("plan", sweep, "--slots", 2, "--plot", fifo, cwd=tmp_path), fifo, "is a pipe", "--plot")
    assert fifo.is_fifo()
    launcher = write_launcher(tmp_path, OK_STANDIN)
    assert autotune("run", sweep, "--slots", 1, "-o", tmp_path / "results", "--launcher", launcher, "-q",
                    cwd=tmp_path).returncode == 0
    page = tmp_path / "page.html"
    os.mkfifo(page)
    refused(autotune("report", tmp_path / "results", "--html", page, cwd=tmp_path), page, "is a pipe", "--html")
    assert page.is_fifo()


# --- GPU needs on MIG instances ------------------------------------------------------------------------------------


def test_a_memory_need_no_mig_instance_of_its_type_holds_says_memory_at_its_line(tmp_path, monkeypatch):
    """A need of 15 GB pinned to 2g.10gb instances was refused as "no type has 1 node with 1 slot" (the slot
    is there; its memory is short), at no line. Fake NVML (no GPU here): this machine as test_mig's."""
    monkeypatch.setitem(sys.modules, "pynvml", mixed_machine())
    (tmp_path / "train.py").touch()
    path = tmp_path / "m.hjson"
    path.write_text(f'{{\n  script: train.py\n  gpu_memory: "15GB"\n  gpu_type: {TYPE_2G}\n  ds_config: {{}}\n}}\n')
    with pytest.raises(UserError) as refusal:
        autotuner.check_gpu_needs(autotuner.load_sweep([path]), autotuner.load_cluster())
    assert refusal.value.line == 3 and "needs 14 GiB on each GPU" in str(refusal.value), str(refusal.value)


@pytest.mark.parametrize(("value", "seconds"), [("inf", 60.0), ("nan", 60.0), ("1e300", 60.0), ("-5", 60.0),
                                                ("soon", 60.0), ("2.5", 2.5), ("0", 0.1)])
def test_slurm_waits_set_in_the_environment_stay_numbers_a_wait_can_take(monkeypatch, value, seconds):
    """AUTOTUNE_SLURM_TIMEOUT=inf overflowed the wait of the first Slurm command: a traceback."""
    monkeypatch.setenv(TIMEOUT_ENV, value)
    monkeypatch.setenv(POLL_ENV, value)
    assert command_timeout() == (COMMAND_TIMEOUT if seconds == 60.0 else seconds)
    assert poll_interval() == (POLL if seconds == 60.0 else seconds)


# --- found trying bad inputs: each a class of its own --------------------------------------------------------------


@pytest.mark.parametrize(("section", "extra", "key", "fragment"), [
    ({"start_profile_step": 5, "end_profile_step": 3}, None, "start_profile_step", "past end_profile_step 3"),
    ({"end_profile_step": 2}, None, "end_profile_step", "start_profile_step 3 is past"),
    ({"mp_size": 4}, None, "mp_size", "does not divide the 1 GPU(s)"),
    (None, {"train_batch_size": 0}, "train_batch_size", "positive whole number or \"auto\""),
    (None, {"gradient_accumulation_steps": 2.5}, "gradient_accumulation_steps", "not 2.5"),
])
def test_a_tune_config_every_run_would_fail_on_is_refused_at_its_line(tmp_path, section, extra, key, fragment):
    """Each was accepted: a start past the end failed every run in DeepSpeed's engine (on FLOPS it never
    counted), a train_batch_size of 0 every run too."""
    path = config(tmp_path, section, extra)
    refused(tune(tmp_path, "--slots", 1), f"{path}:{line_of(path, key)}:", fragment, tmp_path=tmp_path)
    assert not (tmp_path / "launches.log").exists()


def test_a_ds_config_naming_its_own_file_is_refused(tmp_path):
    (tmp_path / "train.py").touch()
    tuned = tmp_path / "tune.hjson"
    tuned.write_text("{\n  script: train.py\n  ds_config: tune.hjson\n}\n")
    refused(autotune("tune", "--slots", 1, "-o", tmp_path / "results", tuned), f"{tuned}:3:", "names this file itself",
            tmp_path=tmp_path)
    sweep = tmp_path / "sweep.hjson"
    sweep.write_text("{\n  script: train.py\n  ds_config: sweep.hjson\n}\n")
    refused(autotune("run", sweep, "--slots", 1, "-o", tmp_path / "results"), f"{sweep}:3:", "names this file itself",
            tmp_path=tmp_path)


@pytest.mark.parametrize(("attributes", "fragment"), [
    ("gpu=A100-0GB", "states 0GB"), ("gpu=A100-99999999999GB", "at most 16384 GiB"),
    ("accelerator=tpu", "accelerator=tpu: one of cuda, cpu"), ("GPU=A100-80GB", "lower case (gpu=)"),
])
def test_hostfile_attributes_we_read_are_checked_at_their_line(tmp_path, attributes, fragment):
    """Each was taken silently: a type of 0 GB or 10^20 bytes, an accelerator nobody knows (run as cuda), a
    type under GPU= (lost: the sweep ran with no type and no memory model)."""
    sweep, _, hostfile = plan_inputs(tmp_path)
    hostfile.write_text(f"# two GPUs\nnode1 slots=2 {attributes}\n")
    refused(autotune("plan", sweep, "--hostfile", hostfile, cwd=tmp_path), f"{hostfile}:2:", fragment)


def test_a_type_whose_size_is_written_with_an_exponent_states_none():
    assert size_of_type("H100-1e3GB") is None and size_of_type("A100-80GB") == 80 * 10**9


@pytest.mark.parametrize("value", ["-NaN", "+1", ".5", "0x10"])
def test_a_json_config_is_told_where_json_stops_not_where_hjson_does(tmp_path, value):
    """hjson reads a bad JSON value to the end of its line and then fails at the end of the file: the line it
    names was the file's last, never the mistake's."""
    path = config(tmp_path)
    path.write_text('{"train_micro_batch_size_per_gpu": 1,\n "optimizer": {"type": "Adam", "params": {"lr": '
                    f'{value}}}}},\n "zero_optimization": {{"stage": 1}}\n}}\n')
    refused(tune(tmp_path, "--slots", 1), f"{path}:2:", "malformed JSON", tmp_path=tmp_path)


@pytest.mark.parametrize("value", ["+1,", ".5,", "'a',", "hello,", "0x10,", "1.5.3,", "2e5e1,"])
def test_a_json_value_hjson_would_read_as_a_string_is_refused_at_its_line(tmp_path, value):
    """`"lr": +1,` on a line of its own: JSON refuses it, hjson read it as the string "+1," and the tune ran."""
    path = config(tmp_path)
    path.write_text('{"train_micro_batch_size_per_gpu": 1,\n "gradient_clipping": ' + value +
                    '\n "zero_optimization": {"stage": 1}\n}\n')
    refused(tune(tmp_path, "--slots", 1), f"{path}:2:", "malformed JSON", "read as a string", tmp_path=tmp_path)
    hjson_file = tmp_path / "sweep.hjson"  # in an hjson file an unquoted string is one: read as it always was
    hjson_file.write_text('{\n  "script": ' + value + '\n  "ds_config": {}\n}\n')
    assert read_source(hjson_file, Budget()).data["script"] in (value, "a")  # hjson quotes with ' too
