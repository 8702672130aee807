"""Tensor parallelism for real: `autotune tune` searches DeepSpeed's AutoTP (`tensor_parallel.autotp_size` 1 and 2)
on a small Llama built in code (experiments/tp_llama.py) on two CPU ranks, ZeRO 1, with a fixed train_batch_size:
each TP 2 rank holds its shard, the throughput is counted in samples trained, the report shows each candidate's TP
and data-parallel sizes, and the best config trains with the chosen layout."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cli_rig import env

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "experiments"
WHOLE = 115_008  # the Llama's parameters (2 layers, hidden 64, vocabulary 256); AutoTP 2 leaves 65,856 a rank

pytestmark = pytest.mark.deepspeed  # one real DeepSpeed test at a time (conftest.py)


def test_autotp_sizes_are_tuned_on_two_cpu_ranks_and_the_report_shows_the_layout(tmp_path):
    config = json.loads((EXAMPLE / "ds_tp.json").read_text())  # narrowed: one size, two layouts, CI's minutes
    config["train_batch_size"] = 4
    config["autotuning"] |= {"min_train_micro_batch_size_per_gpu": 2, "max_train_micro_batch_size_per_gpu": 2}
    (tmp_path / "ds_tp.json").write_text(json.dumps(config))
    results = tmp_path / "results"
    run = subprocess.run([sys.executable, "-m", "autotuner.cli", "tune", "--slots", "2", "--num_gpus", "2",
                          "-o", str(results), "--confirm", "0", "tp_llama.py", "--deepspeed_config",
                          str(tmp_path / "ds_tp.json"), "--seq_len", "16"],
                         capture_output=True, text=True, timeout=900, cwd=EXAMPLE, env=env())
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(subprocess.run([sys.executable, "-m", "autotuner.cli", "report", str(results), "--format",
                                        "json"], capture_output=True, text=True, cwd=ROOT, check=True).stdout)
    runs = {r["name"]: r for r in report["experiments"]}
    assert set(runs) == {"tp_llama_tp1_z1_mbs2_gas1", "tp_llama_tp2_z1_mbs2_gas1"}, sorted(runs)
    assert {r["state"] for r in runs.values()} == {"succeeded"}, [(r["name"], r["detail"]) for r in runs.values()]
    for name, tp in (("tp_llama_tp1_z1_mbs2_gas1", 1), ("tp_llama_tp2_z1_mbs2_gas1", 2)):
        r = runs[name]
        assert (r["parameters"]["tensor_parallel.autotp_size"], r["parameters"]["dp"]) == (tp, 2 // tp)
        # DeepSpeed checks train_batch_size over every rank, TP ranks too: 2 x 1 x 2 = 4 at both sizes
        spec = json.loads((results / name / "ds_config.json").read_text())
        assert spec["train_batch_size"] == 4 and spec["tensor_parallel"]["autotp_size"] == tp
        held = [int(n) for n in re.findall(r"rank \d holds (\d+) parameters", (results / name / "stdout.log")
                                           .read_text())]
        assert len(held) == 2 and all(n == (WHOLE if tp == 1 else 65_856) for n in held), held
        assert r["metrics"]["throughput_per_gpu"] == r["metrics"]["throughput"] / 2
    tp2 = runs["tp_llama_tp2_z1_mbs2_gas1"]["metrics"]
    assert tp2["throughput_deepspeed"] == 2 * tp2["throughput"]  # DeepSpeed counted each sample on both ranks
    best = runs[report["best"]]
    optimal = json.loads((results / "ds_config_optimal.json").read_text())
    assert optimal["tensor_parallel"]["autotp_size"] == best["parameters"]["tensor_parallel.autotp_size"]
    assert "--num_gpus 2" in (results / "cmd_optimal.txt").read_text()
