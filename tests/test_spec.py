import copy
import json
import re
import textwrap
from collections import OrderedDict
from pathlib import Path

import pytest

from autotuner.errors import UserError
from autotuner.spec import Experiment, Sweep, is_safe_name
from autotuner.spec.load import load_sweep
from autotuner.spec.metrics import LATENCY, THROUGHPUT, Metric
from autotuner.spec.model import copied

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return path


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def line_of(path: Path, needle: str, nth: int = 1) -> int:
    """1-based line of the nth line holding `needle`."""
    hits = [i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line]
    return hits[nth - 1]


def user_error(paths, **kwargs) -> UserError:
    with pytest.raises(UserError) as info:
        load_sweep(paths, **kwargs)
    return info.value


SWEEP = """
    # a comment
    {
      name: grid
      script: train.py
      args: ["--steps", "10"]
      metric: latency
      num_gpus: 2
      timeout: 60
      env: {
        OMP_NUM_THREADS: "1"
        SEED: 7
      }
      ds_config: {
        gradient_accumulation_steps: 1
        zero_optimization: {overlap_comm: true}
        optimizer: {type: "Adam", params: {lr: 0.001}}
      }
      space: {
        "zero_optimization.stage": [0, 1, 2]
        train_micro_batch_size_per_gpu: [4, 32]
      }
    }
"""


# --- grid expansion and names ---------------------------------------------------------------------------------


def test_sweep_file_expands_the_full_grid_in_order(tmp_path, script):
    path = write(tmp_path, "sweep.hjson", SWEEP)
    sweep = load_sweep([path])
    assert isinstance(sweep, Sweep) and sweep.name == "grid" and sweep.metric == LATENCY
    assert sweep.source == str(path)
    assert [e.name for e in sweep.experiments] == [
        "grid_z0_mbs4", "grid_z0_mbs32", "grid_z1_mbs4", "grid_z1_mbs32", "grid_z2_mbs4", "grid_z2_mbs32"]
    e = sweep.experiments[3]
    assert e.ds_config == {"gradient_accumulation_steps": 1, "zero_optimization": {"overlap_comm": True, "stage": 1},
                           "optimizer": {"type": "Adam", "params": {"lr": 0.001}},
                           "train_micro_batch_size_per_gpu": 32}
    assert (e.num_gpus, e.num_nodes, e.script, e.args, e.timeout) == (2, 1, str(script), ("--steps", "10"), 60.0)
    assert e.env == {"OMP_NUM_THREADS": "1", "SEED": "7"} and e.source == str(path)
    # every experiment has its own config: no sharing between them
    assert sweep.experiments[0].ds_config["zero_optimization"] is not e.ds_config["zero_optimization"]


def test_space_can_vary_gpus_and_nodes_and_names_use_abbreviations(tmp_path, script):
    path = write(tmp_path, "my sweep.hjson", """
        script: train.py
        space: {
          num_nodes: [1, 2]
          num_gpus: [4]
          gradient_accumulation_steps: [2]
          "zero_optimization.offload_optimizer.device": ["cpu", "none"]
          "a.b.flag": [true, null]
          "x": [0.5, "a b/c", {"k": [1, 2]}]
        }
    """)
    sweep = load_sweep([path])
    assert sweep.name == "my-sweep"  # from the file stem, made safe
    names = [e.name for e in sweep.experiments]
    assert len(names) == 2 * 2 * 2 * 3
    assert names[0] == "my-sweep_n1_g4_gas2_devicecpu_flagtrue_x0.5"
    assert "my-sweep_n2_g4_gas2_devicenone_flagnull_xa-b-c" in names
    assert 'my-sweep_n1_g4_gas2_devicecpu_flagtrue_xk-1-2' in names
    assert all(is_safe_name(n) for n in names)
    first = sweep.experiments[0]
    assert (first.num_nodes, first.num_gpus) == (1, 4)
    assert first.ds_config == {"gradient_accumulation_steps": 2,
                               "zero_optimization": {"offload_optimizer": {"device": "cpu"}},
                               "a": {"b": {"flag": True}}, "x": 0.5}
    assert sweep.experiments[-1].num_nodes == 2
    assert "num_nodes" not in first.ds_config and "num_gpus" not in first.ds_config


