"""A stop the runner began is recorded before its signal, and judged as that stop whoever sees the attempt end
(issue 38): this runner, a runner that adopts the attempt after this one died in the middle of the stop, or
`cancel` with no runner alive. The core's part, driven by scripted events; the end-to-end part, with a stand-in
that holds the runner between the signal and the attempt's end, in test_recorded_stops_cli.py."""

import pytest

from autotuner.core import (
    Cancel,
    Deadline,
    Finished,
    HostLost,
    Interrupt,
    Launched,
)
from autotuner.core.outcome import Outcome, StopAsked
from autotuner.errors import UserError
from autotuner.ledger.store import Ledger
from autotuner.states import Reason, State
from autotuner.sweep.dispatcher import Dispatcher

from helpers import SWEEP_META, core, experiment

OK = Outcome(State.SUCCEEDED, exit_code=0, metrics={"throughput": 1.0})
BY_SIGTERM = Outcome(State.FAILED, Reason.EXIT, "exit status -15", -15)  # how a stopped run's end is judged alone


def running(**options):
    """A one-slot sweep of experiment `a`, launched at 1.0; returns the scheduler and its run."""
    s = core([experiment("a")], **options)
    (run,) = s.step([], 0.0).start
    s.step([Launched(run, 10, None, 1.0)], 1.0)
    return s, run


# Each kind of stop: the event (or the time) that asks for it, and what the record says of it.
KINDS = {
    "interrupt": ([Interrupt()], 5.0, (State.INTERRUPTED, Reason.INTERRUPTED)),
    "cancel": ([Cancel(("a",))], 5.0, (State.CANCELLED, Reason.CANCELLED)),
    "cancel_all": ([Cancel()], 5.0, (State.CANCELLED, Reason.CANCELLED)),
    "timeout": ([], 101.0, (State.TIMED_OUT, Reason.TIMEOUT)),
    "deadline": ([Deadline()], 5.0, (State.TIMED_OUT, Reason.TIMEOUT)),
    "lost_host": ([HostLost("h", "no answer")], 5.0, (State.INTERRUPTED, Reason.LOST)),
}


@pytest.mark.parametrize("kind", KINDS)
def test_every_stop_is_in_the_record_when_the_step_that_asks_for_it_returns(kind):
    events, at, (state, reason) = KINDS[kind]
    s, run = running(timeout=100.0)
    actions = s.step(events, at)
    assert [(stop.run, stop.state) for stop in actions.stop] == [(run, state)]
    assert s.record.stops == {("a", 1): (state, reason, at)}


def test_the_first_stop_asked_is_the_one_recorded_and_the_one_its_end_is_judged_by():
    s, run = running(timeout=100.0)
    s.step([Cancel(("a",))], 5.0)
    s.step([], 101.0)  # its timer fires while the cancel is under way
    s.step([Interrupt()], 102.0)
    assert s.record.stops == {("a", 1): (State.CANCELLED, Reason.CANCELLED, 5.0)}
    s.step([Finished(run, BY_SIGTERM, 103.0)], 103.0)  # as an executor that had not settled it would post it
    assert s.record.finished == {("a", 1): (State.CANCELLED, 103.0)}


def adopted(stop):
    """A scheduler that adopted attempt 1 of `a`, which the dead runner had asked `stop` for."""
    s = core([], slots={"h": [0]})
    s.record.add_experiments([experiment("a")], 0.0)
    run = s.adopt(experiment("a"), 1, {"h": [0]}, 1.0, stop)
    return s, run


@pytest.mark.parametrize("stop, state, again", [
    (StopAsked.of(State.INTERRUPTED, "interrupted by the user"), State.INTERRUPTED, True),
    (StopAsked.of(State.CANCELLED, "cancelled while running"), State.CANCELLED, False),
    (StopAsked.of(State.TIMED_OUT, "ran past its timeout of 5 s", Reason.TIMEOUT), State.TIMED_OUT, False),
    (StopAsked.of(State.INTERRUPTED, "host h lost: gone", Reason.LOST), State.INTERRUPTED, True),
])
def test_an_adopted_attempt_ended_by_the_dead_runners_stop_is_judged_as_that_stop(stop, state, again):
    s, run = adopted(stop)
    actions = s.step([Finished(run, BY_SIGTERM, 2.0)], 2.0)
    assert s.record.finished[("a", 1)] == (state, 2.0)
    finished = [n.outcome for n in actions.notes if n.what == "finished"]
    assert finished == [Outcome(state, stop.reason, stop.detail, -15)]
    # Interrupted (by the user, or its host lost) runs again at once under the next number; the others are final.
    assert (s.record.attempts["a"] == 2) is again and [r.attempt for r in actions.start] == ([2] if again else [])


