"""A sweep's life end to end through the `autotune` CLI, with stand-in launchers: cancel, Ctrl-C, timeouts,
the grace period, the deadline, retries, failure classes, spec changes on resume, status, exit codes.

Every test checks what the ledger recorded, what was launched, and that no process of the sweep is left.
"""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from autotuner.states import State

from cli_rig import (
    PREAMBLE,
    WRITE_METRICS,
    Runners,
    attempts,
    autotune,
    env,
    expected_throughput,
    finish,
    latest,
    launched,
    launches,
    runner_alive,
    states,
    sweep_id,
    tagged_pids,
    wait_until,
    write_launcher,
    write_sweep,
)

# The general stand-in: sleeps $STANDIN_SECONDS then succeeds. IGNORE_TERM=1: ignores SIGTERM (and so do its
# children). TERM_GATE=PATH: a SIGTERM ends it only once PATH exists (a run that takes its time to stop).
# SPAWN=1: leaves a child in its process group and one that escaped it (setsid). FAIL_ONCE=1: the first launch
# of each experiment fails with a transient "Address already in use".
STANDIN = PREAMBLE + """\
if [ -n "$IGNORE_TERM" ]; then trap '' TERM; fi
if [ -n "$TERM_GATE" ]; then trap 'until [ -e "$TERM_GATE" ]; do sleep 0.02; done; exit 143' TERM; fi
if [ -n "$FAIL_ONCE" ] && [ ! -e "$MARKS/$name" ]; then
    mkdir -p "$MARKS"; touch "$MARKS/$name"
    echo "RuntimeError: The server socket has failed to listen on any local network address. Address already in use" >&2
    exit 1
fi
if [ -n "$SPAWN" ]; then sleep 1000 & setsid sleep 1000 & fi
sleep "${STANDIN_SECONDS:-0.1}"
""" + WRITE_METRICS


class Sweep:
    """One sweep of the test: its spec, launcher, results directory and launch log."""

    def __init__(self, tmp_path: Path, values, launcher_body: str = STANDIN, name: str = "s", extra: str = ""):
        self.tmp = tmp_path
        self.spec = write_sweep(tmp_path, values, name=name, extra=extra)
        self.launcher = write_launcher(tmp_path, launcher_body)
        self.dir = tmp_path / "out"
        self.log = tmp_path / "launches.log"
        self.names = [f"{name}_x{v}" for v in values]

    def env(self, **extra):
        return env(LAUNCH_LOG=self.log, MARKS=self.tmp / "marks", **extra)

    def run_args(self, slots: int = 2, *more):
        return ("run", self.spec, "--slots", slots, "--launcher", self.launcher, "-o", self.dir, "-q", *more)

    def start(self, runners: Runners, slots: int = 2, *more, **environ):
        return runners.start(*self.run_args(slots, *more), environ=self.env(**environ), directory=self.dir)

    def resume(self, runners: Runners, *more, **environ):
        return runners.start("resume", self.dir, "-q", *more, environ=self.env(**environ), directory=self.dir)

    def launched(self) -> list[str]:
        return [n for n, _ in launches(self.log)]

    def leftovers(self) -> list[int]:
        return tagged_pids(sweep_id(self.dir))

    def wait_running(self, count: int, processes_each: int = 1) -> list[str]:
        """Until `count` experiments run with their processes (`processes_each` tagged ones apiece) up."""
        def ready():
            names = launched(self.dir)
            return len(names) == count and len(self.leftovers()) >= count * processes_each and names
        return wait_until(ready, message=f"{count} running")


def tag_of(directory: Path, name: str, attempt: int = 1) -> str:
    return f"{sweep_id(directory)}.{name}.{attempt}"


def no_traceback(*texts: str) -> None:
    for text in texts:
        assert "Traceback" not in text, text


