"""What training will cost: `tune` / `report` given the training run (--train-tokens with a sequence length, or
--train-samples; --gpu-hour-cost; --deadline-days, or the same in the config's autotuning section) price every
config on the stand-in's fake GPU: time to train, GPU-hours, cost, the front, the fastest and the cheapest within
the deadline; bad input is one located line, exit 2."""
import csv
import io
import json
from pathlib import Path

import pytest

import autotuner
from autotuner import UserError

from cli_rig import SLEEP_THEN_SUCCEED, autotune, env, write_launcher, write_sweep

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "oom_standin.sh"


def setup(tmp_path, autotuning=None):
    (tmp_path / "train.py").write_text("# stand-in: the launcher never runs it\n")
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
          "zero_optimization": {"stage": [1, 2]},
          "autotuning": {"enabled": True, "metric": "throughput", "max_train_micro_batch_size_per_gpu": 16}
          | (autotuning or {})}
    (tmp_path / "ds.json").write_text(json.dumps(ds, indent=1))
    return env(OOM_STANDIN_LOG=tmp_path / "launches.log")


def tune(tmp_path, environ, *extra):
    return autotune("tune", "--slots", "2", "-o", tmp_path / "res", "--launcher", f"sh {STANDIN}", *extra,
                    "train.py", "--deepspeed_config", "ds.json", environ=environ, cwd=tmp_path, timeout=300)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """One tune for a training run stated in the autotuning section (its report read by the tests below)."""
    tmp_path = tmp_path_factory.mktemp("tuned")
    result = tune(tmp_path, setup(tmp_path, {"train_samples": 1e9, "gpu_hour_cost": 2.5, "deadline_days": 100}))
    assert result.returncode == 0, result.stdout + result.stderr
    return tmp_path / "res", result


def test_the_end_of_tune_names_the_fastest_and_the_cheapest_within_the_deadline(tuned):
    _, result = tuned
    assert "training run (1,000,000,000 samples):" in result.stdout
    assert "fastest: train_z1_mbs16, " in result.stdout
    assert "cheapest within 100 days: train_z1_mbs16 (the fastest)" in result.stdout


def test_every_config_gets_its_time_gpu_hours_and_cost_in_json(tuned):
    directory, _ = tuned
    report = json.loads(autotune("report", directory, "--format", "json").stdout)
    training = report["training"]
    assert training["unit"] == "samples" and training["fastest"] == "train_z1_mbs16"
    rows = {c["name"]: c for c in training["candidates"]}
    rates = {r["name"]: r["metrics"]["throughput"] for r in report["experiments"] if r["state"] == "succeeded"
             and "_confirm" not in r["name"]}
    assert set(rows) == set(rates)
    for name, row in rows.items():  # computed from the measured throughput, on 1 GPU, at 2.5 a GPU-hour
        assert row["hours"] == pytest.approx(1e9 / rates[name] / 3600)
        assert row["gpu_hours"] == pytest.approx(row["hours"] * 1)
        assert row["cost"] == pytest.approx(row["gpu_hours"] * 2.5)
        assert row["meets_deadline"] == (row["days"] <= 100)
    assert training["front"] == ["train_z1_mbs16"]  # one GPU each: the fastest is the cheapest
    assert "measured throughput" in training["basis"] and "nothing extrapolated" in training["basis"]


def test_the_options_override_the_section_and_csv_and_markdown_carry_the_figures(tuned):
    directory, _ = tuned
    out = autotune("report", directory, "--format", "csv", "--train-tokens", "2e12", "--seq-len", "2000",
                   "--gpu-hour-cost", "4")
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    best = next(r for r in rows if r["name"] == "train_z1_mbs16")
    assert best["train_unit"] == "tokens"
    assert float(best["train_rate_per_s"]) == pytest.approx(float(best["throughput"]) * 2000)
    assert float(best["train_cost"]) == pytest.approx(float(best["train_gpu_hours"]) * 4, rel=1e-4)
    assert best["train_front"] == "True"
    md = autotune("report", directory, "--format", "md").stdout
    assert "**training run: 1,000,000,000 samples**" in md and "| name | GPUs | samples/s |" in md


def test_a_deadline_no_config_meets_is_said_plainly(tuned):
    directory, _ = tuned
    out = autotune("report", directory, "--deadline-days", "0.5")
    assert out.returncode == 0, out.stderr
    assert "no candidate meets the deadline of 0.5 days: the fastest, train_z1_mbs16, takes" in out.stdout
    data = json.loads(autotune("report", directory, "--deadline-days", "0.5", "--format", "json").stdout)
    assert data["training"]["cheapest"] is None and data["training"]["deadline_met"] is False


