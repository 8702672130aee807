"""World sizes in the search: `tune --num_gpus 1,2,4` on the fake-GPU stand-in with a scaling curve
(OOM_STANDIN_SCALING) finds the best config at each size, keeps a fixed train_batch_size at each (accumulation
derived per size), reports the scaling efficiency, and prices the sizes against each other (the cheapest within
the deadline is the smallest size, its files written); bad sizes are one line, exit 2, before anything runs."""
import json
from pathlib import Path

import pytest

from cli_rig import autotune, env

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "oom_standin.sh"


def setup(tmp_path, config=None):
    (tmp_path / "train.py").write_text("# stand-in: the launcher never runs it\n")
    ds = {"train_batch_size": 64, "zero_optimization": {"stage": [1, 2]},
          "autotuning": {"enabled": True, "max_train_micro_batch_size_per_gpu": 16,
                         "train_samples": 1e9, "gpu_hour_cost": 2.0, "deadline_days": 30}} | (config or {})
    (tmp_path / "ds.json").write_text(json.dumps(ds, indent=1))
    return env(OOM_STANDIN_LOG=tmp_path / "launches.log", OOM_STANDIN_SCALING="0.9 0.7")


def tune(tmp_path, environ, *extra, slots="4"):
    return autotune("tune", "--slots", slots, "-o", tmp_path / "res", "--launcher", f"sh {STANDIN}", *extra,
                    "train.py", "--deepspeed_config", "ds.json", environ=environ, cwd=tmp_path, timeout=300)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("worlds")
    result = tune(tmp_path, setup(tmp_path), "--num_gpus", "1,2,4")
    assert result.returncode == 0, result.stdout + result.stderr
    return tmp_path / "res", result


def test_each_size_is_searched_and_keeps_the_global_batch(tuned):
    directory, result = tuned
    assert "experiments of 1 node(s) x 1 slot(s), 1 node(s) x 2 slot(s), 1 node(s) x 4 slot(s)" in result.stdout
    configs = {p.parent.name: json.loads(p.read_text()) for p in directory.glob("train_*/ds_config.json")}
    worlds = {name.split("_")[1] for name in configs}
    assert worlds == {"g1", "g2", "g4"}
    for name, config in configs.items():
        world = int(name.split("_")[1][1:])
        assert config["train_batch_size"] == 64
        assert config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * world == 64, name
    report = json.loads(autotune("report", directory, "--format", "json").stdout)
    sizes = report["scaling"]["sizes"]
    assert [s["gpus"] for s in sizes] == [1, 2, 4]
    assert sizes[0]["efficiency"] == 1.0
    for s in sizes:  # computed from what ran: the per-GPU figure of the size's own best
        assert s["per_gpu"] == pytest.approx(s["samples_per_s"] / s["gpus"])
        assert s["best"].startswith(f"train_g{s['gpus']}_")
    assert sizes[2]["efficiency"] < sizes[1]["efficiency"] < 1  # the curve: each doubling keeps 0.9^(1+stage/2)


def test_the_cheapest_within_the_deadline_is_named_and_its_files_written(tuned):
    directory, result = tuned
    training = json.loads(autotune("report", directory, "--format", "json").stdout)["training"]
    assert training["fastest"].startswith("train_g4_")
    assert training["cheapest"].startswith("train_g1_")  # one GPU: the least GPU-hours, within 30 days
    assert {training["fastest"], training["cheapest"]} <= set(training["front"])
    assert "cheapest within 30 days: train_g1_" in result.stdout
    command = (directory / "cmd_cheapest.txt").read_text()
    assert "--num_gpus 1 " in command and str(directory / "ds_config_cheapest.json") in command
    config = json.loads((directory / "ds_config_cheapest.json").read_text())
    assert config["train_batch_size"] == 64 and "autotuning" not in config
    tighter = json.loads(autotune("report", directory, "--format", "json", "--deadline-days", "5").stdout)
    assert not tighter["training"]["cheapest"].startswith("train_g1_")  # 1 GPU takes longer than 5 days


