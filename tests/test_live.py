"""Watching a sweep: the live view (rendered into a recording console), plain event lines, the JSON event stream."""
from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from autotuner.core import Queued, Reservation, Run
from autotuner.outcome import Outcome
from autotuner.states import State
from autotuner.views.events import EventLog, PlainPrinter, event_record
from autotuner.views.live import LiveView, render, seconds
from autotuner.views.snapshot import snapshot

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
    # a timeout counts as failed
    slow = run_of(snap, "zm_z1_mbs32", 1, running["zm_z1_mbs32"].slots)
    view("finished", slow, Outcome(State.TIMED_OUT, "timeout", "ran past its timeout of 300 s"))
    # a node goes down
    view("host_down", "node-a", None)
    text = text_of(view, T0 + 41)
    assert "5 done" in text and "3 failed" in text and "1 running" in text and "3 queued" in text
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
    lines = capsys.readouterr().out.splitlines()
    expected = [
        "start     zm_z2_mbs4 (attempt 2) on node-a:1 node-b:0,2",
        "succeeded zm_z2_mbs4 throughput=1235",
        "failed    zm_z2_mbs4 [oom] CUDA out of memory",
        "timed_out zm_z2_mbs4 [timeout] ran past its timeout of 300 s",
        "cancelled zm_z2_mbs8 [cancelled] cancelled before it started",
        "lost      host node-b",
        "back      host node-b",
    ]
    assert len(lines) == len(expected)
    for line, tail in zip(lines, expected, strict=False):
        assert re.fullmatch(STAMP + re.escape(tail), line), line


# --- the JSON event stream ---------------------------------------------------------------------------------
def test_event_records_carry_what_scripts_need(midway, tmp_path):
    snap = snapshot(midway)
    run = run_of(snap, "zm_z2_mbs4", 1, {"node-b": [1, 2]})
    path = tmp_path / "events.jsonl"
    ticks = iter([T0 + 1, T0 + 2, T0 + 3, T0 + 4])
    log = EventLog(path, "throughput", clock=lambda: next(ticks))
    log("started", run, None)
    log("finished", run, Outcome(State.FAILED, "oom", "CUDA out of memory", 1))
    log("finished", Queued(snap.experiments["zm_z2_mbs8"], 1),
        Outcome(State.CANCELLED, "cancelled", "before it started"))
    log("host_down", "node-b", None)
    log.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
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
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=timeout)


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
        os.environ.update({"STANDIN_SECONDS": "3", "COLUMNS": "100"})
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
