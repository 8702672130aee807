"""Watching a sweep: the live view (rendered into a recording console), plain event lines, the JSON event stream."""
from __future__ import annotations

import io
import json
import os
import pty
import random
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from autotuner.core import Queued, Reservation, Run
from autotuner.core.outcome import Outcome
from autotuner.states import State
from autotuner.views.events import EventLog, PlainPrinter, event_record, metric_values
from autotuner.views.live import _KEYS as KEYS
from autotuner.views.live import MAX_FAILURE_ROWS, LiveView, watching
from autotuner.views.panel import render, seconds
from autotuner.views.snapshot import snapshot

from cli_rig import env as tree_env
from recorded import T0, grid_sweep, record, two_nodes

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "benchmarks" / "standin.sh"


def text_of(view_or_state, now: float, width: int = 100) -> str:
    state = view_or_state.state() if isinstance(view_or_state, LiveView) else view_or_state
    console = Console(record=True, width=width, file=io.StringIO(), color_system=None)
    console.print(render(state, now))
    return console.export_text()


def node_row(text: str, host: str) -> str:
    """The node's row of the view, without the panel's border."""
    return next(line.strip("│ ") for line in text.splitlines() if line.strip("│ ").startswith(host + " "))


def run_of(snap, name: str, attempt: int, slots: dict) -> Run:
    return Run(snap.experiments[name], attempt, Reservation.of(slots), f"t.{name}", snap.directory / name)


@pytest.fixture
def midway(tmp_path):
    """12 experiments on node-a (2 slots) + node-b (4 slots): 5 ended (1 OOM), 3 running, 4 queued."""
    return record(tmp_path / "s", grid_sweep(), two_nodes(), finished=5, running=3, fail=("zm_z0_mbs16",))


# --- the live view from a snapshot ---------------------------------------------------------------------------
def test_view_of_a_recorded_sweep_shows_counts_slots_running_best_and_eta(midway):
    snap = snapshot(midway)
    now = T0 + 40
    view = LiveView(snap, clock=lambda: now)
    text = text_of(view, now)
    assert "4 done" in text and "1 failed" in text and "3 running" in text and "4 queued" in text
    assert "of 12" in text
    assert "best so far: zm_z0_mbs32" in text and "1,600" in text
    # slots: which are busy, by whom (the running table's key letters), which are free
    state = view.state()
    running = {r.name: r for r in state.running}
    assert set(running) == {"zm_z1_mbs8", "zm_z1_mbs16", "zm_z1_mbs32"}
    busy = {(h, i) for r in state.running for h, ids in r.slots.items() for i in ids}
    assert len(busy) == 3
    for host, total in (("node-a", 2), ("node-b", 4)):
        mine = sum(1 for h, _ in busy if h == host)
        assert node_row(text, host).endswith(f"{mine}/{total}"), node_row(text, host)
    row_b = node_row(text, "node-b").split()
    cells = row_b[1:5]
    for i, cell in enumerate(cells):
        assert (cell != ".") == (("node-b", i) in busy)
    # each running experiment: its name, where, elapsed and timeout (300 s from the spec)
    for r in state.running:
        line = next(line for line in text.splitlines() if r.name + " " in line)
        assert seconds(now - r.started_at) in line and "5m00s" in line
        where = "@".join(f"{h}:{','.join(map(str, ids))}" for h, ids in r.slots.items())
        assert where in line
    # ETA: the 4 queued and the 3 running re-planned on the 6 slots (see test_plan.py for the figures)
    mean = state.mean_duration()
    assert mean == pytest.approx(sum(a.duration for a in snap.attempts if a.duration) / 5)
    assert state.eta(now) >= 4 * mean / 6 and state.eta(now) >= mean
    assert f"ETA ~{seconds(state.eta(now))}" in text


def test_render_is_a_pure_function_of_the_state(midway):
    state = LiveView(snapshot(midway), clock=lambda: T0).state()
    assert text_of(state, T0 + 40) == text_of(state, T0 + 40)
    assert text_of(state, T0 + 40) != text_of(state, T0 + 100)  # elapsed moves with `now` only


def test_a_fresh_sweep_has_no_eta_and_no_best(tmp_path):
    directory = record(tmp_path / "s", grid_sweep(), two_nodes(), finished=0)
    text = text_of(LiveView(snapshot(directory), clock=lambda: T0), T0)
    assert "0 done" in text and "12 queued" in text and "best so far: none yet" in text
    assert "ETA ? (no run has ended yet)" in text
    assert node_row(text, "node-a").split()[1:3] == [".", "."]