# --- cancel ----------------------------------------------------------------------------------------------------
def test_cancel_named_experiments_then_the_whole_sweep_from_another_process(tmp_path, runners):
    s = Sweep(tmp_path, range(5))
    proc = s.start(runners, 2, "--grace", 1, STANDIN_SECONDS=60, SPAWN=1)
    assert sorted(s.wait_running(2, processes_each=3)) == ["s_x0", "s_x1"]

    done = autotune("cancel", s.dir, "s_x0", "s_x4", environ=s.env())
    assert done.returncode == 0, done.stderr
    assert f"pid {proc.pid}" in done.stdout
    # The running one is ended (its processes too, the escaped one included), the queued one never starts,
    # and the freed slot goes to the next in line.
    wait_until(lambda: states(s.dir)["s_x0"] == State.CANCELLED and "s_x2" in launched(s.dir))
    wait_until(lambda: not tagged_pids(tag_of(s.dir, "s_x0")) or None, message="s_x0's processes gone")
    assert states(s.dir)["s_x4"] == State.CANCELLED
    assert latest(s.dir)["s_x4"].detail == "cancelled before it started"
    assert latest(s.dir)["s_x0"].detail == "cancelled while running"

    bad = autotune("cancel", s.dir, "no_such_exp", environ=s.env())
    assert bad.returncode == 2 and "no_such_exp" in bad.stderr

    done = autotune("cancel", s.dir, environ=s.env())  # the whole sweep
    assert done.returncode == 0, done.stderr
    code, out, err = finish(proc)
    assert code == 1, (out, err)
    no_traceback(out, err)
    assert states(s.dir) == {n: State.CANCELLED for n in s.names}
    assert sorted(s.launched()) == ["s_x0", "s_x1", "s_x2"]  # s_x3 and s_x4 never started
    assert s.leftovers() == []
    assert runner_alive(s.dir) is None


def test_cancel_while_no_runner_is_alive(tmp_path, runners):
    s = Sweep(tmp_path, range(4))
    proc = s.start(runners, 2, STANDIN_SECONDS=60, SPAWN=1)
    s.wait_running(2, processes_each=3)
    proc.kill()  # the runner dies; its experiments' processes live on
    proc.wait()
    assert s.leftovers()

    done = autotune("cancel", s.dir, "s_x1", "s_x2", environ=s.env())
    assert done.returncode == 0, done.stderr
    assert "cancelled 2" in done.stdout
    # Applied in the ledger directly, after ending what the dead runner left (recorded interrupted).
    assert s.leftovers() == []
    assert states(s.dir) == {"s_x0": State.INTERRUPTED, "s_x1": State.CANCELLED, "s_x2": State.CANCELLED,
                             "s_x3": State.QUEUED}

    code, out, err = finish(s.resume(runners, STANDIN_SECONDS=0.1))
    assert code == 1, (out, err)  # not everything succeeded: two were cancelled
    assert states(s.dir) == {"s_x0": State.SUCCEEDED, "s_x1": State.CANCELLED, "s_x2": State.CANCELLED,
                             "s_x3": State.SUCCEEDED}
    assert sorted(s.launched()) == ["s_x0", "s_x0", "s_x1", "s_x3"]  # nothing cancelled ran again
    assert s.leftovers() == []


def test_cancel_of_the_whole_sweep_while_no_runner_is_alive(tmp_path, runners):
    s = Sweep(tmp_path, range(3))
    proc = s.start(runners, 1, STANDIN_SECONDS=60)
    s.wait_running(1)
    proc.kill()
    proc.wait()

    done = autotune("cancel", s.dir, environ=s.env())
    assert done.returncode == 0, done.stderr
    assert states(s.dir) == {n: State.CANCELLED for n in s.names}
    assert s.leftovers() == []
    code, out, err = finish(s.resume(runners, STANDIN_SECONDS=0.1))
    assert code == 1, (out, err)
    assert s.launched() == ["s_x0"]  # resume started nothing
    status = autotune("status", s.dir)
    assert "runner: done" in status.stdout


