"""Reports people build on: every output has one row per experiment with every swept parameter and every metric;
the Python results API (`autotuner.load`); `--format` on every read command; tables fitted to the terminal,
coloured only there; plots whose failures stand apart; the HTML page's links, sorting and utilisation."""
from __future__ import annotations

import contextlib
import csv
import fcntl
import io
import json
import os
import pkgutil
import re
import socket
import struct
import subprocess
import sys
import termios
from collections.abc import Iterator
from pathlib import Path

import pandas
import pytest

import autotuner
from autotuner.backends.ssh.probe import HostReport
from autotuner.ledger.store import Ledger
from autotuner.spec import Sweep
from autotuner.states import State
from autotuner.views.records import PANDAS_HINT
from autotuner.views.report import render_report
from autotuner.views.tables import PLAIN, RICH_ROWS, Column, Output, json_with_rows, markdown_table, render_table

from cli_rig import env as tree_env
from helpers import experiment, render_hosts
from recorded import T0, grid_sweep, record, two_nodes

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "benchmarks" / "standin.sh"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# In the order the ledger holds a spec's keys (sorted), as every output lists them.
PARAMETERS = ["gradient_accumulation_steps", "train_micro_batch_size_per_gpu", "zero_optimization.stage"]


def deepspeed_metrics(name: str, throughput: float) -> dict:
    """What DeepSpeed's engine writes beside throughput and latency, and a custom metric of the script's."""
    return {"FLOPS_per_gpu": throughput * 3.1e9, "fwd": 1.25, "bwd": 2.5, "step": 0.75, "rank": 0,
            "tokens_per_s": throughput * 512}


@pytest.fixture
def sweep(tmp_path):
    """3 ZeRO stages x 4 micro-batch sizes x 2 accumulation steps: 18 ended (2 OOM), 2 running, 4 queued."""
    return record(tmp_path / "s", grid_sweep(mbs=(4, 8, 16, 32), gas=(1, 2)), two_nodes(), finished=18, running=2,
                  fail=("zm_z0_mbs16_gas2", "zm_z1_mbs8_gas1"), extra=deepspeed_metrics)


METRICS = ["throughput", "latency", "FLOPS_per_gpu", "fwd", "bwd", "step", "rank", "tokens_per_s"]
COLUMNS = [m if m != "rank" else "metrics.rank" for m in METRICS]  # beside the report's own rank