def test_a_search_shows_what_it_proposed_so_far_and_no_eta_of_it(midway):
    from autotuner.ledger.store import Ledger

    ledger = Ledger.open(midway)
    ledger.set_meta("search", {"tuner": "random", "trials": 50})
    ledger.close()
    text = text_of(LiveView(snapshot(midway), clock=lambda: T0 + 40), T0 + 40)
    assert "of 12 proposed (random search, budget 50)" in text
    assert "ETA ? (the search proposes as runs end)" in text and "ETA ~" not in text


def test_observer_calls_move_the_view(midway):
    snap = snapshot(midway)
    clock = [T0 + 40]
    view = LiveView(snap, clock=lambda: clock[0])
    running = {r.name: r for r in view.state().running}
    # one running experiment ends with a new best
    done = run_of(snap, "zm_z1_mbs8", 1, running["zm_z1_mbs8"].slots)
    view("finished", done, Outcome(State.SUCCEEDED, exit_code=0, metrics={"throughput": 5000.0}))
    # a queued one starts on the freed slot
    started = run_of(snap, "zm_z2_mbs4", 1, running["zm_z1_mbs8"].slots)
    view("started", started, None)
    state = view.state()
    assert state.counts() == {State.SUCCEEDED: 5, State.FAILED: 1, "running": 3, "queued": 3}
    assert state.best == ("zm_z1_mbs8", 5000.0)
    assert len(state.durations) == 6
    # a transient failure the scheduler queues again (it says so): shown as queued, not failed
    flaky = run_of(snap, "zm_z1_mbs16", 1, running["zm_z1_mbs16"].slots)
    failure = Outcome(State.FAILED, "launch", "Address already in use", 1)
    view("finished", flaky, failure)
    assert view.state().states["zm_z1_mbs16"] == State.FAILED  # no guessing: failed until the scheduler says
    view("requeued", Queued(flaky.experiment, 2), failure)
    assert view.state().states["zm_z1_mbs16"] == "queued"
    view("started", run_of(snap, "zm_z1_mbs16", 2, running["zm_z1_mbs16"].slots), None)
    again = run_of(snap, "zm_z1_mbs16", 2, running["zm_z1_mbs16"].slots)
    view("finished", again, Outcome(State.FAILED, "launch", "Address already in use", 1))
    assert view.state().states["zm_z1_mbs16"] == State.FAILED  # its one retry is used up
    # a run on a lost host is interrupted and queued again first
    lost = run_of(snap, "zm_z2_mbs4", 1, running["zm_z1_mbs8"].slots)
    gone = Outcome(State.INTERRUPTED, "lost", "host node-b lost: no answer")
    view("finished", lost, gone)
    view("requeued", Queued(lost.experiment, 2), gone)
    assert view.state().states["zm_z2_mbs4"] == "queued"
    view("started", lost, None)
    # a timeout is counted apart from the failures, as the final summary counts it
    slow = run_of(snap, "zm_z1_mbs32", 1, running["zm_z1_mbs32"].slots)
    view("finished", slow, Outcome(State.TIMED_OUT, "timeout", "ran past its timeout of 300 s"))
    # a node goes down
    view("host_down", "node-a", None)
    text = text_of(view, T0 + 41)
    assert "5 done" in text and "2 failed" in text and "1 timed out" in text
    assert "1 running" in text and "3 queued" in text
    assert "best so far: zm_z1_mbs8" in text
    assert "down" in node_row(text, "node-a") and node_row(text, "node-a").split()[1:3] == ["x", "x"]
    view("host_up", "node-a", None)
    assert "down" not in node_row(text_of(view, T0 + 41), "node-a")


def test_unstarted_attempts_end_with_the_outcome_the_scheduler_gives(midway):
    snap = snapshot(midway)
    view = LiveView(snap, clock=lambda: T0 + 50)
    view("finished", Queued(snap.experiments["zm_z2_mbs4"], 1),
         Outcome(State.FAILED, "placement", "not enough hosts are up"))
    view("finished", Queued(snap.experiments["zm_z2_mbs8"], 1),
         Outcome(State.CANCELLED, "cancelled", "cancelled before it started"))
    states = view.state().states
    assert states["zm_z2_mbs4"] == State.FAILED and states["zm_z2_mbs8"] == State.CANCELLED
    assert "1 cancelled" in text_of(view, T0 + 50)


def test_a_resume_counts_what_it_will_requeue_as_queued(tmp_path):
    directory = record(tmp_path / "s", grid_sweep(), two_nodes(), finished=4, running=2, fail=("zm_z0_mbs8",))
    snap = snapshot(directory)  # as a dead runner left it: 2 running
    state = LiveView(snap, pending=("running", "interrupted"), clock=lambda: T0).state()
    assert state.counts() == {State.SUCCEEDED: 3, State.FAILED: 1, "queued": 8} and not state.running
    retry = LiveView(snap, pending=("running", "interrupted", State.FAILED, State.TIMED_OUT), clock=lambda: T0).state()
    assert retry.counts() == {State.SUCCEEDED: 3, "queued": 9}