def test_no_space_is_one_experiment_named_by_the_prefix(tmp_path, script):
    path = write(tmp_path, "one.hjson", """
        {script: "train.py", ds_config: {train_micro_batch_size_per_gpu: 2}}
    """)
    sweep = load_sweep([path])
    assert [e.name for e in sweep.experiments] == ["one"]
    assert sweep.metric == THROUGHPUT  # the default


def test_long_names_are_shortened_but_stay_distinct(tmp_path, script):
    path = write(tmp_path, "long.hjson", f"""
        script: train.py
        space: {{ tag: ["{'a' * 150}", "{'a' * 149}b"] }}
    """)
    names = [e.name for e in load_sweep([path]).experiments]
    assert all(len(n) <= 120 and is_safe_name(n) for n in names) and len(set(names)) == 2


def test_ds_config_may_be_a_path_relative_to_the_file(tmp_path, script):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "base.json").write_text('{"gradient_accumulation_steps": 4}')
    path = write(tmp_path, "s.hjson", """
        script: train.py
        ds_config: conf/base.json
        space: {train_micro_batch_size_per_gpu: [1]}
    """)
    e = load_sweep([path]).experiments[0]
    assert e.ds_config == {"gradient_accumulation_steps": 4, "train_micro_batch_size_per_gpu": 1}


# --- CLI defaults and what overrides them -------------------------------------------------------------------


def test_cli_values_are_defaults_the_sweep_file_overrides(tmp_path, script):
    other = tmp_path / "other.py"
    other.write_text("")
    bare = write(tmp_path, "bare.hjson", "space: {train_micro_batch_size_per_gpu: [1]}\n")
    sweep = load_sweep([bare], script=str(other), args=["--x", "1"], metric="val_loss:min", timeout=5)
    e = sweep.experiments[0]
    assert (e.script, e.args, e.timeout, sweep.metric) == (str(other), ("--x", "1"), 5.0, Metric("val_loss", True))

    full = write(tmp_path, "full.hjson", SWEEP)
    sweep = load_sweep([full], script=str(other), args=["--x", "1"], timeout=5)
    e = sweep.experiments[0]
    assert (e.script, e.args, e.timeout, sweep.metric) == (str(script), ("--steps", "10"), 60.0, LATENCY)


def test_an_explicit_metric_wins_over_the_sweep_files(tmp_path, script):
    full = write(tmp_path, "full.hjson", SWEEP)  # metric: latency
    assert load_sweep([full], metric="throughput").metric == THROUGHPUT
    other = write(tmp_path, "other.hjson", "script: train.py\nmetric: throughput\n")
    assert load_sweep([full, other], metric="val_loss:min").metric == Metric("val_loss", True)  # no conflict


@pytest.mark.parametrize("entry", ["timeout: 1e400", "num_gpus: 1e400", "num_nodes: -1e400",
                                   "env: {A: " + "9" * 5000 + "}"], ids=["timeout", "gpus", "nodes", "digits"])
def test_numbers_out_of_range_are_located(tmp_path, script, entry):
    path = write(tmp_path, "s.hjson", f"{{\n  script: train.py\n  {entry}\n}}\n")
    err = user_error([path])
    assert (err.path, err.line) == (path, 3) and "out of range" in err.message


def test_cli_script_is_relative_to_the_current_directory(tmp_path, script, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, "bare.hjson", "space: {train_micro_batch_size_per_gpu: [1]}\n")
    assert load_sweep([path], script="train.py").experiments[0].script == str(script)


# --- DeepSpeed's own experiment files ------------------------------------------------------------------------


def ds_exp(directory: Path, name: str, stage: int, **extra) -> Path:
    exp = {"name": name, "ds_config": {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
                                       "train_batch_size": 4, "zero_optimization": {"stage": stage}},
           "num_gpus": 1, "num_nodes": 1, **extra}
    path = directory / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(exp))
    return path


