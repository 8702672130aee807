"""After a crash of the runner (kill -9), `resume` adopts what still runs and keeps what finished meanwhile.

Every experiment here waits at a gate file the test opens when it chooses, so each case is deterministic: the
stand-in still runs when the new runner takes over (adopted: followed to its end, never launched again), or
ended while no runner was alive (judged by the exit status its wrapper recorded next to its logs). The plain cases
(a run adopted, one that succeeded meanwhile kept, by resume and by cancel) are tests/test_backend_suite.py's, on
every backend.
"""
from __future__ import annotations

import signal
import sqlite3
from pathlib import Path

import pytest

from autotuner.backends import exitstatus
from autotuner.states import State

from cli_rig import (
    PREAMBLE,
    WRITE_METRICS,
    Runners,
    attempts,
    autotune,
    env,
    finish,
    latest,
    launched,
    launches,
    runner_alive,
    sweep_id,
    tagged_pids,
    wait_until,
    write_launcher,
    write_sweep,
)

# Waits for $GATE, then runs $END_WITH if set (e.g. `exit 3`), then writes its metrics and succeeds.
GATED = PREAMBLE + """\
while [ ! -e "$GATE" ]; do sleep 0.02; done
if [ -n "$END_WITH" ]; then eval "$END_WITH"; fi
""" + WRITE_METRICS


class Crashed:
    """A one-experiment sweep whose runner was killed (-9) while its stand-in ran at the gate."""

    def __init__(self, tmp_path: Path, runners: Runners, *more: object, **environ: object):
        self.spec = write_sweep(tmp_path, [0], name="a")
        self.launcher = write_launcher(tmp_path, GATED)
        self.dir, self.log, self.gate = tmp_path / "out", tmp_path / "launches.log", tmp_path / "gate"
        self.env = env(LAUNCH_LOG=self.log, GATE=self.gate, **environ)
        self.runners = runners
        proc = runners.start("run", self.spec, "--slots", 1, "--launcher", self.launcher, "-o", self.dir, "-q",
                             "--grace", 1, *more, environ=self.env, directory=self.dir)
        self.sweep = wait_until(lambda: sweep_id(self.dir))
        wait_until(lambda: launched(self.dir) == ["a_x0"] and tagged_pids(self.sweep), message="a_x0 running")
        proc.kill()
        proc.wait()
        assert runner_alive(self.dir) is None and tagged_pids(self.sweep)  # the stand-in outlived its runner

    def resume(self, *more: object):
        """A new runner, returned once it has adopted the stand-in (its plain output says so)."""
        proc = self.runners.start("resume", self.dir, "--grace", 1, *more, environ=self.env, directory=self.dir)
        line = proc.stdout.readline()
        assert line.split()[1:3] == ["adopt", "a_x0"], (line, "" if line else proc.stderr.read())
        return proc

    def finish_while_away(self) -> None:
        self.gate.touch()
        wait_until(lambda: (self.dir / "a_x0" / "exit_status").exists() and not tagged_pids(self.sweep),
                   message="a_x0 ended")

    def attempts(self) -> list[tuple[int, str]]:
        return [(a.attempt, a.state) for a in attempts(self.dir)]


@pytest.mark.parametrize("end_with, exit_code, reason", [("exit 3", 3, "exit"),
                                                         ("kill -9 $$", -9, "oom")])  # a signal stays a signal
def test_a_run_that_failed_while_no_runner_was_alive_is_recorded_with_its_exit_status(tmp_path, runners, end_with,
                                                                                      exit_code, reason):
    crashed = Crashed(tmp_path, runners, END_WITH=end_with)
    crashed.finish_while_away()
    done = autotune("resume", crashed.dir, "-q", environ=crashed.env)
    assert done.returncode == 1, done.stderr
    assert crashed.attempts() == [(1, State.FAILED)]
    recorded = latest(crashed.dir)["a_x0"]
    assert (recorded.exit_code, recorded.reason) == (exit_code, reason)
    assert launches(crashed.log) == [("a_x0", 1)]


def test_an_adopted_run_is_timed_out_counting_from_its_recorded_start(tmp_path, runners):
    crashed = Crashed(tmp_path, runners, "--timeout", 600)
    # As if the dead runner had started it an hour ago: its 600 s are long spent. Counted from the adoption
    # instead, it would run 600 s more (and the finish() below would give up).
    with sqlite3.connect(crashed.dir / "ledger.sqlite") as db:
        db.execute("UPDATE attempts SET started_at = started_at - 3600, launched_at = launched_at - 3600")
    code, out, err = finish(crashed.resume())
    assert code == 1, (out, err)
    recorded = latest(crashed.dir)["a_x0"]
    assert (recorded.attempt, recorded.state, recorded.reason) == (1, State.TIMED_OUT, "timeout")
    assert launches(crashed.log) == [("a_x0", 1)]
    assert tagged_pids(crashed.sweep) == []