# --- keys, failures, the end -----------------------------------------------------------------------------------
def running_rows(text: str) -> dict[str, str]:
    """experiment -> the key its row in the running list shows."""
    rows = {}
    for line in text.splitlines():
        words = line.strip("│ ").split()
        if len(words) >= 3 and len(words[0]) == 1 and words[2].isdigit() and words[1] in EXPERIMENTS:
            rows[words[1]] = words[0]
    return rows


EXPERIMENTS = {e.name for e in grid_sweep().experiments}


def test_a_run_keeps_its_key_while_it_runs_and_a_freed_key_is_given_again(tmp_path):
    """Runs end out of the order they started: each keeps the key it was given (in its slots and its row)
    until it ends, and the next run takes the first key free then."""
    snap = snapshot(record(tmp_path / "s", grid_sweep(), two_nodes(), finished=0))  # 12 queued, 6 slots
    clock = [T0]
    view = LiveView(snap, clock=lambda: clock[0])
    waiting = list(snap.experiments)
    running: dict[str, Run] = {}
    given: dict[str, str] = {}  # experiment -> the key it got when it started
    rng = random.Random(7)
    free = [("node-a", 0), ("node-a", 1), *(("node-b", i) for i in range(4))]
    while waiting or running:
        while waiting and free:  # fill the free slots, as the scheduler does
            host, slot = free.pop(0)
            run = run_of(snap, waiting.pop(0), 1, {host: [slot]})
            view("started", run, None)
            running[run.experiment.name] = run
            text = text_of(view, clock[0])
            given[run.experiment.name] = running_rows(text)[run.experiment.name]
            assert given[run.experiment.name] == next(k for k in KEYS if k not in
                                                     {given[n] for n in running if n != run.experiment.name})
        text = text_of(view, clock[0])
        assert running_rows(text) == {name: given[name] for name in running}  # nobody changed key
        for name, run in running.items():  # and its slot shows the same key
            ((host, ids),) = run.reservation.slots
            assert node_row(text, host).split()[1 + ids[0]] == given[name]
        clock[0] += 5
        name = rng.choice(sorted(running))
        ended = running.pop(name)
        view("finished", ended, Outcome(State.SUCCEEDED, exit_code=0, metrics={"throughput": 1.0}))
        ((host, ids),) = ended.reservation.slots
        free.append((host, ids[0]))
    assert len(set(given.values())) < len(given)  # freed keys were given again


def test_failures_are_listed_as_they_come_with_name_and_reason_the_latest_few(midway):
    snap = snapshot(midway)  # one OOM in the ledger already
    view = LiveView(snap, clock=lambda: T0 + 40)
    assert "zm_z0_mbs16" in failure_row(text_of(view, T0 + 40, 160), "zm_z0_mbs16")
    assert "[oom] torch.OutOfMemoryError: CUDA out of memory" in failure_row(text_of(view, T0 + 40, 160), "zm_z0_mbs16")
    running = {r.name: r for r in view.state().running}
    bad = run_of(snap, "zm_z1_mbs8", 1, running["zm_z1_mbs8"].slots)
    coloured = "\x1b[31mDeepSpeedConfigError\x1b[0m: [bold]train_batch_size[/bold] is not equal\n\x1b[2Jto 8"
    view("finished", bad, Outcome(State.FAILED, "config", coloured, 1))
    flaky = run_of(snap, "zm_z1_mbs16", 1, running["zm_z1_mbs16"].slots)
    view("finished", flaky, Outcome(State.FAILED, "launch", "Address already in use", 1))
    view("requeued", Queued(flaky.experiment, 2), Outcome(State.FAILED, "launch", "Address already in use", 1))
    slow = run_of(snap, "zm_z1_mbs32", 1, running["zm_z1_mbs32"].slots)
    view("finished", slow, Outcome(State.TIMED_OUT, "timeout", "ran past its timeout of 300 s"))
    text = text_of(view, T0 + 41, 160)
    assert "[config] DeepSpeedConfigError: [bold]train_batch_size[/bold] is not equal to 8" in \
        failure_row(text, "zm_z1_mbs8")  # the log's colours and controls gone, its text as it was, on one line
    assert "\x1b" not in text
    assert "[launch] (queued again) Address already in use" in failure_row(text, "zm_z1_mbs16")
    assert "[timeout] ran past its timeout of 300 s" in failure_row(text, "zm_z1_mbs32")
    assert "2 failed" in text and "1 timed out" in text and "\n│ failed " in text
    # bounded: the latest MAX_FAILURE_ROWS, oldest first, and how many there were
    for n, name in enumerate(("zm_z2_mbs4", "zm_z2_mbs8", "zm_z2_mbs16")):
        view("finished", Queued(snap.experiments[name], 1),
             Outcome(State.FAILED, "placement", f"not enough hosts are up ({n})"))
    text = text_of(view, T0 + 42, 160)
    listed = [name for name in EXPERIMENTS if failure_row(text, name)]
    assert len(listed) == MAX_FAILURE_ROWS == 5 and "failed (latest 5 of 7)" in text
    assert "zm_z0_mbs16" not in listed and "zm_z1_mbs8" not in listed
    rows = [line for line in text.splitlines() if "[placement]" in line]
    assert [row.split("(")[-1].rstrip(")│ ") for row in rows] == ["0", "1", "2"]


