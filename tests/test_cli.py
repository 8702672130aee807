"""The command line as a user meets it: bad input is one line and exit 2, and nothing is launched."""
import json
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "benchmarks" / "standin.sh"


def autotune(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "autotuner.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)


def sweep_file(tmp_path, body: str, name="sweep.hjson") -> Path:
    (tmp_path / "train.py").write_text("# stand-in script\n")
    path = tmp_path / name
    path.write_text(body)
    return path


GOOD = """{
  script: train.py
  metric: throughput
  ds_config: {train_micro_batch_size_per_gpu: 1}
  space: {"zero_optimization.stage": [0, 1, 2]}
}
"""


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_help_imports_neither_torch_nor_deepspeed():
    code = ("import sys, autotuner.cli\n"
            "from typer.testing import CliRunner\n"
            "r = CliRunner().invoke(autotuner.cli.app, ['--help'])\n"
            "assert r.exit_code == 0 and 'resume' in r.output, r.output\n"
            "bad = [m for m in ('torch', 'deepspeed', 'paramiko', 'fabric', 'matplotlib') if m in sys.modules]\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_malformed_hjson_names_file_line_and_column(tmp_path):
    path = sweep_file(tmp_path, "{\n  script: train.py\n  space: {\"a\": [1, 2}\n}\n")
    results = tmp_path / "results"
    assert_one_line_error(autotune("run", path, "--slots", "1", "-o", results), f"{path}:3:")
    assert not results.exists()


def test_unknown_key_names_its_line(tmp_path):
    path = sweep_file(tmp_path, "{\n  script: train.py\n  ds_config: {}\n  spaces: {}\n}\n")
    assert_one_line_error(autotune("run", path, "--slots", "1", "-o", tmp_path / "r"), f"{path}:4", "spaces")


def test_bad_hostfile_line(tmp_path):
    path = sweep_file(tmp_path, GOOD)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-0 slots=2\nworker-1 slots=two\n")
    assert_one_line_error(autotune("run", path, "-H", hostfile, "-o", tmp_path / "r"), f"{hostfile}:2")


def test_an_experiment_needing_more_slots_per_node_than_exist(tmp_path):
    path = sweep_file(tmp_path, GOOD.replace("metric: throughput", "metric: throughput\n  num_gpus: 4"))
    results = tmp_path / "r"
    assert_one_line_error(autotune("run", path, "--slots", "2", "-o", results), "needs 1 node(s) with 4 slot(s)")
    assert not results.exists()


def test_an_experiment_needing_more_nodes_than_exist(tmp_path):
    path = sweep_file(tmp_path, GOOD.replace("metric: throughput", "metric: throughput\n  num_nodes: 3"))
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-0 slots=2\nworker-1 slots=2\n")
    assert_one_line_error(autotune("run", path, "-H", hostfile, "-o", tmp_path / "r"), "needs 3 node(s)")


def test_bad_include_filter(tmp_path):
    path = sweep_file(tmp_path, GOOD)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-0 slots=2\n")
    assert_one_line_error(autotune("run", path, "-H", hostfile, "-i", "worker-9", "-o", tmp_path / "r"),
                          "--include", "worker-9")


def test_no_gpu_and_no_slots_says_what_to_do(tmp_path):
    assert_one_line_error(autotune("run", sweep_file(tmp_path, GOOD), "-o", tmp_path / "r"), "--slots")


def test_duplicate_experiment_names_refused(tmp_path):
    one = sweep_file(tmp_path, GOOD, "a.hjson")
    assert_one_line_error(autotune("run", one, one, "--slots", "1", "-o", tmp_path / "r"), "duplicate")


def test_a_results_directory_holding_a_sweep_is_not_touched(tmp_path):
    path = sweep_file(tmp_path, GOOD)
    results = tmp_path / "r"
    first = autotune("run", path, "--slots", "3", "--launcher", f"sh {STANDIN}", "-o", results, "-q")
    assert first.returncode == 0, first.stderr
    before = {p: p.stat().st_mtime_ns for p in results.rglob("*")}
    assert_one_line_error(autotune("run", path, "--slots", "3", "-o", results), "autotune resume")
    assert {p: p.stat().st_mtime_ns for p in results.rglob("*")} == before


def test_report_of_a_directory_without_a_sweep(tmp_path):
    assert_one_line_error(autotune("report", tmp_path), "no sweep here")


def test_run_prints_the_best_and_where_its_files_are(tmp_path):
    path = sweep_file(tmp_path, GOOD)
    results = tmp_path / "r"
    out = autotune("run", path, "--slots", "2", "--launcher", f"sh {STANDIN}", "-o", results)
    assert out.returncode == 0, out.stderr
    assert "3 experiments: 3 succeeded" in out.stdout
    assert f"config:  {results}/ds_config_optimal.json" in out.stdout
    assert f"command: {results}/cmd_optimal.txt" in out.stdout
    report = json.loads(autotune("report", results, "--format", "json").stdout)
    assert [r["state"] for r in report["experiments"]] == ["succeeded"] * 3
    assert sum(r["best"] for r in report["experiments"]) == 1