def cli(*args, env=None, cwd=None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in tree_env().items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS")}
    return subprocess.run([sys.executable, "-m", "autotuner.cli", *map(str, args)], capture_output=True, text=True,
                          env={**environ, **(env or {})}, cwd=cwd, timeout=120)


# --- every output: one row per experiment, every swept parameter and metric ----------------------------------
def test_csv_has_a_column_for_every_parameter_and_metric(sweep):
    text = render_report(sweep, "csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    header = text.splitlines()[0].split(",")
    # DeepSpeed's `rank` would take the report's own rank column: it gets the metrics. prefix
    assert header == ["rank", "best", "name", "state", *PARAMETERS, "throughput", "latency", "FLOPS_per_gpu", "fwd",
                      "bwd", "step", "metrics.rank", "tokens_per_s", "metric", "reason", "detail", "attempt",
                      "started", "finished", "duration_s", "gpu_hours", "peak_memory", "slots"]
    assert len(rows) == 24 and len({r["name"] for r in rows}) == 24
    best = rows[0]
    assert best["name"] == "zm_z0_mbs32_gas1" and best["best"] == "True" and best["rank"] == "1"
    assert (best["gradient_accumulation_steps"], best["train_micro_batch_size_per_gpu"],
            best["zero_optimization.stage"]) == ("1", "32", "0")
    assert float(best["throughput"]) == 1600.0 and float(best["tokens_per_s"]) == 1600.0 * 512
    assert float(best["FLOPS_per_gpu"]) == pytest.approx(1600 * 3.1e9) and best["metrics.rank"] == "0"
    oom = next(r for r in rows if r["name"] == "zm_z1_mbs8_gas1")
    assert (oom["state"], oom["reason"], oom["throughput"], oom["zero_optimization.stage"]) == \
        ("failed", "oom", "", "1")
    queued = next(r for r in rows if r["state"] == "queued")
    assert queued["started"] == "" and queued["train_micro_batch_size_per_gpu"] in ("4", "8", "16", "32")


def test_csv_writes_list_and_object_values_as_json_and_quotes_cells_in_rank_order(tmp_path):
    """A value that is a list or an object is a JSON cell; a detail with a comma, a quote and a line break is one
    quoted cell; the rows, written a line each in the sweep's order, come out ranked."""
    configs = [{"betas": [0.9, 0.99], "opt": {"type": "Adam"}}, {"betas": [0.8, 0.9], "opt": {"type": "SGD"}},
               {"betas": [0.7, 0.9], "opt": {"type": "Lamb"}}]
    sweep = Sweep("c", tuple(experiment(f"c{i}", ds_config=c) for i, c in enumerate(configs)),
                  autotuner.metric_named("throughput"), "test")
    directory = record(tmp_path / "s", sweep, two_nodes(), finished=2, value=lambda name: 1.0 + int(name[1:]))
    with Ledger.open(directory) as ledger:
        ledger.start("c2", 1, slots={"node-a": [0]}, tag="t.c2", dir=str(directory / "c2"), at=T0)
        ledger.finish("c2", 1, State.FAILED, T0 + 1, reason="exit", detail='bad "x", then\nmore')
    rows = list(csv.DictReader(io.StringIO(render_report(directory, "csv"))))
    assert [r["name"] for r in rows] == ["c1", "c0", "c2"]
    assert [json.loads(r["betas"]) for r in rows] == [[0.8, 0.9], [0.9, 0.99], [0.7, 0.9]]
    assert [r["opt.type"] for r in rows] == ["SGD", "Adam", "Lamb"]  # text as it is
    assert rows[2]["detail"] == 'bad "x", then\nmore' and rows[2]["state"] == "failed"


def test_json_rows_hold_parameters_and_metrics(sweep):
    data = json.loads(render_report(sweep, "json"))
    assert data["parameters"] == PARAMETERS and data["metrics"] == METRICS
    assert len(data["experiments"]) == 24
    for row in data["experiments"]:
        assert set(row["parameters"]) == set(PARAMETERS), row
        if row["state"] == "succeeded":
            assert set(row["metrics"]) == set(METRICS) and row["metric"] == row["metrics"]["throughput"]
            assert row["finished_at"] - row["started_at"] == pytest.approx(row["duration_s"])
    best = data["experiments"][0]
    assert best["parameters"] == {"train_micro_batch_size_per_gpu": 32, "gradient_accumulation_steps": 1,
                                  "zero_optimization.stage": 0}
    assert best["metrics"]["tokens_per_s"] == 1600.0 * 512


@pytest.mark.parametrize("rows, order", [([], None), ([{"n": 1}], None), ([{"n": 1}], [0]),
                                         ([{"n": 1}, {"n": "a\n  \"rows\": [] b"}, {"n": [3]}], [2, 0, 1])])
def test_json_rows_one_a_line_in_order_whatever_their_number(rows, order):
    """The document indented, its rows one compact object a line in `order`, joined once (json_with_rows)."""
    before = 'a\n  "rows": [] b'  # the key's own text in a value before it: a string holds no line break
    text = json_with_rows({"sweep": before, "rows": rows, "after": {"k": [1]}}, "rows", order)
    expected = [rows[i] for i in order] if order is not None else rows
    assert json.loads(text) == {"sweep": before, "rows": expected, "after": {"k": [1]}} and text.endswith("}\n")
    lines = text.splitlines()
    start = lines.index('  "rows": [' if rows else '  "rows": [],')
    assert [json.loads(line.strip().rstrip(",")) for line in lines[start + 1:start + 1 + len(rows)]] == expected
    assert lines[start + len(rows) + 1:] == (["  ],"] if rows else []) + ['  "after": {', '    "k": [', "      1",
                                                                        "    ]", "  }", "}"]


@pytest.mark.parametrize("encoder", ["reused", "missing", "other"])
def test_json_rows_are_json_dumps_whichever_encoder_writes_them(encoder, monkeypatch):
    """Rows are encoded by json's C encoder made once, where it encodes as json.dumps does; json.dumps else."""
    from autotuner.views import tables

    if encoder == "missing":  # another interpreter's json
        monkeypatch.setattr(tables, "_C_ENCODER", None)
    elif encoder == "other":  # one that encodes otherwise, or takes other arguments
        monkeypatch.setattr(tables, "_C_ENCODER", lambda *args: lambda value, level: ["[]"])
    monkeypatch.setattr(tables, "_row_encoder", tables._row_encoder.__wrapped__)
    rows = [{"name": "\u00e9\t\"x\"", "metric": 1e-7, "n": -3, "none": None, "best": False,
             "parameters": {"offload": {"device": "cpu"}, "list": [1, 2.5, "a"]}, "metrics": {}}] * 2
    assert tables._row_encoder() is json.dumps or encoder == "reused"
    lines = json_with_rows({"rows": rows}, "rows").splitlines()[2:4]
    assert lines == ["    " + json.dumps(rows[0]) + ",", "    " + json.dumps(rows[1])]


def test_read_views_hand_what_they_read_to_a_caller_that_holds_it(sweep, tmp_path):
    """`keep`: the command line holds the snapshot and records to its end rather than free them one by one."""
    held: list[object] = []
    render_report(sweep, "csv", keep=held)
    assert [type(x).__name__ for x in held] == ["Snapshot", "SweepResults"] and len(held[1]) == 24
    held.clear()
    autotuner.render_compare(sweep, sweep, "json", keep=held)
    assert [type(x).__name__ for x in held] == ["Comparison"] and len(held[0].rows) == 24
    held.clear()
    autotuner.render_status(sweep, keep=held)
    assert [type(x).__name__ for x in held] == ["Snapshot"] and len(held[0].attempts) == 24


def test_a_markdown_cell_or_header_with_a_line_break_or_a_bar_stays_in_its_row():
    """A swept string value (or a ds_config key) holding a line break ended its row there: the rest became a line
    of other columns."""
    table = markdown_table(["name", "v|w", "x\ny"], [["e1", "line1\nline2", "a|b"], ["e2", "c\r\nd", ""]])
    assert table.splitlines() == ["| name | v/w | x y |", "|---|---|---|", "| e1 | line1 line2 | a/b |",
                                  "| e2 | c d |  |"]


def test_markdown_has_every_parameter_and_metric(sweep):
    lines = render_report(sweep, "md").splitlines()
    assert lines[0] == ("|  | name | state | " + " | ".join(PARAMETERS) + " | " + " | ".join(COLUMNS) +
                        " | time | GPU-hours | reason |")
    assert lines[2] == ("| **best** | zm_z0_mbs32_gas1 | succeeded | 1 | 32 | 0 | 1,600 | 0.625 | 4.96T | 1.25 | "
                        "2.5 | 0.75 | 0 | 819,200 | 10.0s | 0.002778 |  |")  # 10 s on one slot
    assert len(lines) == 2 + 24 + 2 and lines[-1].startswith("- GPU-hours: ") and "0.002778 on the best" in lines[-1]
    oom = next(line for line in lines if "zm_z1_mbs8_gas1" in line)
    assert "| failed | 1 | 8 | 1 | - |" in oom and "oom: torch.OutOfMemoryError" in oom


def test_table_has_every_parameter_and_metric_with_short_headers_explained(sweep):
    text = render_report(sweep, "table")
    assert not ANSI.search(text)  # a file gets no colour
    header = next(line for line in text.splitlines() if "name" in line and "state" in line)
    cells = [c.strip() for c in header.strip("┃").split("┃")]
    assert cells == ["#", "name", "state", "gas", "mbs", "z", *COLUMNS, "time", "GPU-h", "slots", "why"]
    assert ("columns: gas = gradient_accumulation_steps, mbs = train_micro_batch_size_per_gpu, "
            "z = zero_optimization.stage") in text
    best = next(line for line in text.splitlines() if "zm_z0_mbs32_gas1" in line)
    assert [c.strip() for c in best.strip("│").split("│")][:14] == [
        "best", "zm_z0_mbs32_gas1", "succeeded", "1", "32", "0", "1,600", "0.625", "4.96T", "1.25", "2.5", "0.75",
        "0", "819,200"]
    rows = [line for line in text.splitlines() if line.startswith("│")]
    assert len(rows) == 24  # a file: every row on one line, however wide


def test_headers_of_keys_that_end_alike_stay_apart():
    from autotuner.views.report import headers

    keys = ["zero_optimization.offload_optimizer.device", "zero_optimization.offload_param.device",
            "zero_optimization.stage", "num_gpus", "bf16.enabled", "fp16.enabled"]
    assert headers(keys, ("name",)) == {
        "zero_optimization.offload_optimizer.device": "offload_optimizer.device",
        "zero_optimization.offload_param.device": "offload_param.device",
        "zero_optimization.stage": "z", "num_gpus": "gpus", "bf16.enabled": "bf16.enabled",
        "fp16.enabled": "fp16.enabled"}
    assert headers(["a.name"], ("name",)) == {"a.name": "a.name"}  # never a header that is taken


# --- the Python results API ----------------------------------------------------------------------------------
def test_load_gives_one_record_per_experiment(sweep):
    results = autotuner.load(sweep)
    assert isinstance(results, autotuner.SweepResults) and len(results) == 24
    assert results.parameters == tuple(PARAMETERS) and results.metrics == tuple(METRICS)
    assert results.metric.name == "throughput" and results.name == "zm"
    best = results.best
    assert best is results[0] and best is results["zm_z0_mbs32_gas1"] and best.best and best.rank == 1
    assert best.state == autotuner.State.SUCCEEDED and best.reason is None and best.attempt == 1
    assert best.parameters == {"train_micro_batch_size_per_gpu": 32, "gradient_accumulation_steps": 1,
                               "zero_optimization.stage": 0}
    assert best.metrics["throughput"] == 1600.0 and best.metric == 1600.0 and set(best.metrics) == set(METRICS)
    assert best.duration == pytest.approx(best.finished - best.started) and best.duration > 0
    assert best.slots == {"node-b": (3,)} and best.directory == sweep / "zm_z0_mbs32_gas1"
    assert [r.rank for r in results if r.rank] == list(range(1, 17))  # 16 succeeded, ranked
    assert sum(r.best for r in results) == 1
    oom = results["zm_z1_mbs8_gas1"]
    assert (oom.state, oom.reason, oom.metric, oom.rank) == ("failed", "oom", None, None)
    assert oom.detail.startswith("torch.OutOfMemoryError")
    running = [r for r in results if r.state == "running"]
    assert len(running) == 2 and all(r.started and r.finished is None and r.duration is None for r in running)
    queued = [r for r in results if r.state == "queued"]
    assert len(queued) == 4 and all(r.started is None and not r.slots and not r.metrics for r in queued)
    with pytest.raises(KeyError):
        results["nope"]
    rows = results.rows()
    assert [list(row) for row in rows] == [results.columns()] * 24
    assert rows[0]["state"] == "succeeded" and type(rows[0]["state"]) is str and rows[0]["metrics.rank"] == 0


def test_metrics_beyond_the_known_are_listed_as_the_ranking_first_shows_them(tmp_path):
    """Records are made in the sweep's order, but a metric that is neither the sweep's nor DeepSpeed's takes its
    column where the ranking first shows it: the best run's own metrics first."""
    def extra(name: str, throughput: float) -> dict:
        return {"warmup_s": 1.0} if "_mbs4" in name else {"tokens_per_s": throughput * 512}

    directory = record(tmp_path / "s", grid_sweep(stages=(0,)), two_nodes(), finished=4, extra=extra)
    results = autotuner.load(directory)
    assert results.in_sweep_order[0].name == "zm_z0_mbs4" and results.best.name == "zm_z0_mbs32"
    assert results.metrics == ("throughput", "latency", "tokens_per_s", "warmup_s")
    assert render_report(directory, "csv").splitlines()[0].endswith(",throughput,latency,tokens_per_s,warmup_s,"
                                                                    "metric,reason,detail,attempt,started,finished,"
                                                                    "duration_s,gpu_hours,peak_memory,slots")


def test_load_of_a_directory_without_a_sweep_is_a_user_error(tmp_path):
    with pytest.raises(autotuner.UserError, match="no sweep here"):
        autotuner.load(tmp_path)


def test_load_is_the_function_whatever_is_imported():
    import autotuner.views.records

    assert callable(autotuner.load) and autotuner.load.__name__ == "load_results"
    modules = {m.name for m in pkgutil.iter_modules(autotuner.__path__)}
    assert "load" not in modules  # load is not a module: importing one of that name cannot shadow the function
    assert autotuner.views.records is not autotuner.load


def test_to_dataframe_without_pandas_names_pandas(sweep, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # as if it were not installed
    with pytest.raises(ImportError, match="pip install pandas") as caught:
        autotuner.load(sweep).to_dataframe()
    assert str(caught.value) == PANDAS_HINT


def test_to_dataframe_is_a_real_pandas_dataframe_of_the_rows(sweep):
    """With the real pandas (the `dataframe` extra, installed for the tests): one row per experiment, the
    columns of `columns()`, the values of `rows()`; what has no metric yet is missing, not zero."""
    results = autotuner.load(sweep)
    frame = results.to_dataframe()
    assert isinstance(frame, pandas.DataFrame)
    assert list(frame.columns) == results.columns() and frame.shape == (24, len(results.columns()))
    assert frame.loc[0, "name"] == "zm_z0_mbs32_gas1" and frame.loc[0, "zero_optimization.stage"] == 0
    first = {key: None if pandas.isna(value) else value for key, value in frame.iloc[0].items()}  # None: NaN there
    assert first == results.rows()[0]
    queued = frame[frame["state"] == "queued"]
    assert len(queued) == 4 and queued["metric"].isna().all()
    best = frame.sort_values("metric", ascending=False).iloc[0]
    assert best["name"] == results.rows()[0]["name"]


# --- --format on every read command --------------------------------------------------------------------------
@pytest.mark.parametrize("command, choices", [
    ("report", "table|json|csv|md"), ("compare", "table|json|csv|md"), ("hosts", "table|json|csv|md"),
    ("status", "table|json"), ("plan", "table|json"), ("cancel", "table|json"), ("run", "table|json"),
    ("resume", "table|json")])
def test_help_lists_the_format_choices(command, choices):
    result = cli(command, "--help", env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if "--format" in line)
    assert choices in line and "-f" in line


@pytest.mark.parametrize("command", [["report", "D"], ["status", "D"], ["compare", "D", "D"], ["cancel", "D"]])
def test_an_unknown_format_is_a_one_line_usage_error(command):
    result = cli(*command, "--format", "yaml")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "--format" in result.stderr and "yaml" in result.stderr


def test_status_json_is_an_alias_of_format_json(sweep):
    a, b = cli("status", sweep, "--json"), cli("status", sweep, "--format", "json")
    assert a.returncode == b.returncode == 0
    one, two = json.loads(a.stdout), json.loads(b.stdout)
    for data in (one, two):
        for run in data["running"]:
            run.pop("elapsed_s")
    assert one == two and one["counts"] == {"succeeded": 16, "failed": 2, "running": 2, "queued": 4}


def test_compare_csv_and_md(sweep, tmp_path):
    other = record(tmp_path / "o", grid_sweep(mbs=(4, 8, 16, 32), gas=(1, 2)), two_nodes(), finished=24)
    rows = list(csv.DictReader(io.StringIO(cli("compare", sweep, other, "-f", "csv").stdout)))
    assert len(rows) == 24 and set(rows[0]) == {"name", "a_state", "a_metric", "a_reason", "a_gpu_hours", "b_state",
                                                "b_metric", "b_reason", "b_gpu_hours", "ratio", "verdict"}
    same = next(r for r in rows if r["name"] == "zm_z0_mbs32_gas1")
    assert float(same["ratio"]) == 1.0 and same["verdict"] == "same"
    md = cli("compare", sweep, other, "--format", "md").stdout.splitlines()
    assert md[0] == "| name | A throughput | B throughput | B/A |  |" and len(md) == 2 + 24 + 2
    assert md[-2].startswith("- in A: GPU-hours: ") and md[-1].startswith("- in B: GPU-hours: ")


def hosts_fixture() -> tuple[dict, list[HostReport]]:
    from autotuner.gpu.nvml import Gpu
    from autotuner.spec.hostfile import Host

    listed = {"gpu-1": Host("gpu-1", 2), "gpu-2": Host("gpu-2", 8)}
    reports = [HostReport("gpu-1", True, gpus=[Gpu(0, "H100", 80 * 2**30, 70 * 2**30, "u0")], python="3.11.7",
                          deepspeed="0.19.8", loadavg=(0.5, 0.25, 0.125)),
               HostReport("gpu-2", False, reason="connection refused")]
    return listed, reports


def test_hosts_in_every_format():
    listed, reports = hosts_fixture()
    rows = list(csv.reader(io.StringIO(render_hosts("t", listed, reports, "csv"))))
    assert rows == [["host", "slots", "type", "state", "GPUs", "python", "deepspeed", "load"],
                    ["gpu-1", "2", "H100-80GB", "up", "H100 70/80 GiB free", "3.11.7", "0.19.8", "0.50 0.25 0.12"],
                    ["gpu-2", "8", "", "down: connection refused", "", "", "", ""]]
    assert render_hosts("t", listed, reports, "md").splitlines()[3] == \
        "| gpu-2 | 8 |  | down: connection refused |  |  |  |  |"
    assert json.loads(render_hosts("t", listed, reports, "json"))[1]["reason"] == "connection refused"
    coloured = render_hosts("t", listed, reports, "table", Output(120, True))
    assert "\x1b[32mup" in coloured and "\x1b[31mdown" in coloured


@contextlib.contextmanager
def refusing_ssh(tmp_path: Path, host: str) -> Iterator[tuple[Path, Path]]:
    """A hostfile of `host` and an ssh_config sending it to a port bound but never listening (every connection
    refused at once), while the `with` lasts."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        config = tmp_path / "ssh_config"
        config.write_text(f"Host {host}\n  HostName 127.0.0.1\n  Port {closed.getsockname()[1]}\n")
        hostfile = tmp_path / "hostfile"
        hostfile.write_text(f"{host} slots=2\n")
        yield hostfile, config


def test_hosts_json_is_an_alias_of_format_json(tmp_path):
    with refusing_ssh(tmp_path, "node-x") as (hostfile, config):
        results = [cli("hosts", "-H", hostfile, "--ssh-config", config, *flags) for flags in
                   (["--json"], ["--format", "json"], ["-f", "csv"])]
    assert [r.returncode for r in results] == [1, 1, 1]
    one, two = (json.loads(r.stdout) for r in results[:2])
    for data in (one, two):
        data[0].pop("seconds")
    assert one == two and one[0]["host"] == "node-x" and not one[0]["reachable"]
    assert results[2].stdout.splitlines()[1].startswith("node-x,2,down: ")


def test_hosts_probes_this_machine_here_as_its_runs_start_here(tmp_path):
    """A hostfile's `localhost` runs its single-node experiments without SSH, so `autotune hosts` probes it here:
    it was reported down (exit 1) on a machine whose sshd does not answer, while `run` on it worked. SSH to it is
    still tried (pdsh needs it for multi-node runs), and its failure said."""
    with refusing_ssh(tmp_path, "localhost") as (hostfile, config):
        result = cli("hosts", "-H", hostfile, "--ssh-config", config, "--json")
        table = cli("hosts", "-H", hostfile, "--ssh-config", config, "-f", "csv")
    assert result.returncode == 0, result.stderr
    (here,) = json.loads(result.stdout)
    assert here["reachable"] and here["python"] and here["cpus"] and here["loadavg"]  # probed here
    assert "refused" in here["ssh_error"]
    assert table.stdout.splitlines()[1].startswith("localhost,2,up (here; over SSH: connection refused")


def test_cancel_format_json(sweep):
    unfinished = {r.name for r in autotuner.load(sweep) if r.state in ("queued", "running")}
    text = cli("cancel", sweep, "zm_z2_mbs32_gas1")
    assert text.returncode == 0 and text.stdout == "cancelled 1 experiment(s) that had not finished\n"
    result = cli("cancel", sweep, "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["requested"] == "all" and data["via_runner"] is False and data["runner_pid"] is None
    # the rest: queued, and running when their runner died (it is gone: they are interrupted, then cancelled)
    assert sorted(data["cancelled"]) == sorted(unfinished - {"zm_z2_mbs32_gas1"}) and len(unfinished) == 6
    assert data["message"] == "cancelled 5 experiment(s) that had not finished"


GOOD = """{
  name: g
  script: train.py
  ds_config: {train_micro_batch_size_per_gpu: 1}
  space: {"zero_optimization.stage": [0, 1, 2]}
}
"""


def test_run_and_resume_format_json_print_one_object(tmp_path):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "sweep.hjson").write_text(GOOD)
    out = tmp_path / "r"
    result = cli("run", "sweep.hjson", "--slots", 2, "--launcher", f"sh {STANDIN}", "-o", out, "--format", "json",
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)  # the whole of stdout: no event lines
    assert data["exit_code"] == 0 and data["counts"] == {"succeeded": 3} and data["total"] == 3
    assert data["directory"] == str(out) and data["best"]["name"].startswith("g_z")
    assert data["best"]["config"] == str(out / "ds_config_optimal.json")
    assert data["best"]["command"] == str(out / "cmd_optimal.txt") and not data["interrupted"]
    assert "sweep g: 3 experiments" in result.stderr  # what stdout would have said first
    again = cli("resume", out, "-f", "json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["counts"] == {"succeeded": 3}
    plain = cli("resume", out)
    assert "3 experiments: 3 succeeded" in plain.stdout and not plain.stdout.lstrip().startswith("{")


# --- tables follow the terminal ------------------------------------------------------------------------------
class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("env, terminal, width, color", [
    ({}, False, None, False),
    ({"FORCE_COLOR": "1"}, False, None, True),
    ({"COLUMNS": "97"}, True, 97, True),
    ({"COLUMNS": "97", "NO_COLOR": "1"}, True, 97, False),
    ({"COLUMNS": "97", "NO_COLOR": "1", "FORCE_COLOR": "1"}, True, 97, False),  # NO_COLOR wins
    ({"COLUMNS": "97", "NO_COLOR": ""}, True, 97, True),  # set but empty: not set (no-color.org)
])
def test_output_of_a_stream(env, terminal, width, color, monkeypatch):
    for key in ("COLUMNS", "NO_COLOR", "FORCE_COLOR"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    stream = Tty() if terminal else io.StringIO()
    assert Output.of(stream) == Output(width, color)


@pytest.mark.parametrize("width", [70, 100, 140])
def test_a_table_fits_the_terminal_and_keeps_every_column(sweep, width):
    text = render_report(sweep, "table", Output(width, False))
    table = text.split("\nbest config")[0]
    assert max(len(line) for line in table.splitlines() if not line.startswith("columns:")) <= width
    headers = [c.strip() for line in table.splitlines() if line.startswith("┃") for c in line.strip("┃").split("┃")]
    for header in ["name", "state", "mbs", "gas", "z", *COLUMNS, "time", "slots", "why"]:
        assert header in headers, (width, header)
    best_cells = [c.strip() for line in table.splitlines() if line.startswith("│ best")
                  for c in line.strip("│").split("│")]
    assert "zm_z0_mbs32_gas1" in best_cells and "819,200" in best_cells and "4.96T" in best_cells  # whole


def test_colour_on_a_terminal_only(sweep):
    coloured = render_report(sweep, "table", Output(200, True))
    assert "\x1b[32msucceeded" in coloured and "\x1b[31mfailed" in coloured and "\x1b[1m" in coloured
    assert ANSI.sub("", coloured).splitlines()[1:] == render_report(sweep, "table", Output(200, False)).splitlines()[1:]


def test_a_long_table_laid_out_by_hand_fits_the_terminal_too():
    columns = [Column("#", right=True), Column("name", whole=True), Column("value", right=True), Column("why")]
    rows = [(str(i), f"experiment_{i:05d}", f"{i * 1.5:.1f}", "a reason that goes on " * 4)
            for i in range(RICH_ROWS + 5)]
    wide = render_table(columns, rows, output=PLAIN).splitlines()
    assert len(wide) == 2 + len(rows) and len(wide[2]) > 100  # a file: one line a row
    narrow = render_table(columns, rows, output=Output(60, False)).splitlines()
    assert max(map(len, narrow)) <= 60
    first = narrow.index(next(line for line in narrow if "experiment_00000" in line))
    assert narrow[first + 1].startswith(" " * 22) and "reason" in narrow[first + 1]  # continued under its column


def test_a_long_table_laid_out_by_hand_keeps_a_cell_with_a_line_break_in_its_row():
    """A swept string value holding a line break ended its row there: the rest of it began a line under the first
    columns."""
    columns = [Column("name", whole=True), Column("v"), Column("value", right=True)]
    rows = [(f"experiment_{i:05d}", "line1\nline2" if i == 3 else "x\r\ny" if i == 4 else "plain", str(i))
            for i in range(RICH_ROWS + 5)]
    lines = render_table(columns, rows, output=PLAIN).splitlines()
    assert len(lines) == 2 + len(rows)
    assert lines[2 + 3].split() == ["experiment_00003", "line1", "line2", "3"]
    assert lines[2 + 4].split() == ["experiment_00004", "x", "y", "4"]


def in_a_terminal(args: list[str], columns: int, env: dict | None = None) -> str:
    """Run `autotune ARGS` with its stdout on a pseudo-terminal `columns` wide; what it printed."""
    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    environ = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES")}
    proc = subprocess.Popen([sys.executable, "-m", "autotuner.cli", *args], stdout=follower,
                            stderr=subprocess.PIPE, env={**environ, **(env or {})})
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal's other side closed: all was read
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else ""
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_report_in_a_real_terminal_is_fitted_and_coloured(sweep):
    shown = in_a_terminal(["report", str(sweep)], 90)
    assert ANSI.search(shown)
    table = ANSI.sub("", shown).split("\nbest config")[0]
    assert max(len(line) for line in table.splitlines() if not line.startswith("columns:")) <= 90
    plain = in_a_terminal(["report", str(sweep)], 90, {"NO_COLOR": "1"})
    assert not ANSI.search(plain) and ANSI.sub("", shown) == plain
    piped = cli("report", sweep)
    assert not ANSI.search(piped.stdout) and max(map(len, piped.stdout.splitlines())) > 90  # a pipe: not fitted


# --- plots: failures apart, in a colour of their own; units on the y axis ------------------------------------
@pytest.fixture
def failing(tmp_path):
    """ZeRO 0-2 x micro-batch 4-32 x accumulation 1-2: at micro-batch 32, ZeRO 2 OOMs twice (both accumulation
    steps) and ZeRO 1 once and times out once."""
    directory = record(tmp_path / "p", grid_sweep(mbs=(4, 8, 16, 32), gas=(1, 2)), two_nodes(), finished=24,
                       fail=("zm_z2_mbs32_gas1", "zm_z2_mbs32_gas2", "zm_z1_mbs32_gas1", "zm_z1_mbs32_gas2"))
    from autotuner.ledger.store import Ledger

    with Ledger.open(directory) as ledger:  # one of the failures becomes a timeout
        ledger._db.execute("UPDATE attempts SET state = 'timed_out', reason = 'timeout' WHERE name = ?",
                           ("zm_z1_mbs32_gas2",))
        ledger._db.commit()
    return directory


def red_pixels(image, box) -> int:
    """Pixels of the failures' red inside a display-space box of the figure (its origin bottom left)."""
    import numpy as np

    from autotuner.views.plots import FAILURE_COLOR

    height = image.shape[0]
    target = np.array([int(FAILURE_COLOR[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    rows = slice(int(height - box.y1), int(height - box.y0))
    cols = slice(int(box.x0), int(box.x1))
    return int((abs(image[rows, cols, :3] - target).max(axis=2) < 0.08).sum())


def test_failures_stand_apart_from_the_lines(failing):
    import matplotlib.image
    from matplotlib.colors import to_hex

    from autotuner.views.plots import FAILURE_COLOR, LINE_COLORS, _png, metric_figure

    figure = metric_figure(autotuner.snapshot(failing))
    main, strip = figure.axes[:2]
    lines = [line for line in main.lines if line.get_label().startswith("ZeRO")]
    assert [to_hex(line.get_color()) for line in lines] == list(LINE_COLORS[:3])
    assert FAILURE_COLOR not in LINE_COLORS
    drawn = [line for line in strip.lines if len(line.get_xdata())]
    assert {to_hex(line.get_color()) for line in drawn} == {FAILURE_COLOR}
    assert not any(to_hex(line.get_color()) == FAILURE_COLOR for line in main.lines)  # none on the metric's axes
    # a row per line that failed; two OOMs of ZeRO 2 at 32 are one marker marked x2; ZeRO 1's OOM and timeout at
    # 32 are two markers side by side
    assert [t.get_text() for t in strip.get_yticklabels()] == ["ZeRO 1", "ZeRO 2"]
    assert [t.get_text() for t in strip.texts] == ["\u00d72"]
    figure.canvas.draw()
    spots = {(line.get_marker(), tuple(line.get_transform().transform(line.get_xydata())[0].round(1)))
             for line in drawn}
    assert len(spots) == 3 and {marker for marker, _ in spots} == {"X", "v"}
    ones = [xy for marker, xy in spots if xy[1] == max(y for _, (_, y) in spots)]
    assert len({x for x, _ in ones}) == len(ones)  # different places, not drawn over each other
    assert [t.get_text() for t in strip.get_legend().get_texts()] == ["oom (3)", "timeout (1)"]
    # in the picture: the red is in the strip, none of it on the metric's axes
    image = matplotlib.image.imread(io.BytesIO(_png(figure)), format="png")
    assert image.shape[1] == pytest.approx(figure.bbox.width)  # saved at the figure's dpi: pixels are display units
    assert red_pixels(image, main.get_window_extent()) == 0 and red_pixels(image, strip.get_window_extent()) > 50


@pytest.mark.parametrize("metric, label", [("throughput", "throughput (samples/s)"), ("latency", "latency (\u00b5s)"),
                                           ("FLOPS_per_gpu", "FLOPS_per_gpu (FLOP/s per GPU)"),
                                           ("tokens:max", "tokens (higher is better)")])
def test_the_y_axis_names_the_metric_and_its_unit(tmp_path, metric, label):
    from autotuner.views.plots import metric_figure

    directory = record(tmp_path / "u", grid_sweep(metric=metric), two_nodes(), finished=12,
                       extra=lambda name, got: {"FLOPS_per_gpu": got * 1e9, "tokens": got * 512})
    axes = metric_figure(autotuner.snapshot(directory)).axes[0]
    assert axes.get_ylabel().startswith(label), axes.get_ylabel()


# --- the HTML page: every column, sortable, logs linked, makespan and utilisation ----------------------------
def logs_for(directory: Path, *names: str) -> None:
    for name in names:
        (directory / name).mkdir(exist_ok=True)
        (directory / name / "stdout.log").write_text(f"stdout of {name}\n")
        (directory / name / "stderr.log").write_text("")
        (directory / name / "cmd.txt").write_text("deepspeed ...\n")


def test_html_has_every_column_log_links_and_utilisation(sweep, tmp_path):
    from autotuner.views.analysis import all_attempts, timeline_end, utilisation

    logs_for(sweep, "zm_z0_mbs32_gas1", "zm_z1_mbs8_gas1")
    page, _ = autotuner.write_html(sweep, plots={})
    html = page.read_text()
    head = html.split('<table id="experiments">', 1)[1].split("</thead>", 1)[0]
    labels = re.findall(r"<th[^>]*>([^<]*)</th>", head)
    assert labels == ["#", "name", "state", "gas", "mbs", "z", *COLUMNS, "time", "GPU-h", "slots", "why", "files"]
    assert head.count('onclick="sortBy(this)"') == len(labels) - 1
    assert 'title="latency (\u00b5s); click to sort"' in head
    best = html.split('data-name="zm_z0_mbs32_gas1">', 1)[1].split("</tr>", 1)[0]
    assert ('<a href="zm_z0_mbs32_gas1/stdout.log">stdout</a> <a href="zm_z0_mbs32_gas1/stderr.log">stderr</a> '
            '<a href="zm_z0_mbs32_gas1/cmd.txt">cmd</a>') in best
    assert '<td class="num" data-v="1600.0" title="1,600">1,600</td>' in best
    assert '<td class="num" data-v="819200.0" title="819,200">819,200</td>' in best
    others = html.split('data-name="zm_z0_mbs32_gas2">', 1)[1].split("</tr>", 1)[0]
    assert '<td class="logs"></td>' in others  # no files yet: no links to nothing
    attempts = all_attempts(sweep)
    use = utilisation(attempts, autotuner.snapshot(sweep).slots, timeline_end(sweep, attempts))
    assert f"utilisation <b>{use['utilisation']:.0%}</b>" in html and "makespan <b>" in html
    assert "per host: node-a " in html and "http://" not in html and "https://" not in html

    elsewhere = tmp_path / "pages" / "sweep.html"
    elsewhere.parent.mkdir()
    autotuner.write_html(sweep, elsewhere, plots={})
    link = re.search(r'<a href="([^"]+)">stdout</a>', elsewhere.read_text()).group(1)
    assert link == "../s/zm_z0_mbs32_gas1/stdout.log"
    assert (elsewhere.parent / link).resolve().read_text() == "stdout of zm_z0_mbs32_gas1\n"


SORT_PROBE = """<script>window.addEventListener("load", function () {
  var th = document.querySelectorAll("#experiments th")[COLUMN], seen = [];
  function order() { return Array.prototype.map.call(document.querySelectorAll("#experiments tbody tr"),
                                                     function (r) { return r.getAttribute("data-name"); }).join(","); }
  sortBy(th); seen.push(order() + ";" + th.getAttribute("aria-sort"));
  sortBy(th); seen.push(order() + ";" + th.getAttribute("aria-sort"));
  document.body.setAttribute("data-orders", seen.join("|"));
});</script>"""


def test_html_table_sorts_in_a_browser(sweep, tmp_path):
    from test_views import headless

    page, _ = autotuner.write_html(sweep, plots={})
    results = autotuner.load(sweep)
    column = 6  # #, name, state, gas, mbs, z, throughput
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</main></body>", SORT_PROBE.replace("COLUMN", str(column)) +
                                              "</main></body>"))
    dom = headless(tmp_path, "--dump-dom", probe.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    up, down = re.search(r'data-orders="([^"]*)"', dom.stdout).group(1).split("|")
    measured = sorted((r for r in results if r.metric is not None), key=lambda r: (r.metric, results.records.index(r)))
    unmeasured = [r.name for r in results if r.metric is None]  # no value: last, either way, in their order
    assert up == ",".join([r.name for r in measured] + unmeasured) + ";ascending"
    by_value_down = sorted((r for r in results if r.metric is not None),
                           key=lambda r: (-r.metric, results.records.index(r)))
    assert down == ",".join([r.name for r in by_value_down] + unmeasured) + ";descending"


@pytest.mark.parametrize("metric, expected", [
    ("latency", ["zm_z0_mbs8", "zm_z0_mbs16", "zm_z0_mbs4", "zm_z0_mbs32"]),  # lowest first
    ("throughput", ["zm_z0_mbs8", "zm_z0_mbs16", "zm_z0_mbs4", "zm_z0_mbs32"]),  # highest first
])
def test_ties_rank_in_the_sweeps_order_whichever_way_the_metric_is_better(tmp_path, metric, expected):
    """The ranking sorts by value alone, reversed for a metric where higher is better: equal values keep the
    sweep's order either way (as the report ranked them when it sorted on the negated value)."""
    throughputs = {"zm_z0_mbs4": 100.0, "zm_z0_mbs8": 200.0, "zm_z0_mbs16": 200.0, "zm_z0_mbs32": 100.0}
    directory = record(tmp_path / "s", grid_sweep(stages=(0,), metric=metric), two_nodes(), finished=4,
                       value=throughputs.__getitem__)
    assert [r.name for r in autotuner.load(directory)] == expected
    assert [r.rank for r in autotuner.load(directory)] == [1, 2, 3, 4]
