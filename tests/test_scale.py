"""A large recorded sweep (more rows than the report draws with rich): report, status and resume read it right.

The timings of these commands on 10,000 experiments are benchmarks/scale.py's business; here only what they
show and what resume runs.
"""
from __future__ import annotations

import csv
import io
import json
import time

import autotuner
from autotuner.backends.cluster import Cluster
from autotuner.ledger.store import Ledger
from autotuner.spec import Experiment, Sweep
from autotuner.spec.hostfile import localhost_hosts
from autotuner.spec.metrics import metric_named
from autotuner.states import Reason, State
from autotuner.views.report import render_report
from autotuner.views.tables import PLAIN, RICH_ROWS, Output

from cli_rig import SLEEP_THEN_SUCCEED, autotune, env, launches, states, sweep_id, tagged_pids, write_launcher

N = RICH_ROWS + 200


def build(tmp_path):
    """N experiments: most succeeded (throughput (i * 37) % 1009 + 1), a few failed, interrupted or queued."""
    launcher = write_launcher(tmp_path, SLEEP_THEN_SUCCEED)
    (tmp_path / "train.py").touch()
    experiments = tuple(Experiment(name=f"big_i{i:04d}", ds_config={"train_micro_batch_size_per_gpu": 1 + i % 8,
                                                                     "seed": i},
                                   num_gpus=1, num_nodes=1, script=str(tmp_path / "train.py"))
                        for i in range(N))
    sweep = Sweep(name="big", experiments=experiments, metric=metric_named("throughput"), source="test")
    hosts = localhost_hosts(4)
    directory = tmp_path / "out"
    autotuner.prepare(sweep, Cluster.of(hosts, {h: [0, 1, 2, 3] for h in hosts}, "cpu"), directory,
                   launcher=launcher.split())
    kinds = {}
    ledger = Ledger.open(directory)
    ledger._db.execute("PRAGMA synchronous=OFF")  # setting up, not what is tested: no fsync per transition
    for i, e in enumerate(experiments):
        kind = {5: State.QUEUED, 6: State.INTERRUPTED, 7: State.FAILED}.get(i % 300, State.SUCCEEDED)
        kinds[e.name] = kind
        if kind == State.QUEUED:
            continue
        ledger.start(e.name, 1, slots={"localhost": [i % 4]}, tag=f"old.{e.name}.1", dir=str(directory / e.name),
                     at=time.time())
        value = float((i * 37) % 1009 + 1)
        reason = {State.SUCCEEDED: None, State.FAILED: Reason.OOM}.get(kind, Reason.INTERRUPTED)
        ledger.finish(e.name, 1, kind, time.time(), reason=reason,
                      detail="CUDA out of memory" if kind == State.FAILED else None,
                      metric=value if kind == State.SUCCEEDED else None,
                      metrics={"throughput": value} if kind == State.SUCCEEDED else None)
    ledger.close()
    return directory, kinds


def test_report_status_and_resume_of_a_large_sweep(tmp_path):
    directory, kinds = build(tmp_path)
    values = {f"big_i{i:04d}": float((i * 37) % 1009 + 1) for i in range(N)}
    succeeded = sorted((n for n, k in kinds.items() if k == State.SUCCEEDED), key=lambda n: -values[n])

    shown = autotune("report", directory)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == "sweep big: throughput (higher is better)"
    # the swept parameters (as the ledger holds the keys: sorted), then the metric
    assert lines[1].split() == ["#", "name", "state", "seed", "mbs", "throughput", "time", "GPU-h", "slots", "why"]
    body = [line.split() for line in lines[3:3 + N]]
    ranked = [next(t for t in row if t.startswith("big_i")) for row in body]
    assert ranked == succeeded + [n for n in kinds if kinds[n] != State.SUCCEEDED]
    assert body[0][0] == "best" and body[1][0] == "2"
    failed = next(line for line in lines if "big_i0007" in line)
    assert "failed" in failed and "[oom] CUDA out of memory" in failed
    assert failed.split()[:5] == ["big_i0007", "failed", "7", "8", "-"]  # seed 7, micro-batch 1 + 7 % 8
    assert "columns: mbs = train_micro_batch_size_per_gpu" in shown.stdout
    assert "best config, ds_config_optimal.json" in shown.stdout

    status = json.loads(autotune("status", directory, "--json").stdout)
    expected = {}
    for kind in kinds.values():
        expected[kind] = expected.get(kind, 0) + 1
    assert status["counts"] == expected and status["total"] == N
    assert status["best"]["name"] == succeeded[0]

    log = tmp_path / "launches.log"
    done = autotune("resume", directory, "-q", environ=env(LAUNCH_LOG=log, STANDIN_SECONDS=0.01))
    assert done.returncode == 1, done.stderr  # the failed ones stay failed
    again = {n for n, k in kinds.items() if k in (State.QUEUED, State.INTERRUPTED)}
    assert sorted(n for n, _ in launches(log)) == sorted(again)
    now = states(directory)
    assert {n for n, s in now.items() if s == State.SUCCEEDED} == set(succeeded) | again
    assert tagged_pids(sweep_id(directory)) == []


def test_a_long_queue_is_not_scanned_once_every_slot_is_taken():
    """With 10,000 queued, each dispatch tried to place every one of them (17 ms an event) though none fit."""
    from autotuner.core import BackfillQueue, Pack, Queued, SlotPool

    class Counting(Pack):
        calls = 0

        def place(self, pool, demand):
            Counting.calls += 1
            return super().place(pool, demand)

    pool = SlotPool({"localhost": range(8)})
    queue = BackfillQueue(8)
    for i in range(1000):
        queue.push(Queued(Experiment(name=f"e{i}", ds_config={}, num_gpus=1, num_nodes=1, script="/bin/true"), 1))
    started = queue.select(pool, Counting())
    assert len(started) == 8 and Counting.calls == 8
    pool.give_back(started[0][1])
    assert len(queue.select(pool, Counting())) == 1 and Counting.calls == 9
    assert queue.select(pool, Counting()) == [] and Counting.calls == 9


def test_every_format_lists_a_large_sweep_in_ranked_order(tmp_path):
    """Rows are laid out in the sweep's order and ranked last (records.from_snapshot, the table's and each
    format's `order`): every format, a table split in blocks to fit a terminal, colour or not, shows the ranking."""
    directory, _ = build(tmp_path)
    results = autotuner.load(directory)
    ranked = [r.name for r in results]
    assert [r.name for r in results.in_sweep_order] == [f"big_i{i:04d}" for i in range(N)]
    assert [results.in_sweep_order[i] for i in results.ranking] == list(results.records)
    assert ranked[0] == results.best.name and [r.rank for r in results][:3] == [1, 2, 3]
    assert ranked[-3:] == ["big_i0905", "big_i0906", "big_i0907"]  # the rest keep the sweep's order

    def names(text: str) -> list[str]:
        return [m for line in text.splitlines() for m in line.replace("|", " ").split() if m.startswith("big_i")]

    assert [row["name"] for row in json.loads(render_report(directory, "json"))["experiments"]] == ranked
    assert [row["name"] for row in csv.DictReader(io.StringIO(render_report(directory, "csv")))] == ranked
    assert names(render_report(directory, "md")) == ranked
    for output in (PLAIN, Output(width=60), Output(width=60, color=True)):
        shown = names(render_report(directory, "table", output))
        blocks = shown.count(ranked[0])  # split to fit a terminal: each block lists them again, beside `#`
        assert shown == ranked * blocks and blocks == (1 if output.width is None else 3), (output, blocks)