def test_cancel_reaching_a_runner_that_is_still_clearing_up_is_applied_not_fatal(tmp_path, runners):
    """`cancel` signals the runner as soon as it holds the sweep, even before it dispatches anything."""
    s = Sweep(tmp_path, range(3))
    proc = s.start(runners, 2, STANDIN_SECONDS=60, IGNORE_TERM=1)
    s.wait_running(2)
    proc.kill()
    proc.wait()
    # resume first ends what the dead runner left: they ignore SIGTERM, so that takes the grace period.
    resumed = s.resume(runners, "--grace", 3, STANDIN_SECONDS=60)
    wait_until(lambda: runner_alive(s.dir) == resumed.pid)
    done = autotune("cancel", s.dir, environ=s.env())
    assert done.returncode == 0, done.stderr
    code, out, err = finish(resumed)
    assert code == 1, (code, out, err)  # the runner lived to apply it (SIGUSR1 used to kill it)
    no_traceback(out, err)
    assert states(s.dir) == {n: State.CANCELLED for n in s.names}
    assert sorted(s.launched()) == ["s_x0", "s_x1"]  # nothing started after the cancel
    assert s.leftovers() == []


def test_a_second_cancel_does_not_kill_a_first_one_that_is_clearing_up(tmp_path, runners):
    """With no runner alive, the first `cancel` holds the sweep while it ends what the dead runner left; a second
    `cancel` finds it holding the lock and signals it (SIGUSR1), which used to kill it halfway. The runs end on
    SIGTERM only once the second `cancel` has returned (a gate, not the grace period: no wait on a clock)."""
    s = Sweep(tmp_path, range(2))
    gate = tmp_path / "stopped"
    proc = s.start(runners, 2, STANDIN_SECONDS=60, TERM_GATE=gate)
    s.wait_running(2)
    proc.kill()
    proc.wait()
    first = runners.start("cancel", s.dir, "s_x0", environ=s.env(), directory=s.dir)
    wait_until(lambda: runner_alive(s.dir) == first.pid)  # it holds the lock: clearing up (the runs not ended)
    second = autotune("cancel", s.dir, "s_x1", environ=s.env())
    assert second.returncode == 0, second.stderr
    gate.touch()
    code, out, err = finish(first)
    assert code == 0, (code, out, err)
    assert s.leftovers() == []
    assert states(s.dir) == {"s_x0": State.CANCELLED, "s_x1": State.CANCELLED}  # the second's request applied too


# --- Ctrl-C --------------------------------------------------------------------------------------------------
def test_ctrl_c_interrupts_cleanly_and_resume_completes(tmp_path, runners):
    s = Sweep(tmp_path, range(5))
    proc = s.start(runners, 2, "--grace", 2, STANDIN_SECONDS=60, SPAWN=1)
    running = s.wait_running(2, processes_each=3)

    proc.send_signal(signal.SIGINT)
    code, out, err = finish(proc)
    assert code == 130, (out, err)
    no_traceback(out, err)
    assert "autotune resume" in out
    now = latest(s.dir)
    assert {n for n, a in now.items() if a.state == State.INTERRUPTED} == set(running)
    assert {n for n, a in now.items() if a.state == State.QUEUED} == set(s.names) - set(running)
    assert all(now[n].reason == "interrupted" for n in running)
    assert s.leftovers() == []  # the escaped child (setsid) too
    assert runner_alive(s.dir) is None

    code, out, err = finish(s.resume(runners, STANDIN_SECONDS=0.1))
    assert code == 0, (out, err)
    now = latest(s.dir)
    assert {n: a.state for n, a in now.items()} == {n: State.SUCCEEDED for n in s.names}
    assert all(now[n].attempt == 2 for n in running)
    assert all(now[n].metric == expected_throughput(n) for n in s.names)
    assert sorted(s.launched()) == sorted(s.names + running)
    assert s.leftovers() == []