def failure_row(text: str, name: str) -> str:
    """The row of the failures list that names `name` ("" if none)."""
    return next((line for line in text.splitlines() if line.strip("│ ").startswith(name + " ") and "[" in line), "")


def test_the_last_frame_gives_the_total_time_not_an_eta(tmp_path):
    directory = record(tmp_path / "s", grid_sweep(), two_nodes(), finished=10, running=2)
    snap = snapshot(directory)
    clock = [T0 + 100]
    view = LiveView(snap, clock=lambda: clock[0])
    assert "ETA" in text_of(view, clock[0])
    for r in view.state().running:
        clock[0] += 15
        view("finished", run_of(snap, r.name, r.attempt, r.slots),
             Outcome(State.SUCCEEDED, metrics={"throughput": 1.0}))
    text = text_of(view, clock[0])
    assert "finished in 30s" in text and "ETA" not in text and view.state().eta(clock[0]) == 0.0
    view.end()  # the run returned: the clock of the last frame stops there
    clock[0] += 600
    console = Console(record=True, width=100, file=io.StringIO(), color_system=None)
    console.print(view)
    assert "finished in 30s" in console.export_text()


def test_after_an_interrupt_the_view_says_it_stops_and_gives_no_eta(midway):
    snap = snapshot(midway)
    clock = [T0 + 40]
    view = LiveView(snap, clock=lambda: clock[0])
    assert "ETA ~" in text_of(view, clock[0])
    view("stopping", "sid", Outcome(State.INTERRUPTED, None, "interrupted by the user"))
    view("stopping", "sid", Outcome(State.CANCELLED, "cancelled", "the whole sweep was cancelled"))  # the first says
    text = text_of(view, clock[0])
    assert "stopping: interrupted by the user; waiting for 3 runs to end" in text
    assert "ETA" not in text and view.state().eta(clock[0]) is None
    for r in view.state().running:
        clock[0] += 2
        view("finished", run_of(snap, r.name, r.attempt, r.slots),
             Outcome(State.INTERRUPTED, "interrupted", "interrupted by the user"))
    view.end()
    text = text_of(view, clock[0])
    assert "stopped after 6s: interrupted by the user" in text and "3 interrupted" in text and "4 queued" in text
    assert "ETA" not in text


# --- plain event lines -------------------------------------------------------------------------------------
STAMP = r"\d\d:\d\d:\d\d "


def test_plain_event_lines_are_stable(midway, capsys):
    snap = snapshot(midway)
    run = run_of(snap, "zm_z2_mbs4", 2, {"node-a": [1], "node-b": [0, 2]})
    print_event = PlainPrinter()
    print_event("started", run, None)
    print_event("finished", run, Outcome(State.SUCCEEDED, exit_code=0, metrics={"throughput": 1234.5678, "loss": 2.0}))
    print_event("finished", run, Outcome(State.FAILED, "oom", "CUDA out of memory", 1))
    print_event("finished", run, Outcome(State.TIMED_OUT, "timeout", "ran past its timeout of 300 s"))
    print_event("finished", Queued(snap.experiments["zm_z2_mbs8"], 1),
                Outcome(State.CANCELLED, "cancelled", "cancelled before it started"))
    print_event("host_down", "node-b", None)
    print_event("host_up", "node-b", None)
    print_event("finished", run, Outcome(State.FAILED, "config", "\x1b[31mDeepSpeedConfigError\x1b[0m: bad\nbatch", 1))
    print_event("stopping", "sid", Outcome(State.INTERRUPTED, None, "interrupted by the user"))
    lines = capsys.readouterr().out.splitlines()
    expected = [
        "start     zm_z2_mbs4 (attempt 2) on node-a:1 node-b:0,2",
        "succeeded zm_z2_mbs4 throughput=1235, loss=2",
        "failed    zm_z2_mbs4 [oom] CUDA out of memory",
        "timed_out zm_z2_mbs4 [timeout] ran past its timeout of 300 s",
        "cancelled zm_z2_mbs8 [cancelled] cancelled before it started",
        "lost      host node-b",
        "back      host node-b",
        "failed    zm_z2_mbs4 [config] DeepSpeedConfigError: bad batch",  # a log's colours and newlines gone
        "stopping  interrupted: interrupted by the user",
    ]
    assert len(lines) == len(expected)
    for line, tail in zip(lines, expected, strict=False):
        assert re.fullmatch(STAMP + re.escape(tail), line), line