def test_an_adopted_attempt_that_succeeded_before_the_stop_reached_it_keeps_its_success():
    s, run = adopted(StopAsked.of(State.CANCELLED, "cancelled while running"))
    s.step([Finished(run, OK, 2.0)], 2.0)
    assert s.record.finished[("a", 1)] == (State.SUCCEEDED, 2.0)


def test_an_adopted_attempt_with_no_stop_recorded_is_judged_by_its_own_end():
    s, run = adopted(None)
    s.step([Finished(run, BY_SIGTERM, 2.0)], 2.0)
    assert s.record.finished[("a", 1)] == (State.FAILED, 2.0)


def test_a_stop_the_new_runner_asks_does_not_replace_the_dead_runners():
    s, run = adopted(StopAsked.of(State.CANCELLED, "cancelled while running"))
    assert s.step([Interrupt()], 2.0).stop  # still asked (the process must end), but not recorded over it
    assert s.record.stops == {}  # the dead runner's is the ledger's already: nothing new is written
    interrupted = Outcome(State.INTERRUPTED, Reason.INTERRUPTED, "interrupted by the user", -15)
    s.step([Finished(run, interrupted, 3.0)], 3.0)  # the executor settled it as its own stop
    assert s.record.finished[("a", 1)] == (State.CANCELLED, 3.0)


def test_a_stop_names_its_states_own_reason_when_it_gives_none():
    assert StopAsked.of(State.TIMED_OUT, "x") == StopAsked(State.TIMED_OUT, "x", Reason.TIMEOUT)
    assert StopAsked.of(State.CANCELLED, "x").settle(BY_SIGTERM) == Outcome(State.CANCELLED, Reason.CANCELLED, "x",
                                                                            -15)
    lost = Outcome(State.INTERRUPTED, Reason.LOST, "host h lost")
    assert StopAsked.of(State.CANCELLED, "x").settle(lost) == lost  # runs again elsewhere, as a live runner does


def test_the_ledger_keeps_the_first_stop_of_each_running_attempt_and_hands_back_those_still_running(tmp_path):
    ledger = Ledger.create(tmp_path, SWEEP_META)
    ledger.add_experiments([experiment("a"), experiment("b")], 0.0)
    for name, slot in (("a", 0), ("b", 0)):
        ledger.start(name, 1, slots={"localhost": [slot]}, tag=f"sid.{name}.1", dir=str(tmp_path / name), at=1.0)
    ledger.stopping("a", 1, State.CANCELLED, Reason.CANCELLED, "cancelled while running", 2.0)
    ledger.stopping("a", 1, State.TIMED_OUT, Reason.TIMEOUT, "ran past its timeout of 1 s", 3.0)  # too late
    ledger.stopping("b", 1, State.INTERRUPTED, Reason.LOST, "host h lost: gone", 2.0)
    assert ledger.stops_asked() == {("a", 1): (State.CANCELLED, "cancelled while running", Reason.CANCELLED),
                                    ("b", 1): (State.INTERRUPTED, "host h lost: gone", Reason.LOST)}
    ledger.finish("b", 1, State.INTERRUPTED, 4.0, reason=Reason.LOST)
    assert list(ledger.stops_asked()) == [("a", 1)]  # only what still runs is asked about
    ledger._db.execute("UPDATE stops SET state = 'paused' WHERE name = 'a'")
    with pytest.raises(UserError, match="stops: a attempt 1 has an unknown state or reason"):
        ledger.stops_asked()
    ledger.close()


class Immediate:
    """An executor whose runs end as soon as they are stopped; it notes what the record held at each stop."""

    def __init__(self, record):
        self.record, self.seen = record, []

    def start(self, run, post):
        post(Launched(run, 1, None, 0.0))

    def stop(self, run, state, detail, reason=None):
        self.seen.append(dict(self.record.stops))
        self.post(Finished(run, Outcome(state, reason, detail, -15), 1.0))

    def close(self):
        pass


def test_the_dispatcher_says_the_stop_is_recorded_only_once_the_step_that_records_it_returned():
    """A second Ctrl-C waits for this (`stop_recorded`) before it kills: what it kills then reads as interrupted."""
    s = core([experiment("a")])
    executor = Immediate(s.record)
    dispatcher = Dispatcher(s, executor, lambda: 0.0)
    executor.post = dispatcher.post
    dispatcher.post(Interrupt())  # handled before anything is placed: nothing runs, nothing to record
    dispatcher.run()
    assert dispatcher.stop_recorded.is_set() and executor.seen == []
    s, _ = running()
    executor = Immediate(s.record)
    dispatcher = Dispatcher(s, executor, lambda: 5.0)
    executor.post = dispatcher.post
    dispatcher.post(Interrupt())
    assert not dispatcher.stop_recorded.is_set()
    dispatcher.run()
    assert dispatcher.stop_recorded.is_set()
    assert executor.seen == [{("a", 1): (State.INTERRUPTED, Reason.INTERRUPTED, 5.0)}]  # recorded before the stop