def test_second_ctrl_c_kills_at_once(tmp_path, runners):
    s = Sweep(tmp_path, range(3))
    # They ignore SIGTERM and the grace period is long: only the second Ctrl-C can end them soon.
    proc = s.start(runners, 2, "--grace", 600, STANDIN_SECONDS=60, SPAWN=1, IGNORE_TERM=1)
    running = s.wait_running(2, processes_each=3)

    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)  # two signals sent at once may arrive as one
    proc.send_signal(signal.SIGINT)
    code, out, err = finish(proc, timeout=60)  # well before the 600 s grace period
    assert code == 130, (out, err)
    no_traceback(out, err)
    assert s.leftovers() == []
    assert runner_alive(s.dir) is None
    now = latest(s.dir)  # recorded interrupted, not judged by their exit status (-9 reads as the OOM killer)
    assert {n for n, a in now.items() if a.state == State.INTERRUPTED} == set(running), now
    assert {n for n, a in now.items() if a.state == State.QUEUED} == set(s.names) - set(running)

    code, out, err = finish(s.resume(runners, STANDIN_SECONDS=0.1))
    assert code == 0, (out, err)
    by_name = {}
    for a in attempts(s.dir):
        by_name.setdefault(a.name, []).append(a.state)
    assert all(by_name[n] == [State.INTERRUPTED, State.SUCCEEDED] for n in running)
    assert s.leftovers() == []


@pytest.mark.parametrize("presses", [3, 5])
def test_ctrl_c_pressed_again_and_again_only_repeats_the_kill(tmp_path, runners, presses):
    """A third (fourth, fifth) Ctrl-C once killing has begun never crashes the runner: no KeyboardInterrupt out
    of the handler, no traceback, exit 130, nothing of the sweep left, each run recorded interrupted."""
    s = Sweep(tmp_path, range(3))
    proc = s.start(runners, 2, "--grace", 600, STANDIN_SECONDS=60, SPAWN=1, IGNORE_TERM=1)
    running = s.wait_running(2, processes_each=3)

    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)  # two signals sent at once may arrive as one
    for _ in range(presses - 1):  # the later ones in quick succession, while the kill is under way
        proc.send_signal(signal.SIGINT)
        time.sleep(0.02)
    code, out, err = finish(proc, timeout=60)
    assert code == 130, (out, err)
    no_traceback(out, err)
    assert "KeyboardInterrupt" not in out + err
    assert s.leftovers() == []
    assert runner_alive(s.dir) is None
    now = latest(s.dir)
    assert {n for n, a in now.items() if a.state == State.INTERRUPTED} == set(running), now
    assert {n for n, a in now.items() if a.state == State.QUEUED} == set(s.names) - set(running)


# --- timeouts, the grace period, the deadline --------------------------------------------------------------
def test_a_hung_experiment_is_timed_out_with_its_whole_process_tree(tmp_path, runners):
    hang = PREAMBLE + 'case "$name" in *_x0) sleep 1000 & setsid sleep 1000 & sleep 1000;; esac\n' + WRITE_METRICS
    s = Sweep(tmp_path, range(2), launcher_body=hang, extra="  timeout: 1.5")
    code, out, err = finish(s.start(runners, 2, "--grace", 1))
    assert code == 1, (out, err)
    x0, x1 = latest(s.dir)["s_x0"], latest(s.dir)["s_x1"]
    assert (x0.state, x0.reason) == (State.TIMED_OUT, "timeout")
    assert "1.5" in x0.detail
    assert x1.state == State.SUCCEEDED
    assert s.leftovers() == []


def test_an_experiment_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path, runners):
    stubborn = PREAMBLE + """\
trap 'echo TERM >> "$MARKS.term"' TERM
while :; do sleep 0.1; done
"""
    s = Sweep(tmp_path, range(1), launcher_body=stubborn)
    code, out, err = finish(s.start(runners, 1, "--timeout", 1, "--grace", 1))
    assert code == 1, (out, err)
    a = latest(s.dir)["s_x0"]
    assert (a.state, a.reason) == (State.TIMED_OUT, "timeout")
    assert "TERM" in Path(f"{tmp_path / 'marks'}.term").read_text()  # it was asked first ...
    assert a.exit_code == -signal.SIGKILL  # ... and killed once the grace period was over
    assert s.leftovers() == []


