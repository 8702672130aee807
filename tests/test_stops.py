"""How an attempt's outcome reads once a stop was asked for it (shared by the local and the SSH executor)."""
from pathlib import Path

from autotuner.backends.stops import Stops
from autotuner.core import Reservation, Run
from autotuner.core.outcome import Outcome
from autotuner.states import State

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


class Waiter:
    """Stands in for a process: `wait` returns its status at once."""

    def __init__(self):
        self.waits = []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        return -15


def _run():
    return Run(experiment("e"), 1, Reservation.of({"h": [0]}), "t.e.1", Path("/nowhere"))


def test_a_stop_asked_while_the_attempt_was_being_launched_is_carried_out_before_the_wait():
    stops, proc, ends = Stops(), Waiter(), []
    stops.ask(KEY, State.TIMED_OUT, "ran past its timeout of 5 s", "timeout")
    assert stops.wait(_run(), proc, end=lambda: ends.append(1)) == -15
    assert ends == [1] and proc.waits == [None]


def test_with_no_stop_asked_the_wait_is_plain():
    stops, proc, ends = Stops(), Waiter(), []
    assert stops.wait(_run(), proc, end=lambda: ends.append(1)) == -15
    assert ends == [] and proc.waits == [None]