def test_deepspeed_experiment_file_is_accepted_as_is(tmp_path, script):
    path = ds_exp(tmp_path, "z1_gas1_tmbspg4", 1, hostfile="/job/hostfile")
    sweep = load_sweep([path], script=str(script), args=["--steps", "3"])
    (e,) = sweep.experiments
    assert (e.name, e.num_gpus, e.num_nodes, e.script, e.args) == ("z1_gas1_tmbspg4", 1, 1, str(script),
                                                                    ("--steps", "3"))
    assert e.ds_config["zero_optimization"] == {"stage": 1} and e.timeout is None and e.env == {}
    assert sweep.name == "z1_gas1_tmbspg4" and sweep.metric == THROUGHPUT


def test_deepspeed_result_exp_json_keys_are_tolerated_and_user_script_wins(tmp_path, script, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = tmp_path / "cli.py"
    cli.write_text("")
    path = ds_exp(tmp_path / "autotuning_results" / "z0", "exp", 0, exp_id=3, result_dir="/r/z0",
                  master_port=29503, launcher_args=["--hostfile", "h", "--include", "a:0", "--master_port", "29503"],
                  hostfile="h", user="me", job_id="unknown-job-id", ds_config_path="/r/z0/ds_config.json",
                  ds_config_base64="e30=", user_script="train.py", user_args=["--deepspeed_config", "e30="])
    (e,) = load_sweep([path], script=str(cli), args=["--other"]).experiments
    assert e.name == "exp" and e.script == str(script) and e.args == ("--deepspeed_config", "e30=")


def test_directory_of_deepspeed_experiments_in_name_order(tmp_path, script):
    exps = tmp_path / "exps"
    ds_exp(exps, "b_stage2", 2)
    ds_exp(exps, "a_stage0", 0)
    hjson_exp = exps / "c_stage1.hjson"
    hjson_exp.write_text("{\n  name: c_stage1\n  ds_config: {zero_optimization: {stage: 1}}\n  num_gpus: 2\n}\n")
    (exps / "notes.txt").write_text("ignored")
    (exps / "sub").mkdir()
    sweep = load_sweep([exps], script=str(script))
    assert [e.name for e in sweep.experiments] == ["a_stage0", "b_stage2", "c_stage1"]
    assert sweep.experiments[2].num_gpus == 2 and sweep.name == "exps" and sweep.source == str(exps)


def test_several_inputs_make_one_sweep(tmp_path, script):
    exps = tmp_path / "exps"
    ds_exp(exps, "a", 0)
    sweep_file = write(tmp_path, "sweep.hjson", SWEEP)
    sweep = load_sweep([exps, sweep_file], script=str(script))
    assert [e.name for e in sweep.experiments][:2] == ["a", "grid_z0_mbs4"] and len(sweep.experiments) == 7
    assert sweep.metric == LATENCY and sweep.name == "exps_grid" and is_safe_name(sweep.name)
    assert sweep.source == f"{exps}, {sweep_file}"


# --- the experiment itself -----------------------------------------------------------------------------------


def test_digest_is_stable_and_tracks_what_defines_the_run(tmp_path, script):
    path = write(tmp_path, "sweep.hjson", SWEEP)
    first = {e.name: e.digest for e in load_sweep([path]).experiments}
    again = {e.name: e.digest for e in load_sweep([path]).experiments}
    assert first == again and len(set(first.values())) == 6
    assert all(len(d) == 64 and int(d, 16) >= 0 for d in first.values())

    path.write_text(path.read_text().replace("overlap_comm: true", "overlap_comm: false"))
    changed = {e.name: e.digest for e in load_sweep([path]).experiments}
    assert all(changed[n] != first[n] for n in first)

    # key order in the file does not matter; timeout, name and source do not define the run
    path.write_text(textwrap.dedent(SWEEP).replace("timeout: 60", "timeout: 99"))
    assert {e.name: e.digest for e in load_sweep([path]).experiments} == first
    e = load_sweep([path]).experiments[0]
    reordered = Experiment(name="other", ds_config=dict(reversed(list(e.ds_config.items()))), num_gpus=e.num_gpus,
                           num_nodes=e.num_nodes, script=e.script, args=e.args, timeout=None, env=e.env, source="x")
    assert reordered.digest == e.digest
    for change in ({"args": ("--steps", "11")}, {"env": {"A": "1"}}, {"num_gpus": 1}, {"num_nodes": 2},
                   {"script": "/elsewhere/train.py"}):
        assert Experiment(**{**e.to_json(), "args": tuple(e.args), **change}).digest != e.digest


def test_json_round_trip_and_private_config_copies(tmp_path, script):
    e = load_sweep([write(tmp_path, "sweep.hjson", SWEEP)]).experiments[0]
    data = json.loads(json.dumps(e.to_json()))
    back = Experiment.from_json(data)
    assert back == e and back.digest == e.digest and hash(back) == hash(e)
    config = e.config()
    config["zero_optimization"]["stage"] = 3
    assert e.ds_config["zero_optimization"]["stage"] == 0
    given = {"train_micro_batch_size_per_gpu": 1}
    made = Experiment(name="x", ds_config=given, num_gpus=1, num_nodes=1, script="/bin/true")
    given["train_micro_batch_size_per_gpu"] = 2
    assert made.ds_config == {"train_micro_batch_size_per_gpu": 1} and made.args == () and made.env == {}


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "a b", "x" * 121, "é"])
def test_experiment_names_must_be_safe(name):
    assert not is_safe_name(name)
    with pytest.raises(ValueError):
        Experiment(name=name, ds_config={}, num_gpus=1, num_nodes=1, script="/bin/true")