def test_plain_lines_print_the_sweeps_metric_whatever_its_name_then_the_others(midway, capsys):
    run = run_of(snapshot(midway), "zm_z2_mbs4", 1, {"node-a": [1]})
    PlainPrinter("tokens_per_s")("finished", run, Outcome(State.SUCCEEDED, exit_code=0, metrics={
        "loss": 2.25, "tokens_per_s": 18342.7, "rank": 0.0, "val_acc": 0.8125}))
    PlainPrinter("latency")("finished", run, Outcome(State.SUCCEEDED, exit_code=0, metrics={
        "fwd": 10.0, "throughput": 99.5, "latency": 81.25, "FLOPS_per_gpu": 3.2e12}))
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(STAMP + re.escape("succeeded zm_z2_mbs4 tokens_per_s=1.834e+04, loss=2.25, val_acc=0.8125"),
                        lines[0]), lines[0]
    assert re.fullmatch(STAMP + re.escape("succeeded zm_z2_mbs4 latency=81.25, fwd=10, throughput=99.5, "
                                          "FLOPS_per_gpu=3.2e+12"), lines[1]), lines[1]
    many = {f"m{i}": float(i) for i in range(20)} | {"loss": 0.5}
    assert metric_values(many, "loss") == "loss=0.5, m0=0, m1=1, m2=2, m3=3, m4=4, m5=5, m6=6 (+13 more)"


# --- the JSON event stream ---------------------------------------------------------------------------------
def test_event_records_carry_what_scripts_need(midway, tmp_path):
    snap = snapshot(midway)
    run = run_of(snap, "zm_z2_mbs4", 1, {"node-b": [1, 2]})
    path = tmp_path / "events.jsonl"
    ticks = iter([T0 + 1, T0 + 2, T0 + 3, T0 + 4, T0 + 5])
    log = EventLog(path, "throughput", clock=lambda: next(ticks))
    log("started", run, None)
    log("finished", run, Outcome(State.FAILED, "oom", "CUDA out of memory", 1))
    log("finished", Queued(snap.experiments["zm_z2_mbs8"], 1),
        Outcome(State.CANCELLED, "cancelled", "before it started"))
    log("host_down", "node-b", None)
    log("stopping", "sid", Outcome(State.INTERRUPTED, None, "interrupted by the user"))
    log.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records.pop() == {"event": "stopping", "timestamp": T0 + 5, "state": "interrupted", "reason": None,
                             "detail": "interrupted by the user"}
    assert records.pop() == {"event": "host_down", "timestamp": T0 + 4, "host": "node-b"}
    assert [(r["event"], r["name"], r["state"]) for r in records] == [
        ("started", "zm_z2_mbs4", "running"), ("finished", "zm_z2_mbs4", State.FAILED),
        ("finished", "zm_z2_mbs8", State.CANCELLED)]
    assert records[0]["slots"] == {"node-b": [1, 2]} and records[0]["timestamp"] == T0 + 1
    assert records[1]["reason"] == "oom" and records[1]["metric"] is None
    assert records[2]["slots"] == {}
    succeeded = Outcome(State.SUCCEEDED, metrics={"throughput": 7.5, "latency": 2.0})
    ok = event_record("finished", run, succeeded, "throughput", T0)
    assert ok["metric"] == 7.5 and ok["metrics"] == {"throughput": 7.5, "latency": 2.0} and ok["reason"] is None


def tiny_sweep(directory: Path, count: int = 4, timeout: int = 30) -> Path:
    spec = directory / "tiny.hjson"
    values = ", ".join(str(2 ** i) for i in range(count))
    spec.write_text(f"{{\n  name: tiny\n  script: /bin/true\n  metric: throughput\n  timeout: {timeout}\n"
                    "  ds_config: { gradient_accumulation_steps: 1 }\n"
                    f"  space: {{ train_micro_batch_size_per_gpu: [{values}] }}\n}}\n")
    return spec


def autotune(*args, env=None, cwd=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotuner.cli", *map(str, args)], capture_output=True, text=True,
                          env={**tree_env(), **(env or {})}, cwd=cwd, timeout=timeout)