@pytest.mark.parametrize(("args", "message"), [
    (["--num_gpus", "0"], "--num_gpus '0': counts are whole numbers from 1"),
    (["--num_gpus", "1,x"], "--num_gpus '1,x': a count (4), a list (1,2,4,8)"),
    (["--num_gpus", "8-2"], "a range low to high"),
    (["--num_gpus", "1,3"], "train_batch_size 64 cannot be kept"),
    (["--num_gpus", "1,4"], "experiment train_g4_z1_mbs1_gas16 needs 1 node(s) with 4 slot(s) each"),  # 2 slots
])
def test_bad_world_sizes_are_one_line_before_anything_runs(tmp_path, args, message):
    result = tune(tmp_path, setup(tmp_path), *args, slots="2")
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "launches.log").exists()


def test_resume_rebuilds_every_size_from_the_ledger_and_runs_nothing_again(tuned):
    directory, _ = tuned
    before = sorted(p.name for p in directory.glob("train_*"))
    launched = (directory.parent / "launches.log").read_text()
    result = autotune("resume", directory, environ=setup(directory.parent),
                      timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in directory.glob("train_*")) == before  # each size's search was over: no new run
    assert (directory.parent / "launches.log").read_text() == launched


def test_report_plot_draws_the_front(tuned):
    directory, _ = tuned
    out = autotune("report", directory, "--plot", "--deadline-days", "5")
    assert out.returncode == 0, out.stderr
    assert "plot_front.png" in out.stderr
    assert (directory / "plot_front.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_training_gives_the_whole_run_with_a_chosen_config_and_its_spread(tuned):
    directory, _ = tuned
    out = autotune("plan", "--training", directory, "--format", "json")
    assert out.returncode == 0, out.stderr
    planned = json.loads(out.stdout)
    training = json.loads(autotune("report", directory, "--format", "json").stdout)["training"]
    best = next(c for c in training["candidates"] if c["name"] == planned["config"])
    assert planned["config"].startswith("train_g4_") and planned["days"] == best["days"]
    assert planned["runs"] == 2 and planned["days_spread"][0] <= planned["days"] <= planned["days_spread"][1]
    text = autotune("plan", "--training", directory, "--config", training["cheapest"], "--deadline-days", "5").stdout
    assert f"with {training['cheapest']} on 1 GPU(s)" in text and "deadline 5 days: missed" in text


@pytest.mark.parametrize(("args", "message"), [
    (["--config", "nope"], "--config 'nope': no config of sweep"),
    (["--train-tokens", "1e9"], "--train-tokens needs the sequence length"),
])
def test_plan_training_refuses_in_one_line(tuned, args, message):
    directory, _ = tuned
    out = autotune("plan", "--training", directory, *args)
    assert out.returncode == 2 and out.stdout == "" and message in out.stderr, out.stderr


def _tune_file(tmp_path, **counts):
    setup(tmp_path)
    lines = ["{", '  script: "train.py"', '  ds_config: "ds.json"', *(f"  {k}: {v}" for k, v in counts.items()), "}"]
    (tmp_path / "tune.hjson").write_text("\n".join(lines) + "\n")
    return tmp_path / "tune.hjson"


@pytest.mark.parametrize("gpus", ["[1, 2, 4]", '"1,2,4"', '"1-4"'])
def test_a_tune_file_states_several_world_sizes_as_the_options_do(tmp_path, gpus):
    from autotuner import read_tune

    path = _tune_file(tmp_path, num_gpus=gpus, num_nodes="[1]")
    assert read_tune(str(path), [], cwd=tmp_path).spec.worlds == ((1, 1), (2, 1), (4, 1))
    # The options win over the file, as with one count.
    assert read_tune(str(path), [], cwd=tmp_path, num_gpus=[2]).spec.worlds == ()


@pytest.mark.parametrize(("value", "message"), [
    ('"1,x"', "num_gpus '1,x': a count (4), a list (1,2,4,8)"),
    ("[1, 0]", "num_gpus must be a positive integer, not 0"),
    ('[1, "2"]', "num_gpus must be a positive integer, not '2'"),
    ("[1, [2]]", "num_gpus must be a positive integer, not [2]"),
    ("[]", "num_gpus must list 1 to 64 counts, not 0"),
    ("1.5", "num_gpus must be a positive integer, not 1.5"),
])
def test_bad_world_sizes_in_a_tune_file_are_refused_at_their_line(tmp_path, value, message):
    path = _tune_file(tmp_path, num_gpus=value)
    result = autotune("tune", "--slots", "2", "-o", tmp_path / "res", "--launcher", f"sh {STANDIN}", path,
                      environ=setup(tmp_path), cwd=tmp_path, timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "tune.hjson:4:" in result.stderr and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "launches.log").exists() and not (tmp_path / "res").exists()