def test_sweep_deadline_then_resume_then_retry_failed(tmp_path, runners):
    s = Sweep(tmp_path, range(4))
    code, out, err = finish(s.start(runners, 2, "--deadline", 1.5, "--grace", 1, STANDIN_SECONDS=60, SPAWN=1))
    assert code == 1, (out, err)
    now = latest(s.dir)
    ran = [n for n in s.names if now[n].state == State.TIMED_OUT]
    assert len(ran) == 2
    assert all(now[n].reason == "timeout" and "deadline" in now[n].detail for n in ran)
    assert sorted(n for n in s.names if now[n].state == State.QUEUED) == sorted(set(s.names) - set(ran))
    assert s.leftovers() == []

    # resume runs what never started; the timed-out ones stay timed out ...
    code, out, err = finish(s.resume(runners, STANDIN_SECONDS=0.1))
    assert code == 1, (out, err)
    now = latest(s.dir)
    assert sorted(n for n in s.names if now[n].state == State.SUCCEEDED) == sorted(set(s.names) - set(ran))
    assert all(now[n].state == State.TIMED_OUT for n in ran)
    # ... until asked: --retry-failed runs them again, and nothing else.
    before = len(s.launched())
    code, out, err = finish(s.resume(runners, "--retry-failed", STANDIN_SECONDS=0.1))
    assert code == 0, (out, err)
    assert states(s.dir) == {n: State.SUCCEEDED for n in s.names}
    assert sorted(s.launched()[before:]) == sorted(ran)
    assert s.leftovers() == []


# --- retries and failure classes --------------------------------------------------------------------------------
def test_a_transient_failure_is_retried(tmp_path, runners):
    s = Sweep(tmp_path, range(2))
    code, out, err = finish(s.start(runners, 2, FAIL_ONCE=1))
    assert code == 0, (out, err)
    history = [(a.name, a.attempt, a.state, a.reason) for a in attempts(s.dir)]
    assert history == [("s_x0", 1, State.FAILED, "launch"), ("s_x0", 2, State.SUCCEEDED, None),
                       ("s_x1", 1, State.FAILED, "launch"), ("s_x1", 2, State.SUCCEEDED, None)]
    assert "Address already in use" in attempts(s.dir)[0].detail


def test_no_retry_with_retries_0(tmp_path, runners):
    s = Sweep(tmp_path, range(1))
    code, out, err = finish(s.start(runners, 1, "--retries", 0, FAIL_ONCE=1))
    assert code == 1, (out, err)
    assert [(a.attempt, a.state, a.reason) for a in attempts(s.dir)] == [(1, State.FAILED, "launch")]


def test_retries_count_failures_not_earlier_interrupted_attempts(tmp_path, runners):
    s = Sweep(tmp_path, range(1))
    proc = s.start(runners, 1, "--grace", 1, STANDIN_SECONDS=60)
    s.wait_running(1)
    proc.send_signal(signal.SIGINT)
    assert finish(proc)[0] == 130
    # Attempt 2 fails transiently: with --retries 1 it gets its retry, although it is the second attempt.
    code, out, err = finish(s.resume(runners, FAIL_ONCE=1))
    assert code == 0, (out, err)
    assert [(a.attempt, a.state) for a in attempts(s.dir)] == [
        (1, State.INTERRUPTED), (2, State.FAILED), (3, State.SUCCEEDED)]