def test_watching_adds_its_observers_for_the_block_only(midway, tmp_path):
    """The observers list is the caller's: what `watching` added is gone when the block ends, whatever the
    caller added meanwhile stays (a second run watched with the same list was told every event twice)."""
    mine = lambda *note: None  # noqa: E731
    observers = [mine]
    later = lambda *note: None  # noqa: E731
    with watching(midway, observers, live=True, plain=True, events=tmp_path / "events.jsonl",
                  console=Console(file=io.StringIO(), width=100)):
        assert len(observers) == 3 and isinstance(observers[1], EventLog) and isinstance(observers[2], LiveView)
        observers.append(later)
    assert observers == [mine, later]
    with watching(midway, observers, plain=True):
        assert isinstance(observers[-1], PlainPrinter)
    assert observers == [mine, later]


def test_a_real_sweep_writes_a_parseable_event_stream_and_plain_lines(tmp_path):
    spec = tiny_sweep(tmp_path)
    events = tmp_path / "events.jsonl"
    result = autotune("run", spec, "--slots", "2", "--launcher", f"sh {STANDIN}", "--results", tmp_path / "out",
                      "--events", events, env={"STANDIN_SECONDS": "0.2", "STANDIN_THROUGHPUT": "42.5"})
    assert result.returncode == 0, result.stderr
    names = [f"tiny_mbs{2 ** i}" for i in range(4)]
    records = [json.loads(line) for line in events.read_text().splitlines()]
    assert len(records) == 8
    for name in names:
        mine = [r for r in records if r["name"] == name]
        assert [r["event"] for r in mine] == ["started", "finished"]
        started, finished = mine
        assert started["slots"] == finished["slots"] and list(started["slots"]) == ["localhost"]
        assert started["slots"]["localhost"][0] in (0, 1)
        assert finished["state"] == State.SUCCEEDED and finished["metric"] == 42.5 and finished["attempt"] == 1
        assert finished["timestamp"] >= started["timestamp"] + 0.15
    assert [r["timestamp"] for r in records] == sorted(r["timestamp"] for r in records)
    # stdout is not a terminal: one plain line per event, between the heading and the outcome
    lines = result.stdout.splitlines()
    assert lines[0].startswith("sweep tiny: 4 experiments on 2 cpu slot(s) of 1 host(s)")
    events_lines = [line for line in lines if re.match(STAMP, line)]
    assert len(events_lines) == 8
    for name in names:
        assert any(re.fullmatch(STAMP + rf"start     {name} \(attempt 1\) on localhost:[01]", x) for x in events_lines)
        assert any(re.fullmatch(STAMP + rf"succeeded {name} throughput=42.5, latency=1", x) for x in events_lines)
    assert "4 experiments: 4 succeeded" in result.stdout and "best: tiny_mbs1 with throughput 42.5" in result.stdout
    assert "\x1b[" not in result.stdout  # no live view, no escape codes


