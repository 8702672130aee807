"""A GPU type's price in the hostfile (`gpu_hour_cost=` beside `gpu=`): read and checked with the hostfile (one
located line for a bad one), and a tune for a training run prices each config by its type's price where the
options and the autotuning section name none for that type (a type's own price wins over one for every type)."""
import json
import sqlite3
from pathlib import Path

import pytest

from autotuner import UserError
from autotuner.spec.hostfile import parse_hostfile, prices_of

from cli_rig import SLEEP_THEN_SUCCEED, autotune, env, write_launcher, write_sweep

STANDIN = Path(__file__).resolve().parent / "oom_standin.sh"


def test_each_types_price_is_read():
    hosts = parse_hostfile("a slots=2 gpu=A100-80GB gpu_hour_cost=2.5\nb slots=2 gpu=A100-80GB gpu_hour_cost=2.5\n"
                           "c slots=8 gpu=H100-80GB gpu_hour_cost=4\nd slots=1 gpu=L4-24GB\n")
    assert prices_of(hosts) == {"A100-80GB": 2.5, "H100-80GB": 4.0}


@pytest.mark.parametrize(("text", "line", "message"), [
    ("a slots=1 gpu=A100-80GB gpu_hour_cost=-1\n", 1, "gpu_hour_cost=-1: a price from 0 to 1,000,000 a GPU-hour"),
    ("a slots=1 gpu=A100-80GB gpu_hour_cost=nan\n", 1, "gpu_hour_cost=nan: a price"),
    ("a slots=1 gpu=A100-80GB gpu_hour_cost=2e6\n", 1, "gpu_hour_cost=2e6: a price"),
    ("a slots=1 gpu=A100-80GB gpu_hour_cost=two\n", 1, "gpu_hour_cost=two: a price"),
    ("a slots=1 gpu_hour_cost=2\n", 1, "gpu_hour_cost= prices a GPU type: give the host's gpu= too"),
    ("a slots=1 gpu=A100-80GB gpu_hour_cost=2\n\nb slots=1 gpu=A100-80GB gpu_hour_cost=3\n", 3,
     "gpu_hour_cost=3 for GPU type 'A100-80GB', priced 2 on line 1: one price a type"),
    ("a slots=1 gpu=A100-80GB GPU_HOUR_COST=2\n", 1, "attributes are lower case (gpu_hour_cost=)"),
])
def test_a_bad_price_is_one_located_line(text, line, message):
    with pytest.raises(UserError) as e:
        parse_hostfile(text, "hosts.txt")
    assert message in str(e.value) and f"hosts.txt:{line}" in str(e.value), str(e.value)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("prices")
    (tmp_path / "train.py").write_text("# stand-in: the launcher never runs it\n")
    ds = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": [1]},
          "autotuning": {"enabled": True, "max_train_micro_batch_size_per_gpu": 4}}
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    (tmp_path / "hostfile").write_text("localhost slots=2 gpu=A100-80GB gpu_hour_cost=3\n")
    return tmp_path


@pytest.mark.parametrize(("options", "price"), [
    ((), 3.0),  # the hostfile's
    (("--gpu-hour-cost", "1"), 3.0),  # a price for every type: the type's own wins
    (("--gpu-hour-cost", "A100-80GB=5"), 5.0),  # the options name the type: theirs
])
def test_a_tune_prices_each_config_by_its_types_price_in_the_hostfile(work, options, price):
    results = work / f"res{price}{len(options)}"
    out = autotune("tune", "-H", work / "hostfile", "-o", results, "--launcher", f"sh {STANDIN}", "--confirm", "0",
                   "--train-samples", "1e9", *options, "train.py", "--deepspeed_config", "ds.json",
                   environ=env(OOM_STANDIN_LOG=work / "launches.log", OOM_STANDIN_MODEL="1e8 1e9 80e9"), cwd=work,
                   timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    training = json.loads(autotune("report", results, "--format", "json").stdout)["training"]
    assert training["candidates"]
    for c in training["candidates"]:
        assert c["gpu_type"] == "A100-80GB" and c["cost"] == pytest.approx(c["gpu_hours"] * price)


def test_a_tune_with_no_training_run_stated_is_priced_by_its_hostfile_when_a_report_states_one(work):
    """The hostfile's prices are the cluster's, not the goal's: a report given the training run later prices it
    with them (they were dropped when the tune stated no goal)."""
    results = work / "no_goal"
    out = autotune("tune", "-H", work / "hostfile", "-o", results, "--launcher", f"sh {STANDIN}", "--confirm", "0",
                   "train.py", "--deepspeed_config", "ds.json",
                   environ=env(OOM_STANDIN_LOG=work / "launches.log", OOM_STANDIN_MODEL="1e8 1e9 80e9"), cwd=work,
                   timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    for options, price in (((), 3.0), (("--gpu-hour-cost", "1"), 3.0), (("--gpu-hour-cost", "A100-80GB=5"), 5.0)):
        report = autotune("report", results, "--format", "json", "--train-samples", "1e9", *options)
        assert report.returncode == 0, report.stderr
        candidates = json.loads(report.stdout)["training"]["candidates"]
        assert candidates
        for c in candidates:
            assert c["cost"] == pytest.approx(c["gpu_hours"] * price), (options, c)
    text = autotune("report", results, "--train-samples", "1e9").stdout
    assert "A100-80GB 3" in text and "not priced" not in text


def priced_run(tmp_path: Path, values: list[int]) -> None:
    """A run sweep of the stand-in on a hostfile that prices its type at 2.5, ended (results in `res`)."""
    write_sweep(tmp_path, values)
    (tmp_path / "hostfile").write_text("localhost slots=2 gpu=A100-80GB gpu_hour_cost=2.5\n")
    launcher = write_launcher(tmp_path, SLEEP_THEN_SUCCEED)
    ran = autotune("run", tmp_path / "sweep.hjson", "--hostfile", tmp_path / "hostfile", "-o", tmp_path / "res",
                   "--launcher", launcher, environ=env(LAUNCH_LOG=tmp_path / "log", STANDIN_SECONDS="0"))
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_a_run_sweep_is_priced_by_its_hostfile(tmp_path):
    priced_run(tmp_path, [1, 2])
    out = autotune("report", tmp_path / "res", "--format", "json", "--train-samples", "1e6")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["training"]["candidates"]
    assert rows and all(r["cost"] == pytest.approx(r["gpu_hours"] * 2.5) for r in rows)


def test_a_ledger_whose_recorded_prices_are_not_prices_is_refused_in_one_line(tmp_path):
    priced_run(tmp_path, [1])
    with sqlite3.connect(tmp_path / "res" / "ledger.sqlite") as db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'gpu_prices'", (json.dumps({"A100-80GB": "cheap"}),))
    out = autotune("report", tmp_path / "res")
    assert out.returncode == 2 and "gpu_prices" in out.stderr and len(out.stderr.strip().splitlines()) == 1, \
        out.stderr