def test_safe_names():
    assert all(is_safe_name(n) for n in ("a", "z0_gas1_tmbspg4", "x" * 120, "-a", "a.b-c_d", "_x"))


# --- errors: each names the file and the line ----------------------------------------------------------------


def test_malformed_hjson_gives_line_and_column(tmp_path, script):
    path = write(tmp_path, "bad.hjson", """
        {
          script: train.py
          space: {
            "train_micro_batch_size_per_gpu": [1, 2
          }
        }
    """)
    err = user_error([path])
    assert err.path == path and err.line == 5 and err.col is not None
    assert str(err).startswith(f"{path}:5:") and "malformed hjson" in str(err)


def test_unknown_top_level_key_is_located(tmp_path, script):
    path = write(tmp_path, "s.hjson", """
        {
          script: train.py
          ds_config: {
            spaces: 1
          }
          "spaces": {"zero_optimization.stage": [0]}
        }
    """)
    err = user_error([path])
    assert err.line == line_of(path, '"spaces"') == 6 and "unknown key 'spaces'" in err.message
    assert str(err).startswith(f"{path}:6:")


@pytest.mark.parametrize("line, message", [
    ("num_gpus: 0", "num_gpus must be a positive integer, not 0"),
    ("num_gpus: 1.5", "num_gpus must be a positive integer"),
    ('num_gpus: "2"', "num_gpus must be a positive integer"),
    ("num_nodes: true", "num_nodes must be a positive integer"),
    ('args: ["--steps", 10]', "args must be a list of strings"),
    ('args: "--steps 10"', "args must be a list of strings"),
    ("timeout: -1", "timeout must be a positive number"),
    ("timeout: soon", "timeout must be a positive number"),
    ("metric: speed", "unknown metric 'speed'"),
    ("metric: 3", "metric must be a string"),
    ("env: [1]", "env must be an object"),
    ("script: missing.py", "script 'missing.py': no such file"),
    ("script: [1]", "script must be a path"),
    ("ds_config: 5", "ds_config must be an object or the path"),
    ("ds_config: nowhere.json", "ds_config 'nowhere.json': no such file"),
    ("space: [1]", "space must be an object"),
    ("name: ../up", "name '../up' must be safe as a directory name"),
])
def test_wrong_types_are_located_at_their_key(tmp_path, script, line, message):
    fixture = {"script": "script: train.py", "space": "space: {train_micro_batch_size_per_gpu: [1]}"}
    fixture[line.split(":")[0]] = line  # the line under test replaces the fixture's own
    body = "".join(f"  {entry}\n" for entry in fixture.values())
    path = write(tmp_path, "s.hjson", "# header\n{\n" + body + "}\n")
    err = user_error([path])
    assert message in err.message
    assert (err.path, err.line) == (path, line_of(path, line))


