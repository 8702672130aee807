"""How an attempt's outcome reads once a stop was asked for it (shared by the local and the SSH executor)."""
from pathlib import Path

from autotuner.core import Reservation, Run
from autotuner.outcome import Outcome
from autotuner.states import State
from autotuner.stops import Stops

from helpers import experiment

KEY = ("e", 1)
KILLED_BY_SIGTERM = Outcome(State.FAILED, "exit", "exit status -15", -15)


def test_no_request_keeps_the_judged_outcome():
    assert Stops().settle(KEY, KILLED_BY_SIGTERM) == KILLED_BY_SIGTERM


def test_the_first_request_wins_and_is_settled_once():
    stops = Stops()
    stops.ask(KEY, State.CANCELLED, "cancelled while running")
    stops.ask(KEY, State.TIMED_OUT, "ran past its timeout", "timeout")  # the timer firing after the cancel
    cancelled = Outcome(State.CANCELLED, State.CANCELLED, "cancelled while running", -15)
    assert stops.settle(KEY, KILLED_BY_SIGTERM) == cancelled
    assert not stops.asked(KEY) and stops.settle(KEY, KILLED_BY_SIGTERM) == KILLED_BY_SIGTERM


def test_a_success_before_the_stop_arrived_and_a_lost_host_keep_their_outcome():
    stops = Stops()
    done = Outcome(State.SUCCEEDED, exit_code=0, metrics={"throughput": 2.0})
    stops.ask(KEY, State.CANCELLED, "too late")
    assert stops.settle(KEY, done) == done
    lost = Outcome(State.INTERRUPTED, "lost", "host b lost")
    stops.ask(KEY, State.CANCELLED, "cancelled")
    assert stops.settle(KEY, lost) == lost


def test_kill_all_marks_running_ones_interrupted_not_judged_by_their_exit():
    stops = Stops()
    stops.kill_all([KEY])
    assert stops.killing
    assert stops.settle(KEY, Outcome(State.FAILED, "oom", "killed by SIGKILL", -9)).state == State.INTERRUPTED


class Sleeper:
    """Stands in for a process that ends only when ended: `wait` times out until `end` is called."""

    def __init__(self):
        self.waits, self.ended = [], False

    def wait(self, timeout=None):
        self.waits.append(timeout)
        if not self.ended and timeout is not None:
            raise TimeoutError
        return -15


def _run(timeout):
    return Run(experiment("e", timeout=timeout), 1, Reservation.of({"h": [0]}), "t.e.1", Path("/nowhere"))


def test_the_timeout_counts_from_the_start_adopted_or_not_and_ends_the_attempt_once():
    stops, proc = Stops(), Sleeper()
    run = _run(timeout=None)
    ends = []

    def end():
        ends.append(1)
        proc.ended = True

    # The sweep's default applies; the start was 70 s ago (an adopted run): 30 s are left.
    code = stops.wait(run, proc, since=30.0, default_timeout=100.0, clock=lambda: 100.0, end=end)
    assert code == -15 and proc.waits == [30.0, None] and ends == [1]
    assert stops.settle(run.key, Outcome(State.FAILED, "exit", "exit status -15", -15)) == Outcome(
        State.TIMED_OUT, "timeout", "ran past its timeout of 100 s", -15)


def test_an_experiments_own_timeout_wins_and_no_timeout_waits_without_limit():
    proc = Sleeper()
    proc.ended = True
    Stops().wait(_run(timeout=5.0), proc, since=0.0, default_timeout=100.0, clock=lambda: 1.0, end=lambda: None)
    Stops().wait(_run(timeout=None), proc, since=0.0, default_timeout=None, clock=lambda: 1.0, end=lambda: None)
    assert proc.waits == [4.0, None]