FAILURES = PREAMBLE + """\
case "$name" in
  *_x0) echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB" >&2; exit 1;;
  *_x1) echo "DeepSpeedConfigError: bad zero stage 7" >&2; exit 1;;
  *_x2) echo "RuntimeError: Address already in use" >&2; exit 1;;
  *_x3) echo "training done"; exit 0;;
  *_x4) echo "noise"; echo "ValueError: loss is nan" >&2; echo "more noise" >&2; exit 3;;
  *_x5) sleep 1000;;
esac
""" + WRITE_METRICS
CLASSES = {  # experiment: (reason, its telling line)
    "s_x0": ("oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
    "s_x1": ("config", "DeepSpeedConfigError: bad zero stage 7"),
    "s_x2": ("launch", "RuntimeError: Address already in use"),
    "s_x3": ("metrics", "metrics file missing"),
    "s_x4": ("exit", "ValueError: loss is nan"),
    "s_x5": ("timeout", "ran past its timeout of 2 s"),
}


def table_rows(text: str) -> dict[str, list[str]]:
    """The report table's cells per experiment name, a cell wrapped over several lines joined again."""
    rows: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if not line.startswith("│"):
            current = None
            continue
        cells = [c.strip() for c in line.strip("│").split("│")]
        if cells[1]:
            current = rows.setdefault(cells[1], cells)
        elif current is not None:
            for i, more in enumerate(cells):
                if more:
                    current[i] = f"{current[i]} {more}"
    return rows


def test_each_failure_class_is_recorded_with_its_telling_line_and_reported(tmp_path, runners):
    s = Sweep(tmp_path, range(7), launcher_body=FAILURES)
    code, out, err = finish(s.start(runners, 3, "--timeout", 2, "--retries", 0, "--grace", 1))
    assert code == 1, (out, err)
    now = latest(s.dir)
    assert now["s_x6"].state == State.SUCCEEDED
    for name, (reason, line) in CLASSES.items():
        a = now[name]
        assert a.state == (State.TIMED_OUT if reason == "timeout" else State.FAILED), a
        assert a.reason == reason, a
        assert line in a.detail, a
    assert s.leftovers() == []

    table = autotune("report", s.dir)
    assert table.returncode == 0, table.stderr
    rows = table_rows(table.stdout)
    for name, (reason, line) in CLASSES.items():
        assert f"[{reason}]" in rows[name][-1] and line in rows[name][-1], rows[name]
    assert rows["s_x6"][0] == "best"

    as_json = json.loads(autotune("report", s.dir, "--format", "json").stdout)
    rows = {r["name"]: r for r in as_json["experiments"]}
    assert as_json["best"] == "s_x6"
    for name, (reason, line) in CLASSES.items():
        assert rows[name]["reason"] == reason and line in rows[name]["detail"]
    summary = (s.dir / "summary.txt").read_text()  # DeepSpeed's shape: the best per ZeRO stage and overall
    assert "| global " in summary and "| s_x6 " in summary and "[oom]" not in summary


# --- spec changes on resume --------------------------------------------------------------------------------------
def test_a_changed_spec_is_refused_on_resume_and_only_new_runs_just_the_new(tmp_path, runners):
    s = Sweep(tmp_path, range(2))
    code, out, err = finish(s.start(runners, 2))
    assert code == 0, (out, err)
    original = s.spec.read_text()
    transitions = len(attempts(s.dir))

    s.spec.write_text(original.replace("train_micro_batch_size_per_gpu: 1", "train_micro_batch_size_per_gpu: 2"))
    refused = autotune("resume", s.dir, environ=s.env())
    assert refused.returncode == 2
    assert "changed: s_x0, s_x1" in refused.stderr and str(s.spec) in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    only_new = autotune("resume", s.dir, "--only-new", environ=s.env())  # nothing new: nothing runs
    assert only_new.returncode == 0, only_new.stderr
    # said, not silent: the changed experiments keep the config they ran with
    assert "left as recorded (changed: s_x0, s_x1)" in only_new.stderr, only_new.stderr

    s.spec.write_text(original.replace('"x": [0, 1]', '"x": [0, 1, 2]'))
    refused = autotune("resume", s.dir, environ=s.env())
    assert refused.returncode == 2 and "new: s_x2" in refused.stderr
    assert len(attempts(s.dir)) == transitions and sorted(s.launched()) == ["s_x0", "s_x1"]

    code, out, err = finish(s.resume(runners, "--only-new"))
    assert code == 0, (out, err)
    assert sorted(s.launched()) == ["s_x0", "s_x1", "s_x2"]
    assert states(s.dir) == {"s_x0": State.SUCCEEDED, "s_x1": State.SUCCEEDED, "s_x2": State.SUCCEEDED}
    assert len(attempts(s.dir)) == 3  # the old ones did not run again


# --- status and exit codes ---------------------------------------------------------------------------------------
def test_status_while_the_sweep_runs_and_after(tmp_path, runners):
    s = Sweep(tmp_path, range(3))
    proc = s.start(runners, 2, "--grace", 1, STANDIN_SECONDS=60)
    running = sorted(s.wait_running(2))

    shown = autotune("status", s.dir, "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["runner_pid"] == proc.pid
    assert data["counts"] == {State.RUNNING: 2, State.QUEUED: 1} and data["total"] == 3
    assert sorted(r["name"] for r in data["running"]) == running
    text = autotune("status", s.dir).stdout
    assert f"runner: pid {proc.pid}" in text and f"running {running[0]}" in text

    busy = autotune("resume", s.dir, environ=s.env())  # a second runner is refused
    assert busy.returncode == 2 and f"pid {proc.pid}" in busy.stderr

    proc.send_signal(signal.SIGINT)
    assert finish(proc)[0] == 130
    data = json.loads(autotune("status", s.dir, "--json").stdout)
    assert data["runner_pid"] is None and data["running"] == []
    assert data["counts"] == {State.INTERRUPTED: 2, State.QUEUED: 1}
    assert "runner: none" in autotune("status", s.dir).stdout

    code, out, err = finish(s.resume(runners, STANDIN_SECONDS=0.1))
    assert code == 0, (out, err)
    data = json.loads(autotune("status", s.dir, "--json").stdout)
    assert data["counts"] == {State.SUCCEEDED: 3} and data["runner_pid"] is None
    best = max(s.names, key=expected_throughput)
    assert data["best"]["name"] == best and data["best"]["value"] == expected_throughput(best)
    text = autotune("status", s.dir).stdout
    assert "runner: done" in text and f"best so far: {best}" in text


def test_exit_codes_for_bad_input(tmp_path, runners):
    s = Sweep(tmp_path, range(1))
    missing = autotune("run", tmp_path / "nope.hjson", "--slots", 1, "-o", tmp_path / "x")
    assert missing.returncode == 2
    assert len(missing.stderr.strip().splitlines()) == 1 and "nope.hjson" in missing.stderr
    assert not (tmp_path / "x").exists()
    for command in (("resume", tmp_path / "empty"), ("status", tmp_path / "empty"), ("report", tmp_path / "empty"),
                    ("cancel", tmp_path / "empty")):
        (tmp_path / "empty").mkdir(exist_ok=True)
        done = autotune(*command)
        assert done.returncode == 2, (command, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr

    assert finish(s.start(runners, 1))[0] == 0
    again = autotune(*s.run_args(1), environ=s.env())  # the directory already holds a sweep
    assert again.returncode == 2 and "resume" in again.stderr
    assert autotune("report", s.dir, "--format", "nope").returncode == 2
    assert s.launched() == ["s_x0"]


def test_resume_from_another_directory_finds_a_relative_script(tmp_path, runners):
    """`run exps/ --script train.py` in one directory, `resume` from another: the same experiments."""
    work = tmp_path / "work"
    (work / "exps").mkdir(parents=True)
    (work / "train.py").touch()
    for i in range(2):
        (work / "exps" / f"e{i}.json").write_text(json.dumps(
            {"name": f"e{i}", "ds_config": {"train_micro_batch_size_per_gpu": 1 + i}, "num_gpus": 1, "num_nodes": 1}))
    launcher = write_launcher(tmp_path, STANDIN)
    log = tmp_path / "launches.log"
    directory = tmp_path / "out"
    proc = runners.start("run", "exps", "--script", "train.py", "--slots", 1, "--launcher", launcher, "-o", directory,
                         "-q", "--grace", 1, environ=env(LAUNCH_LOG=log, STANDIN_SECONDS=60), directory=directory,
                         cwd=work)
    wait_until(lambda: launched(directory))
    proc.send_signal(signal.SIGINT)
    assert finish(proc)[0] == 130
    resumed = autotune("resume", directory, "-q", environ=env(LAUNCH_LOG=log, STANDIN_SECONDS=0.1), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert states(directory) == {"e0": State.SUCCEEDED, "e1": State.SUCCEEDED}


def test_sigterm_to_the_runner_stops_it_like_ctrl_c(tmp_path, runners):
    s = Sweep(tmp_path, range(3))
    proc = s.start(runners, 2, "--grace", 1, STANDIN_SECONDS=60, SPAWN=1)
    running = s.wait_running(2, processes_each=3)
    proc.terminate()
    code, out, err = finish(proc)
    assert code == 130, (out, err)
    assert sorted(n for n, st in states(s.dir).items() if st == State.INTERRUPTED) == sorted(running)
    assert s.leftovers() == []