def test_bad_env_entries_are_located(tmp_path, script):
    path = write(tmp_path, "s.hjson", """
        script: train.py
        env: {
          GOOD: x
          BAD: [1]
        }
    """)
    err = user_error([path])
    assert err.line == 4 and "env: BAD" in err.message
    path.write_text('script: train.py\nenv: {\n  "NOT-A-NAME": x\n}\n')
    assert user_error([path]).line == 3


def test_space_key_descending_into_a_non_object(tmp_path, script):
    path = write(tmp_path, "s.hjson", """
        script: train.py
        ds_config: {zero_optimization: 2}
        space: {
          train_micro_batch_size_per_gpu: [1]
          "zero_optimization.stage": [0, 1]
        }
    """)
    err = user_error([path])
    assert err.line == line_of(path, '"zero_optimization.stage"') == 5
    assert "'zero_optimization' in ds_config is 2, not an object" in err.message


@pytest.mark.parametrize("entry, message", [
    ('"zero_optimization.stage": []', "needs a non-empty list"),
    ('"zero_optimization.stage": 1', "needs a non-empty list"),
    ('"a..b": [1]', "not a dotted ds_config key"),
    ("num_gpus: [1, 0]", "every value of space key 'num_gpus' must be a positive integer"),
])
def test_bad_space_entries_are_located(tmp_path, script, entry, message):
    path = write(tmp_path, "s.hjson", f"""
        num_gpus: 1
        script: train.py
        space: {{
          train_micro_batch_size_per_gpu: [1]
          {entry}
        }}
    """)
    err = user_error([path])
    assert message in err.message and (err.path, err.line) == (path, 5)


def test_unknown_key_in_deepspeed_experiment_file(tmp_path, script):
    path = tmp_path / "exp.json"
    path.write_text(json.dumps({"name": "e", "ds_config": {}, "num_gpus": 1, "num_nodes": 1, "priority": 3},
                               indent=2))
    err = user_error([path], script=str(script))
    assert err.line == line_of(path, '"priority"') == 6 and "unknown key 'priority'" in err.message
    one_line = ds_exp(tmp_path / "d", "e", 0, bogus=1)
    assert user_error([one_line], script=str(script)).line == 1


def test_deepspeed_experiment_file_errors(tmp_path, script):
    path = tmp_path / "exp.json"
    path.write_text('{\n  "name": "e",\n  "ds_config": {},\n  "num_gpus": 0\n}')
    assert user_error([path], script=str(script)).line == 4
    path.write_text('{\n  "name": "a b",\n  "ds_config": {}\n}')
    assert user_error([path], script=str(script)).line == 2
    path.write_text('{\n  "name": "e"\n}')
    assert "needs ds_config" in user_error([path], script=str(script)).message
    path.write_text('{\n  "name": "e",\n  "ds_config": {},\n  "user_args": "--x"\n}')
    assert user_error([path], script=str(script)).line == 4
    path.write_text('[1, 2]')
    err = user_error([path], script=str(script))
    assert (err.path, err.line) == (path, 1) and "expected an object" in err.message


def test_no_script_anywhere(tmp_path):
    exp = ds_exp(tmp_path, "e", 0)
    err = user_error([exp])
    assert err.path == exp and "no script" in err.message and "--script" in err.message
    sweep = write(tmp_path, "s.hjson", "name: s\nspace: {train_micro_batch_size_per_gpu: [1]}\n")
    err = user_error([sweep])
    assert err.path == sweep and "no script" in err.message