def test_a_real_sweeps_plain_lines_print_its_custom_metric(tmp_path):
    spec = tmp_path / "custom.hjson"
    spec.write_text("{\n  name: custom\n  script: /bin/true\n  metric: tokens_per_s:max\n"
                    "  ds_config: { gradient_accumulation_steps: 1 }\n"
                    "  space: { train_micro_batch_size_per_gpu: [1, 2] }\n}\n")
    launcher = tmp_path / "launcher.sh"
    launcher.write_text("#!/bin/sh\nprintf '{\"loss\": 2.5, \"tokens_per_s\": 1834.2}' > \"$AUTOTUNE_METRICS_PATH\"\n")
    result = autotune("run", spec, "--slots", "2", "--launcher", f"sh {launcher}", "--results", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    done = [line for line in result.stdout.splitlines() if re.match(STAMP + "succeeded", line)]
    assert len(done) == 2 and all(line.endswith(" tokens_per_s=1834, loss=2.5") for line in done), done


def test_quiet_prints_only_the_outcome(tmp_path):
    spec = tiny_sweep(tmp_path, count=2)
    result = autotune("run", spec, "--slots", "2", "--launcher", f"sh {STANDIN}", "--results", tmp_path / "out",
                      "--quiet", "--events", tmp_path / "ev.jsonl", env={"STANDIN_SECONDS": "0.05"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[0] == "2 experiments: 2 succeeded"
    assert not re.search(STAMP, result.stdout) and "sweep tiny" not in result.stdout
    assert len((tmp_path / "ev.jsonl").read_text().splitlines()) == 4  # --events still works with --quiet


def test_an_unwritable_events_file_is_bad_input_and_nothing_is_created(tmp_path):
    spec = tiny_sweep(tmp_path, count=1)
    result = autotune("run", spec, "--slots", "1", "--results", tmp_path / "out", "--events",
                      tmp_path / "no" / "such" / "dir" / "ev.jsonl")
    assert result.returncode == 2
    assert result.stderr.startswith("autotune: error: ") and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_on_a_terminal_the_live_view_is_drawn(tmp_path):
    """The real CLI in a pseudo-terminal: the live panel appears, then the outcome; Ctrl-C still stops it."""
    spec = tiny_sweep(tmp_path, count=4)
    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI with a terminal for stdout
        os.chdir(tmp_path)
        os.environ.update({**tree_env(), "STANDIN_SECONDS": "3", "COLUMNS": "100"})
        os.execv(sys.executable, [sys.executable, "-m", "autotuner.cli", "run", str(spec), "--slots", "2",
                                  "--launcher", f"sh {STANDIN}", "--results", str(tmp_path / "out")])
    output = b""
    started = time.monotonic()
    interrupted = False
    while time.monotonic() - started < 60:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            if not data:
                break
            output += data
        if not interrupted and b"2 running" in output:
            os.kill(pid, signal.SIGINT)
            interrupted = True
    _, status = os.waitpid(pid, 0)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output.decode(errors="replace"))
    assert interrupted, text[-2000:]
    assert os.waitstatus_to_exitcode(status) == 130
    assert "sweep tiny: throughput (higher is better)" in text and "localhost" in text
    assert "tiny_mbs1" in text and "timeout" in text and "30s" in text
    assert "2 interrupted" in text and "`autotune resume" in text
    assert not re.search(STAMP + "start", text)  # the live view replaces the plain lines
    last = text[text.rindex("╭─ sweep tiny"):]  # the last frame: why it stopped, after how long; no ETA
    assert re.search(r"stopped after \d+s: interrupted by the user", last) and "ETA" not in last, last


# --- in a real terminal: tmux, and what its screen shows a user ---------------------------------------------
# tm_mbs2 runs out of memory; tm_mbs5 (or every one, with SLOW=1) trains past its timeout; the rest write their
# metric (a custom one) and train a moment. Each takes a while to stop on SIGTERM, as a training script does.
TMUX_LAUNCHER = """\
#!/bin/sh
trap 'sleep 2; exit 143' TERM
name=$(basename "$(dirname "$AUTOTUNE_METRICS_PATH")")
steps=3
case "$name" in
  *_mbs2) sleep 1; echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB" >&2; exit 1;;
  *_mbs5) steps=40;;
esac
[ -n "$SLOW" ] && steps=40
printf '{"loss": 2.5, "tokens_per_s": %s}\\n' "${name#tm_mbs}" > "$AUTOTUNE_METRICS_PATH"
i=0; while [ "$i" -lt "$steps" ]; do sleep 0.5; i=$((i + 1)); done
"""


class Tmux:
    """`autotune` in a tmux window of 100 x 50 on a tmux server of the test's own; `screen()` is what it shows."""

    def __init__(self, directory: Path, args: list[str], **environ: str):
        if not shutil.which("tmux"):
            pytest.fail("tmux is needed to check the live view in a real terminal (.ci/setup-tests installs it)")
        self.server = ["tmux", "-L", f"autotune-test-{os.getpid()}-{directory.name}"]
        command = ["env", "-u", "COLUMNS", "-u", "LINES", *(f"{k}={v}" for k, v in environ.items()),
                   sys.executable, "-m", "autotuner", *args]
        shell = f'{shlex.join(command)}; echo "EXIT=$?"; sleep 600'
        subprocess.run([*self.server, "-f", "/dev/null", "new-session", "-d", "-x", "100", "-y", "50",
                        "-c", str(directory), shell], check=True, env={**os.environ, "PYTHONPATH": str(REPO)})

    def screen(self) -> str:
        return subprocess.run([*self.server, "capture-pane", "-p"], capture_output=True, text=True, check=True).stdout

    def press(self, key: str) -> None:
        subprocess.run([*self.server, "send-keys", key], check=True)

    def watch(self, until, timeout: float = 120) -> list[str]:
        """Every different screen until `until(screen)` holds (the timeout only guards against a hang)."""
        frames: list[str] = []
        end = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if not frames or frames[-1] != screen:
                frames.append(screen)
            if until(screen):
                return frames
            if time.monotonic() > end:
                raise AssertionError(f"gave up waiting; the screen:\n{screen}")
            time.sleep(0.05)

    def close(self) -> None:
        subprocess.run([*self.server, "kill-server"], capture_output=True)


@pytest.fixture
def tmux_sweep(tmp_path):
    """A sweep of 8 experiments (metric tokens_per_s:max, timeout 4 s) and its stand-in launcher; the tmux
    windows opened on it are closed at teardown."""
    (tmp_path / "launcher.sh").write_text(TMUX_LAUNCHER)
    (tmp_path / "tm.hjson").write_text(
        "{\n  name: tm\n  script: /bin/true\n  metric: tokens_per_s:max\n  timeout: 4\n"
        "  ds_config: { gradient_accumulation_steps: 1 }\n"
        "  space: { train_micro_batch_size_per_gpu: [1, 2, 3, 4, 5, 6, 7, 8] }\n}\n")
    opened: list[Tmux] = []

    def start(*extra: str, **environ: str) -> Tmux:
        tmux = Tmux(tmp_path, ["run", "tm.hjson", "--slots", "2", "--launcher", f"sh {tmp_path / 'launcher.sh'}",
                               "--results", str(tmp_path / f"out{len(opened)}"), *extra], **environ)
        opened.append(tmux)
        return tmux

    yield start
    for tmux in opened:
        tmux.close()


def panel(screen: str) -> str:
    """The live view's last frame on a screen."""
    return screen[screen.rindex("╭─ sweep tm"):screen.rindex("╰")]


def running_keys(screen: str) -> set[tuple[str, str, str]]:
    """(key, experiment, attempt) of each row of the running list on a screen."""
    rows = set()
    for line in screen.splitlines():
        words = line.strip("│ ").split()
        if len(words) >= 4 and len(words[0]) == 1 and words[1].startswith("tm_mbs") and words[2].isdigit():
            rows.add((words[0], words[1], words[2]))
    return rows


def test_in_a_real_terminal_keys_stay_failures_show_as_they_come_and_the_end_gives_the_total(tmux_sweep):
    tmux = tmux_sweep()
    frames = tmux.watch(lambda screen: "EXIT=" in screen)
    keys: dict[tuple[str, str], set[str]] = {}
    for screen in frames:
        for key, name, attempt in running_keys(screen):
            keys.setdefault((name, attempt), set()).add(key)
    assert len(keys) == 8 and all(len(k) == 1 for k in keys.values()), keys  # each kept its key while it ran
    # the OOM is listed, name and reason, while other runs still go on; a timeout is not counted as failed
    assert any(running_keys(s) and re.search(r"tm_mbs2 +1 +\[oom\] torch.OutOfMemoryError: CUDA out of memory", s)
               for s in frames), frames[-1]
    assert any("1 failed   1 timed out" in s for s in frames) and not any("2 failed" in s for s in frames)
    last = tmux.screen()
    end = panel(last)
    assert re.search(r"finished in \d+s", end) and "ETA" not in end, end
    assert "6 done   1 failed   1 timed out   0 running   0 queued   of 8" in end
    assert "best so far: tm_mbs8  tokens_per_s 8" in end
    assert "[timeout] ran past its timeout of 4 s" in end
    assert "8 experiments: 1 failed, 6 succeeded, 1 timed_out" in last and "EXIT=1" in last


def test_in_a_real_terminal_ctrl_c_says_the_sweep_is_stopping_and_drops_the_eta(tmux_sweep):
    tmux = tmux_sweep(SLOW="1")
    tmux.watch(lambda screen: "2 running" in screen)
    tmux.press("C-c")
    stopping = tmux.watch(lambda screen: "stopping:" in screen)[-1]
    assert "stopping: interrupted by the user; waiting for 2 runs to end" in panel(stopping)
    assert "ETA" not in panel(stopping)
    last = tmux.watch(lambda screen: "EXIT=" in screen)[-1]
    assert re.search(r"stopped after \d+s: interrupted by the user", panel(last)) and "ETA" not in panel(last)
    assert "2 interrupted" in panel(last) and "EXIT=130" in last


def test_the_eta_is_replanned_at_most_once_per_share_of_its_cost_however_old_the_plan(midway, monkeypatch):
    """A re-plan that costs `cost` is not repeated within REPLAN_SHARE * cost, whether runs end before every
    frame or the plan has aged past REPLAN_SECONDS (which re-planned whatever it cost: 4.5% of a core at 500
    queued); a cheap plan is still re-planned once it has aged, nothing having changed."""
    from autotuner.views import eta

    class Clock:
        now = 0.0

        def perf_counter(self) -> float:
            return self.now

    clock = Clock()
    monkeypatch.setattr(eta, "time", clock)
    view = LiveView(snapshot(midway), clock=lambda: T0)
    planner = eta.Eta(snapshot(midway).meta)
    state = view.state()
    last = 59.75  # the last frame's time
    costly = 1 + int(last / (eta.REPLAN_SHARE * 0.5))
    for cost, changing, expected in ((0.5, True, costly), (0.5, False, costly),
                                     (0.001, False, 1 + int(last / eta.REPLAN_SECONDS))):
        plans = []

        def replan(*args, cost=cost, plans=plans):
            clock.now += cost
            plans.append(clock.now)
            return None

        monkeypatch.setattr(planner, "_replan", replan)
        planner._plan = None
        start = clock.now
        for frame in range(240):  # a minute of frames at 4 a second, something changed before each
            at = start + frame / 4
            clock.now = max(clock.now, at)
            planner.planned_end(state, at, frame if changing else 0, {}, {})
        assert len(plans) == expected, (cost, changing, len(plans))