def test_cancel_ends_an_adopted_run(tmp_path, runners):
    crashed = Crashed(tmp_path, runners)
    proc = crashed.resume()
    done = autotune("cancel", crashed.dir, environ=crashed.env)
    assert done.returncode == 0, done.stderr
    code, out, err = finish(proc)
    assert code == 1, (out, err)
    assert crashed.attempts() == [(1, State.CANCELLED)]
    assert launches(crashed.log) == [("a_x0", 1)]
    assert tagged_pids(crashed.sweep) == []


def test_ctrl_c_interrupts_an_adopted_run_and_the_next_resume_runs_it(tmp_path, runners):
    crashed = Crashed(tmp_path, runners)
    proc = crashed.resume()
    proc.send_signal(signal.SIGINT)
    code, out, err = finish(proc)
    assert code == 130, (out, err)
    assert tagged_pids(crashed.sweep) == []
    crashed.gate.touch()
    done = autotune("resume", crashed.dir, "-q", environ=crashed.env)
    assert done.returncode == 0, done.stderr
    assert crashed.attempts() == [(1, State.INTERRUPTED), (2, State.SUCCEEDED)]
    assert launches(crashed.log) == [("a_x0", 1), ("a_x0", 2)]


def test_the_wrapper_keeps_the_grace_period_and_records_how_the_launcher_ended(tmp_path):
    """SIGTERM to the group reaches the launcher; the wrapper outlives it, records its status, ends alike."""
    import os
    import subprocess

    from autotuner.backends import exitstatus

    status = tmp_path / "exit_status"
    launcher = "trap 'sleep 0.3; echo bye; exit 7' TERM; echo ready; while :; do sleep 0.05 >/dev/null; done"
    proc = subprocess.Popen(exitstatus.wrapped(["sh", "-c", launcher], status), start_new_session=True,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert (out, proc.returncode, exitstatus.read(status)) == ("bye\n", 7, 7)
    killed = subprocess.run(exitstatus.wrapped(["sh", "-c", "kill -SEGV $$"], status))
    assert (killed.returncode, exitstatus.read(status)) == (-signal.SIGSEGV, 128 + signal.SIGSEGV)


def test_an_attempt_keeps_its_own_exit_status_and_drops_one_that_tells_our_stop(tmp_path, runners):
    """A successor judges an attempt by its recorded exit status only if the attempt ended on its own: the
    status of a run we cancelled says how we ended it (should the ledger have failed to record the cancel)."""
    spec = write_sweep(tmp_path, [0, 1], name="a")
    launcher = write_launcher(tmp_path, PREAMBLE + 'if [ "$name" = a_x1 ]; then sleep 600; fi\n' + WRITE_METRICS)
    out = tmp_path / "out"
    proc = runners.start("run", spec, "--slots", 2, "--launcher", launcher, "-o", out, "-q", "--grace", 1,
                         environ=env(LAUNCH_LOG=tmp_path / "launches.log"), directory=out)
    wait_until(lambda: latest(out).get("a_x0") and latest(out)["a_x0"].state == State.SUCCEEDED
               and "a_x1" in launched(out), message="a_x0 done, a_x1 running")
    assert autotune("cancel", out, "a_x1").returncode == 0
    code, _, err = finish(proc)
    assert code == 1, err
    assert {n: a.state for n, a in latest(out).items()} == {"a_x0": State.SUCCEEDED, "a_x1": State.CANCELLED}
    assert (out / "a_x0" / "exit_status").read_text() == "0\n"
    assert not (out / "a_x1" / "exit_status").exists()


def test_a_status_cut_short_is_no_status():
    """The wrapper writes its status with one builtin printf; a reader trusts only a whole line, so a wrapper
    killed mid-write leaves "no status" (interrupted, run again), never a wrong one."""
    assert [exitstatus.parse(text) for text in ("0\n", "137\n", "", "13", "x\n")] == [0, 137, None, None, None]


def test_a_running_attempt_on_slots_not_its_own_is_ended_and_run_again(tmp_path, runners):
    """A ledger edited by hand (or damaged) that records a running attempt on a slot the sweep does not have:
    resume ends it and runs it again instead of failing with a traceback."""
    crashed = Crashed(tmp_path, runners)
    with sqlite3.connect(crashed.dir / "ledger.sqlite") as db:
        db.execute("""UPDATE attempts SET slots = '{"localhost": [7]}' WHERE name = 'a_x0'""")
    proc = crashed.runners.start("resume", crashed.dir, "-q", "--grace", 1, environ=crashed.env,
                                 directory=crashed.dir)
    wait_until(lambda: ("a_x0", 2) in launches(crashed.log), message="a_x0 run again")
    crashed.gate.touch()
    code, out, err = finish(proc)
    assert code == 0, (out, err)
    assert "Traceback" not in err and "ended and queued again" in err
    assert crashed.attempts() == [(1, State.INTERRUPTED), (2, State.SUCCEEDED)]
    assert tagged_pids(crashed.sweep) == []