def test_duplicate_names_across_inputs_name_both_sources(tmp_path, script):
    first = ds_exp(tmp_path / "a", "grid_z0_mbs4", 0)
    second = write(tmp_path, "sweep.hjson", SWEEP)
    err = user_error([first, second], script=str(script))
    assert "'grid_z0_mbs4'" in err.message and str(first) in err.message
    assert err.path == second and err.line == line_of(second, "space:")


def test_values_made_alike_by_making_them_safe_are_told_apart(tmp_path, script):
    path = write(tmp_path, "s.hjson", 'script: train.py\nspace: {\n  tag: ["a b", "a/b", "c"]\n}\n')
    names = [e.name for e in load_sweep([path]).experiments]
    assert names[2] == "s_tagc" and len(set(names)) == 3 and all(is_safe_name(n) for n in names)
    assert all(re.fullmatch(r"s_taga-b-[0-9a-f]{6}", n) for n in names[:2])
    assert [e.name for e in load_sweep([path]).experiments] == names  # deterministic


def test_a_value_listed_twice_is_located(tmp_path, script):
    path = write(tmp_path, "s.hjson", 'script: train.py\nspace: {\n  tag: ["a", "b", "a"]\n}\n')
    err = user_error([path])
    assert "space key 'tag' lists the value 'a' twice" in err.message and (err.path, err.line) == (path, 3)


def test_duplicate_keys_are_refused(tmp_path, script):
    path = write(tmp_path, "s.hjson", "script: train.py\nnum_gpus: 1\nnum_gpus: 2\n")
    err = user_error([path])
    assert "duplicate key 'num_gpus'" in err.message and err.line == 3


def test_missing_paths_and_empty_directories(tmp_path, script):
    missing = tmp_path / "nope.hjson"
    err = user_error([missing])
    assert err.path == missing and "no such file" in str(err)
    (tmp_path / "empty").mkdir()
    err = user_error([tmp_path / "empty"])
    assert err.path == tmp_path / "empty" and "no *.json" in err.message
    err = user_error([write(tmp_path, "s.hjson", "space: {x: [1]}\n")], script=str(tmp_path / "gone.py"))
    assert "--script" in err.message
    assert "no experiment files" in user_error([]).message


@pytest.mark.parametrize("timeout", [0, -3, float("nan"), float("inf")])
def test_bad_cli_timeout(tmp_path, script, timeout):
    assert "--timeout" in user_error([write(tmp_path, "s.hjson", SWEEP)], timeout=timeout).message


def test_conflicting_metrics_between_sweep_files(tmp_path, script):
    a = write(tmp_path, "a.hjson", "script: train.py\nmetric: throughput\n")
    b = write(tmp_path, "b.hjson", "script: train.py\n\nmetric: latency\n")
    err = user_error([a, b])
    assert (err.path, err.line) == (b, 3) and f"{a}:2" in err.message


def test_inconsistent_train_batch_size(tmp_path, script):
    path = write(tmp_path, "s.hjson", """
        script: train.py
        num_gpus: 2
        ds_config: {
          train_batch_size: 16
          gradient_accumulation_steps: 1
        }
        space: {train_micro_batch_size_per_gpu: [8, 4]}
    """)
    err = user_error([path])
    assert err.path == path and err.line == 4 and "experiment s_mbs4" in err.message
    assert "train_batch_size 16 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 1 x 2" in err.message
    # a model-parallel degree that divides the GPUs explains a smaller train_batch_size
    path.write_text(path.read_text().replace("[8, 4]", "[8, 16]"))
    assert len(load_sweep([path]).experiments) == 2
    path.write_text(path.read_text().replace("gradient_accumulation_steps: 1", "gradient_accumulation_steps: 0"))
    assert "gradient_accumulation_steps must be positive" in user_error([path]).message


# --- the example files -----------------------------------------------------------------------------------------


