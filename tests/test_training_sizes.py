"""The training run on sizes the tune measured and on others: `tune --num_gpus 1,2 --num_nodes 1,2` on the
fake-GPU stand-in (two nodes: this machine under two of its names, each of 2 slots; OOM_STANDIN_SCALING: each
doubling of a node's GPUs keeps 0.9 of the per-GPU throughput, each doubling of the nodes 0.7) reports each size
with its nodes, and `plan --training` plans the run on a measured size as measured, on another as extrapolated
from the factors the sweep measured (and says so), with the spread the runs' steps give (OOM_STANDIN_NOISY_STEPS)."""
import json
from pathlib import Path

import pytest

from cli_rig import autotune, env

STANDIN = Path(__file__).resolve().parent / "oom_standin.sh"


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("sizes")
    (tmp_path / "train.py").write_text("# stand-in: the launcher never runs it\n")
    ds = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": [0]},
          "autotuning": {"enabled": True, "max_train_micro_batch_size_per_gpu": 4, "train_samples": 1e9,
                         "gpu_hour_cost": 2.0}}
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    (tmp_path / "hostfile").write_text("localhost slots=2\n127.0.0.1 slots=2\n")
    environ = env(OOM_STANDIN_LOG=tmp_path / "launches.log", OOM_STANDIN_SCALING="0.9 0.7",
                  OOM_STANDIN_NOISY_STEPS="30 0.05")
    result = autotune("tune", "-H", tmp_path / "hostfile", "-o", tmp_path / "res", "--launcher", f"sh {STANDIN}",
                      "--num_gpus", "1,2", "--num_nodes", "1,2", "--confirm", "0", "train.py",
                      "--deepspeed_config", "ds.json", environ=environ, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return tmp_path / "res"


def plan(directory, *args):
    out = autotune("plan", "--training", directory, "--format", "json", *args)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_each_size_is_reported_with_its_nodes_and_crossing_nodes_costs(tuned):
    report = json.loads(autotune("report", tuned, "--format", "json").stdout)
    sizes = {(s["gpus"], s["nodes"]): s for s in report["scaling"]["sizes"]}
    assert set(sizes) == {(1, 1), (2, 1), (2, 2), (4, 2)}
    # 2 GPUs on one node against 2 GPUs on two: the same count, the across-node term paid by the second
    assert sizes[2, 2]["per_gpu"] / sizes[2, 1]["per_gpu"] == pytest.approx(0.7 / 0.9, rel=1e-6)
    assert {c["nodes"] for c in report["training"]["candidates"]} == {1, 2}
    table = autotune("report", tuned).stdout
    assert "4 (2 nodes)" in table and "2 (2 nodes)" in table


def test_a_measured_size_is_planned_as_measured_with_the_best_there(tuned):
    planned = plan(tuned, "--nodes", "2", "--gpus-per-node", "1")
    assert planned["extrapolated"] is None
    assert (planned["gpus"], planned["nodes"]) == (2, 2) and planned["config"].startswith("train_g1n2_")
    text = autotune("plan", "--training", tuned, "--nodes", "2", "--gpus-per-node", "1").stdout
    assert "extrapolated, not measured" not in text and "on 2 GPU(s) on 2 nodes" in text
    assert "measured sizes only, nothing extrapolated" in text


def test_another_size_is_extrapolated_from_the_factors_the_sweep_measured_and_says_so(tuned):
    measured = plan(tuned, "--nodes", "2", "--gpus-per-node", "2")
    far = plan(tuned, "--nodes", "8", "--gpus-per-node", "2", "--config", measured["config"])
    how = far["extrapolated"]
    # the stand-in's law at ZeRO 0: 0.9 per doubling of a node's GPUs, 0.7 per doubling of the nodes
    assert how["within_per_doubling"] == pytest.approx(0.9, rel=1e-6)
    assert how["across_per_doubling"] == pytest.approx(0.7, rel=1e-6)
    assert how["per_gpu_factor"] == pytest.approx(0.7 ** 2, rel=1e-6)  # 2 -> 8 nodes, the same GPUs a node
    assert (far["gpus"], far["nodes"]) == (16, 8)
    assert far["samples_per_s"] == pytest.approx(measured["samples_per_s"] * 4 * 0.49, rel=1e-6)
    assert far["gpu_hours"] == pytest.approx(1e9 / far["samples_per_s"] / 3600 * 16, rel=1e-6)
    assert far["cost"] == pytest.approx(far["gpu_hours"] * 2.0, rel=1e-6)
    text = autotune("plan", "--training", tuned, "--nodes", "8", "--gpus-per-node", "2", "--config",
                    measured["config"]).stdout
    assert f"extrapolated, not measured: {measured['config']} was measured on 4 GPU(s) on 2 nodes" in text
    assert "x0.7 per doubling of the nodes, as the sweep measured" in text
    assert "nothing extrapolated" not in text and far["basis"].endswith("carried to the size asked for; 2 a GPU-hour")


def test_the_spread_is_what_the_runs_steps_give(tuned):
    report = json.loads(autotune("report", tuned, "--format", "json").stdout)
    planned = plan(tuned)
    run = next(r for r in report["experiments"] if r["name"] == planned["config"])
    low, high = run["metrics"]["throughput_low"], run["metrics"]["throughput_high"]
    assert low < run["metrics"]["throughput"] < high
    assert planned["samples_per_s_spread"] == pytest.approx([low, high])
    assert planned["days_spread"] == pytest.approx([1e9 / high / 86400, 1e9 / low / 86400])
    text = autotune("plan", "--training", tuned).stdout
    assert "over the spread of its 1 run(s) and their steps" in text


@pytest.mark.parametrize(("args", "message"), [
    (["--gpus-per-node", "5000"], "--gpus-per-node 5,000 is more than 1,024"),
    (["--nodes", "100000"], "--nodes 100,000 is more than 65,536"),
    (["--nodes", "0"], "--nodes"),
    (["--slurm", "--nodes", "2"], "--slurm plans a sweep in an allocation"),
])
def test_bad_sizes_are_one_line(tuned, args, message):
    out = autotune("plan", "--training", tuned, *args)
    assert out.returncode == 2 and out.stdout == "" and message in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