@pytest.mark.parametrize(("args", "message"), [
    (["--train-tokens", "1e12"], "--train-tokens needs the sequence length: --seq-len N"),
    (["--train-samples", "0"], "--train-samples must be a positive whole number"),
    (["--train-samples", "1.5"], "--train-samples must be a positive whole number"),
    (["--train-samples", "1e9", "--gpu-hour-cost", "-1"], "--gpu-hour-cost must be a price from 0"),
    (["--train-samples", "1e9", "--gpu-hour-cost", "nan"], "--gpu-hour-cost must be a finite number"),
    (["--train-samples", "1e9", "--gpu-hour-cost", "inf"], "--gpu-hour-cost must be a finite number"),
    (["--train-samples", "1e9", "--deadline-days", "0"], "--deadline-days must be a number of days above 0"),
    (["--train-samples", "1e9", "--train-tokens", "1e9", "--seq-len", "8"], "give one amount to train"),
    (["--gpu-hour-cost", "2"], "--gpu-hour-cost needs what is to be trained"),
    (["--train-samples", "1e9", "--gpu-hour-cost", "A100=2,A100=3"], "GPU type 'A100' priced twice"),
    (["--train-samples", "1e9", "--gpu-hour-cost", "A 100=2"], "is not a GPU type"),
])
def test_bad_training_options_are_one_line_before_anything_runs(tmp_path, args, message):
    environ = setup(tmp_path)
    result = tune(tmp_path, environ, *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "res").exists() and not (tmp_path / "launches.log").exists()


@pytest.mark.parametrize(("section", "message"), [
    ({"train_tokens": 1e12}, "autotuning.train_tokens needs the sequence length"),
    ({"train_samples": -5}, "autotuning.train_samples must be a positive whole number"),
    ({"train_samples": "1e9"}, "autotuning.train_samples must be a number"),
    ({"train_samples": 10, "gpu_hour_cost": {"H100": -1}}, "must be a price from 0"),
    ({"train_samples": 10, "gpu_hour_cost": {"H100": True}}, "is not a GPU type"),
    ({"deadline_days": 3}, "autotuning.deadline_days needs what is to be trained"),
])
def test_bad_training_keys_of_the_section_are_located_at_their_line(tmp_path, section, message):
    setup(tmp_path, section)
    with pytest.raises(UserError) as caught:
        autotuner.read_tune("train.py", ["--deepspeed_config", "ds.json"], cwd=tmp_path)
    assert message in str(caught.value)
    key = "gpu_hour_cost" if "gpu_hour_cost" in section else next(iter(section))
    text = (tmp_path / "ds.json").read_text().splitlines()
    assert caught.value.line is not None and f'"{key}"' in text[caught.value.line - 1], str(caught.value)


def test_a_token_goal_takes_the_models_sequence_length(tmp_path):
    setup(tmp_path, {"train_tokens": 4096, "model_info": {"num_params": 1000, "seq_length": 512}})
    request = autotuner.read_tune("train.py", ["--deepspeed_config", "ds.json"], cwd=tmp_path)
    assert request.spec.goal is not None and request.spec.goal["tokens"] == 4096


def test_report_refuses_a_goal_it_cannot_price_in_one_line(tuned):
    directory, _ = tuned
    out = autotune("report", directory, "--train-tokens", "1e9")
    assert out.returncode == 2 and out.stdout == ""
    assert "--train-tokens needs the sequence length" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_the_html_page_prices_the_training_run(tuned, tmp_path):
    directory, _ = tuned
    page = tmp_path / "page.html"
    out = autotune("report", directory, "--html", page, "--deadline-days", "0.5")
    assert out.returncode == 0, out.stderr
    text = page.read_text()
    assert '<h2 id="training">Training run' in text and '<tr class="front">' in text
    assert "no candidate meets the deadline of 0.5 days" in text


def test_a_goal_report_cannot_price_refuses_before_any_plot_or_page_is_written(tuned, tmp_path):
    directory, _ = tuned
    page = tmp_path / "page.html"
    out = autotune("report", directory, "--plot", "--html", page, "--train-tokens", "1e9")
    assert out.returncode == 2 and "--train-tokens needs the sequence length" in out.stderr
    assert not page.exists() and not (directory / "plot_metric.png").exists()


def test_a_price_per_gpu_type_prices_a_run_sweep_and_a_type_without_one_is_refused(tmp_path):
    write_sweep(tmp_path, [1, 2])
    (tmp_path / "hostfile").write_text("localhost slots=2 gpu=A100-80GB\n")
    launcher = write_launcher(tmp_path, SLEEP_THEN_SUCCEED)
    ran = autotune("run", tmp_path / "sweep.hjson", "--hostfile", tmp_path / "hostfile", "-o", tmp_path / "res",
                   "--launcher", launcher, environ=env(LAUNCH_LOG=tmp_path / "log", STANDIN_SECONDS="0"))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    out = autotune("report", tmp_path / "res", "--format", "json", "--train-samples", "1e6", "--gpu-hour-cost",
                   "H100=9,A100-80GB=3")
    assert out.returncode == 0, out.stderr
    for row in json.loads(out.stdout)["training"]["candidates"]:
        assert row["gpu_type"] == "A100-80GB" and row["cost"] == pytest.approx(row["gpu_hours"] * 3)
    refused = autotune("report", tmp_path / "res", "--train-samples", "1e6", "--gpu-hour-cost", "H100=9")
    assert refused.returncode == 2 and refused.stdout == ""
    assert "--gpu-hour-cost names no price for GPU type 'A100-80GB'" in refused.stderr