def test_example_sweep_file():
    sweep = load_sweep([ROOT / "experiments" / "zero_mbs.hjson"])
    assert sweep.name == "zero_mbs" and sweep.metric == THROUGHPUT and len(sweep.experiments) == 6
    assert {(e.ds_config["zero_optimization"]["stage"], e.ds_config["train_micro_batch_size_per_gpu"])
            for e in sweep.experiments} == {(s, m) for s in (0, 1, 2) for m in (4, 32)}
    for e in sweep.experiments:
        assert e.script == str(ROOT / "experiments" / "train.py") and e.args == ("--steps", "10")
        assert (e.num_gpus, e.num_nodes) == (1, 1)
        assert e.ds_config["optimizer"] == {"type": "Adam", "params": {"lr": 0.001, "torch_adam": True}}
        assert e.ds_config["gradient_accumulation_steps"] == 1 and e.ds_config["steps_per_print"] == 1000
        assert "fp16" not in e.ds_config and "bf16" not in e.ds_config


def test_example_deepspeed_experiments():
    train = ROOT / "experiments" / "train.py"
    sweep = load_sweep([ROOT / "experiments" / "deepspeed_exps"], script=str(train), args=["--steps", "10"])
    assert len(sweep.experiments) >= 2
    for e in sweep.experiments:
        assert e.script == str(train) and e.ds_config["optimizer"]["params"]["torch_adam"] is True


# --- script options: the config's flag, options a space varies, arg_mappings ------------------------------------
TRAINER = """
    {
      name: hf
      script: train.py
      args: ["--output_dir", "out", "--deepspeed", "ds.json", "--learning_rate=0.1"]
      config_flag: --deepspeed
      arg_mappings: {
        "train_micro_batch_size_per_gpu": "--per_device_train_batch_size"
        "gradient_accumulation_steps": "--gradient_accumulation_steps"
      }
      ds_config: {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 2}
      space: {
        "train_micro_batch_size_per_gpu": [4, 8]
        "--learning_rate": [0.001, 0.01]
      }
    }
"""


def test_a_space_varies_script_options_and_arg_mappings_hand_config_values_to_the_script(tmp_path, script):
    sweep = load_sweep([write(tmp_path, "hf.hjson", TRAINER)])
    first = sweep.experiments[0]
    assert [e.name for e in sweep.experiments] == ["hf_mbs4_lr0.001", "hf_mbs4_lr0.01", "hf_mbs8_lr0.001",
                                                   "hf_mbs8_lr0.01"]
    assert first.config_flag == "--deepspeed"
    assert first.args == ("--output_dir", "out", "--deepspeed", "ds.json", "--learning_rate=0.001",
                          "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2")
    assert sweep.experiments[3].args[-4:-2] == ("--per_device_train_batch_size", "8")
    assert len({e.digest for e in sweep.experiments}) == 4


def test_the_config_goes_to_the_flag_the_users_command_uses_replacing_what_the_args_held(tmp_path, script):
    from autotuner.backends.launch import deepspeed_command, encode_config, optimal_command
    from autotuner.core import Reservation

    e = load_sweep([write(tmp_path, "hf.hjson", TRAINER)]).experiments[0]
    command = deepspeed_command(e, Reservation.of({"localhost": [0]}), e.config(), hostfile="h", master_port=1,
                                metric_path="m", tag="t", cwd="/")
    at = command.argv.index("--deepspeed")
    assert command.argv[at + 1] == encode_config(e.config()) and "--deepspeed_config" not in command.argv
    assert "--deepspeed /tmp/best.json" in optimal_command(e, "/tmp/best.json")


def test_an_option_the_args_give_twice_is_replaced_both_times(tmp_path, script):
    """A parser takes an option's last value: the config and a mapped or varied option, given twice in the args,
    are the experiment's at both places (the last one was the user's own: every run got the user's config file
    and batch size, not the experiment's)."""
    from autotuner.backends.launch import deepspeed_command, encode_config
    from autotuner.core import Reservation

    body = TRAINER.replace('"--learning_rate=0.1"]', '"--learning_rate=0.1", "--deepspeed", "other.json", '
                           '"--per_device_train_batch_size", "1", "--learning_rate", "0.5", '
                           '"--per_device_train_batch_size", "2"]')
    e = load_sweep([write(tmp_path, "hf.hjson", body)]).experiments[0]
    at = [i for i, a in enumerate(e.args) if a == "--per_device_train_batch_size"]
    assert [e.args[i + 1] for i in at] == ["4", "4"]
    assert "0.5" not in e.args and "--learning_rate=0.001" in e.args
    argv = deepspeed_command(e, Reservation.of({"localhost": [0]}), e.config(), hostfile="h", master_port=1,
                             metric_path="m", tag="t", cwd="/").argv
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--deepspeed"] == [encode_config(e.config())] * 2


