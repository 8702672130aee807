"""A stop the runner began, then the runner killed (-9) before the attempt ended: `resume` judges the attempt as
that stop (issue 38). Deterministic, not timing luck: the stand-in traps SIGTERM, says so in a file and then
holds, so the runner is caught between its signal and the attempt's end (its grace is long); the test kills it
there, then lets the stand-in end as a stopped run does (exit 143), and resumes. The same Ctrl-C on every backend
is tests/test_backend_suite.py's."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest

from autotuner.states import Reason, State

from cli_rig import (
    PREAMBLE,
    WRITE_METRICS,
    Runners,
    attempts,
    autotune,
    env,
    finish,
    launched,
    launches,
    runner_alive,
    sweep_id,
    tagged_pids,
    wait_until,
    write_launcher,
    write_sweep,
)

# The first attempt runs until it is stopped: once its trap is set it touches $READY (a stop before that would
# end it at once); on SIGTERM it touches $STOPPED, waits for $RELEASE, and exits 143 (what a script that ends
# on SIGTERM reports). Any later attempt succeeds at once.
HOLDS_ITS_STOP = PREAMBLE + """\
case "$AUTOTUNE_TAG" in
*.1)
    trap 'touch "$STOPPED"; while [ ! -e "$RELEASE" ]; do sleep 0.02; done; exit 143' TERM
    touch "$READY"
    while :; do sleep 0.02; done ;;
esac
""" + WRITE_METRICS


class Stopping:
    """A one-experiment sweep on this machine's one slot whose runner was killed (-9) while the stop it had
    begun was under way."""

    def __init__(self, tmp_path: Path, runners: Runners, *more: object):
        self.dir, self.log = tmp_path / "out", tmp_path / "launches.log"
        self.stopped, self.release = tmp_path / "stopped", tmp_path / "release"
        files = {"LAUNCH_LOG": self.log, "READY": tmp_path / "ready", "STOPPED": self.stopped, "RELEASE": self.release}
        self.env = env()
        self.runners = runners
        spec = write_sweep(tmp_path, [0], name="a")
        launcher = "env " + " ".join(f"{k}={v}" for k, v in files.items()) + " " + write_launcher(tmp_path,
                                                                                                   HOLDS_ITS_STOP)
        self.proc = runners.start("run", spec, "--slots", 1, "--launcher", launcher, "-o", self.dir, "-q",
                                  "--grace", 300, *more, environ=self.env, directory=self.dir)
        self.sweep = wait_until(lambda: sweep_id(self.dir))
        wait_until(lambda: launched(self.dir) == ["a_x0"] and (tmp_path / "ready").exists(), message="a_x0 running")

    def kill_runner_during_the_stop(self) -> None:
        """Once the stand-in got the runner's SIGTERM (the runner now waits out its grace), SIGKILL the runner."""
        wait_until(self.stopped.exists, timeout=60, message="the stand-in got the stop's SIGTERM")
        self.proc.kill()
        self.proc.wait()
        assert runner_alive(self.dir) is None and tagged_pids(self.sweep)  # the stand-in outlived its runner

    def end_while_away(self) -> None:
        self.release.touch()
        wait_until(lambda: (self.dir / "a_x0" / "exit_status").exists() and not tagged_pids(self.sweep),
                   message="a_x0 ended")

    def resume(self, *more: object) -> tuple[int, str, str]:
        return finish(self.runners.start("resume", self.dir, "-q", *more, environ=self.env, directory=self.dir))

    def attempts(self) -> list[tuple[int, str, str | None]]:
        return [(a.attempt, a.state, a.reason) for a in attempts(self.dir)]


def test_sigterm_then_kill_9_with_the_attempt_adopted_while_it_still_holds(tmp_path, runners):
    """The same stop, its attempt still running when the next runner takes over: adopted, and its end (after the
    adoption) read as the dead runner's stop, so it runs again under the next number."""
    stopping = Stopping(tmp_path, runners)
    stopping.proc.send_signal(signal.SIGTERM)
    stopping.kill_runner_during_the_stop()
    proc = runners.start("resume", stopping.dir, "--grace", 300, environ=stopping.env, directory=stopping.dir)
    line = proc.stdout.readline()
    assert line.split()[1:3] == ["adopt", "a_x0"], (line, "" if line else proc.stderr.read())
    stopping.release.touch()
    code, out, err = finish(proc)
    assert code == 0, (out, err)
    assert stopping.attempts() == [(1, State.INTERRUPTED, Reason.INTERRUPTED), (2, State.SUCCEEDED, None)]


def test_a_timeout_then_kill_9_during_the_stop_reads_timed_out(tmp_path, runners):
    stopping = Stopping(tmp_path, runners, "--timeout", 1)
    stopping.kill_runner_during_the_stop()
    stopping.end_while_away()
    # Resumed with a longer timeout: no timer of the new runner's fires on it, only the recorded stop tells.
    code, out, err = stopping.resume("--timeout", 600)
    assert code == 1, (out, err)
    assert stopping.attempts() == [(1, State.TIMED_OUT, Reason.TIMEOUT)]
    assert launches(stopping.log) == [("a_x0", 1)]


@pytest.mark.parametrize("stop", ["interrupt", "cancel"])
def test_cancel_with_no_runner_alive_reads_the_dead_runners_stop_too(tmp_path, runners, stop):
    """No runner takes over: `cancel` ends what is left and records it, judged by the stop under way."""
    stopping = Stopping(tmp_path, runners)
    if stop == "interrupt":
        stopping.proc.send_signal(signal.SIGINT)
    else:
        assert autotune("cancel", stopping.dir, "a_x0", environ=stopping.env).returncode == 0
    stopping.kill_runner_during_the_stop()
    stopping.end_while_away()
    done = autotune("cancel", stopping.dir, environ=stopping.env)
    assert done.returncode == 0, done.stderr
    # Interrupted (then cancelled here, as an unfinished experiment is), or cancelled already: never failed.
    expected = {"interrupt": [(1, State.INTERRUPTED, Reason.INTERRUPTED), (2, State.CANCELLED, Reason.CANCELLED)],
                "cancel": [(1, State.CANCELLED, Reason.CANCELLED)]}[stop]
    assert stopping.attempts() == expected