def test_an_auto_value_is_left_to_the_script_and_the_default_flag_keeps_old_digests(tmp_path, script):
    body = TRAINER.replace('"train_micro_batch_size_per_gpu": [4, 8]', '"zero_optimization.stage": [0]')
    e = load_sweep([write(tmp_path, "hf.hjson", body)]).experiments[0]
    assert "--per_device_train_batch_size" not in e.args  # "auto": the Trainer fills it from its own argument
    plain = Experiment(name="x", ds_config={}, num_gpus=1, num_nodes=1, script="/s")
    assert "config_flag" not in plain.to_json() and Experiment.from_json(plain.to_json()).digest == plain.digest
    flagged = Experiment(name="x", ds_config={}, num_gpus=1, num_nodes=1, script="/s", config_flag="--deepspeed")
    assert flagged.digest != plain.digest and Experiment.from_json(flagged.to_json()) == flagged


@pytest.mark.parametrize(("change", "fragment", "needle"), [
    (("config_flag: --deepspeed", "config_flag: deepspeed"), "not a script option", "config_flag"),
    (("config_flag: --deepspeed", "config_flag: 3"), "not a script option", "config_flag"),
    (('"--learning_rate": [0.001, 0.01]', '"--deepspeed": ["a.json"]'), "the config itself", '"--deepspeed": ['),
    (('"--learning_rate": [0.001, 0.01]', '"--learning_rate": [{"a": 1}]'), "string, number or boolean",
     '"--learning_rate": ['),
    (('"--learning_rate": [0.001, 0.01]', '"--bad flag": [1]'), "not a script option", '"--bad flag"'),
    (('"--gradient_accumulation_steps"\n', '"--deepspeed"\n'), "the config itself", '": "--deepspeed"'),
    (('"--gradient_accumulation_steps"\n', '"gas"\n'), "not a script option", '"gas"'),
    (('"--learning_rate": [0.001, 0.01]', '"--per_device_train_batch_size": [1]'), "varies too",
     '"--per_device_train_batch_size": ['),
])
def test_bad_script_options_are_located(tmp_path, script, change, fragment, needle):
    path = write(tmp_path, "hf.hjson", TRAINER.replace(*change))
    error = user_error([path])
    assert fragment in str(error) and error.line == line_of(path, needle), str(error)


def test_an_experiments_config_is_its_own_deep_copy_and_equal_to_what_deepcopy_makes():
    class Odd:  # not JSON: handed to copy.deepcopy
        def __init__(self, v):
            self.v = v

        def __eq__(self, other):
            return isinstance(other, Odd) and other.v == self.v

    given = {"zero_optimization": {"stage": 2, "offload": {"device": "cpu", "ratio": 0.5}}, "lr": [1e-4, [2, 3]],
             "flag": True, "none": None, 3: "int key", "ordered": OrderedDict(a=1), "odd": Odd([1])}
    made = copied(given)
    assert made == copy.deepcopy(given) and type(made["ordered"]) is OrderedDict
    e = Experiment(name="e", ds_config=given, num_gpus=1, num_nodes=1, script="/s.py")
    given["zero_optimization"]["offload"]["device"] = "nvme"
    given["lr"][1].append(4)
    given["odd"].v.append(2)
    assert e.ds_config["zero_optimization"]["offload"]["device"] == "cpu" and e.ds_config["lr"] == [1e-4, [2, 3]]
    assert e.ds_config["odd"] == Odd([1])
    mine = e.config()
    mine["zero_optimization"]["stage"] = 3
    assert e.ds_config["zero_optimization"]["stage"] == 2
