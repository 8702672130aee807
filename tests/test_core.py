"""The pure scheduling core, driven by scripted event lists: no threads, no clock, no processes."""

import pytest

from autotuner.core import (
    Cancel,
    Deadline,
    Finished,
    Interrupt,
    Launched,
    Stop,
)
from autotuner.core.outcome import Outcome
from autotuner.states import Reason, State

from helpers import core, experiment

OK = Outcome(State.SUCCEEDED, metrics={"throughput": 1.0})


def names(runs):
    return [r.experiment.name for r in runs]


def test_a_step_places_what_fits_and_a_finish_frees_the_slot_for_the_next():
    s = core([experiment("a"), experiment("b")])
    first = s.step([], 0.0)
    assert names(first.start) == ["a"] and [n.what for n in first.notes] == ["started"]
    assert s.step([Launched(first.start[0], 10, None, 0.5)], 1.0).start == []
    second = s.step([Finished(first.start[0], OK, 2.0)], 2.0)
    assert names(second.start) == ["b"] and second.start[0].reservation == first.start[0].reservation
    assert [n.what for n in second.notes] == ["finished", "started"]
    s.step([Finished(second.start[0], OK, 3.0)], 3.0)
    assert s.done and s.record.finished == {("a", 1): (State.SUCCEEDED, 2.0), ("b", 1): (State.SUCCEEDED, 3.0)}


def test_an_attempts_timeout_is_a_timer_counted_from_its_launch():
    s = core([experiment("a")], timeout=100.0)
    run = s.step([], 0.0).start[0]
    assert s.wake() is None  # not launched yet: nothing to count from
    s.step([Launched(run, 10, None, 5.0)], 5.0)
    assert s.wake() == 105.0
    assert s.step([], 104.9).stop == []
    actions = s.step([], 105.0)
    assert actions.stop == [Stop(run, State.TIMED_OUT, "ran past its timeout of 100 s", Reason.TIMEOUT)]
    assert s.wake() is None and s.step([], 200.0).stop == []  # fired once
    ended = Outcome(State.TIMED_OUT, Reason.TIMEOUT, "ran past its timeout of 100 s", -15)
    s.step([Finished(run, ended, 106.0)], 106.0)
    assert s.done and s.record.finished[("a", 1)] == (State.TIMED_OUT, 106.0)


def test_an_experiments_own_timeout_wins_and_none_means_no_timer():
    s = core([experiment("own", timeout=5.0), experiment("none")], slots={"h": [0, 1]}, timeout=None)
    runs = {r.experiment.name: r for r in s.step([], 0.0).start}
    s.step([Launched(runs["own"], 1, None, 1.0), Launched(runs["none"], 2, None, 1.0)], 1.0)
    assert s.wake() == 6.0
    assert [stop.run.experiment.name for stop in s.step([], 6.0).stop] == ["own"]
    assert s.wake() is None


def test_a_timer_of_a_run_that_already_ended_never_fires():
    s = core([experiment("a"), experiment("b")], timeout=10.0)
    a = s.step([], 0.0).start[0]
    s.step([Launched(a, 1, None, 0.0)], 0.0)
    b = s.step([Finished(a, OK, 3.0)], 3.0).start[0]
    s.step([Launched(b, 2, None, 3.0)], 3.0)
    assert s.wake() == 13.0  # a's timer (due at 10) was dropped
    assert [stop.run for stop in s.step([], 13.0).stop] == [b]


def test_an_adopted_run_counts_its_timeout_from_its_recorded_start():
    s = core([], timeout=100.0)
    e = experiment("left")
    run = s.adopt(e, 3, {"h": [0]}, since=30.0)
    assert run is not None and run.attempt == 3 and s.wake() == 130.0
    assert s.adopt(experiment("twice"), 1, {"h": [0]}, since=0.0) is None  # its slot is held already
    assert [n.what for n in s.step([], 31.0).notes] == ["adopted"]


def test_the_deadline_is_a_timer_that_ends_what_runs_and_leaves_the_queue_for_resume():
    s = core([experiment("a"), experiment("b")], deadline=50.0)
    a = s.step([], 0.0).start[0]
    assert s.wake() == 50.0
    actions = s.step([], 50.0)
    assert actions.stop == [Stop(a, State.TIMED_OUT, "the sweep's deadline passed", Reason.TIMEOUT)]
    assert s.stopping == State.TIMED_OUT and not s.done
    assert s.step([Finished(a, Outcome(State.TIMED_OUT, Reason.TIMEOUT, "deadline"), 51.0)], 51.0).start == []
    assert s.done and names(s.waiting()) == ["b"]


def test_a_posted_deadline_does_the_same():
    s = core([experiment("a")])
    a = s.step([], 0.0).start[0]
    assert [stop.state for stop in s.step([Deadline()], 1.0).stop] == [State.TIMED_OUT]
    s.step([Finished(a, OK, 2.0)], 2.0)
    assert s.done


def test_a_cancel_handed_to_the_first_step_comes_before_anything_is_placed():
    s = core([experiment("a"), experiment("b")])
    actions = s.step([Cancel(("a",))], 0.0)
    assert names(actions.start) == ["b"]
    assert s.record.finished[("a", 1)] == (State.CANCELLED, 0.0)


def stopping_notes(actions):
    return [(n.subject, n.outcome) for n in actions.notes if n.what == "stopping"]


def test_observers_are_told_once_that_the_sweep_stops_and_why():
    """Ctrl-C, the deadline, a cancel of the whole sweep: a view learns it winds down (and stops its ETA)."""
    s = core([experiment("a"), experiment("b")], deadline=50.0)
    a = s.step([], 0.0).start[0]
    interrupted = s.step([Interrupt()], 1.0)
    assert stopping_notes(interrupted) == [("sid", Outcome(State.INTERRUPTED, None, "interrupted by the user"))]
    assert [n.what for n in interrupted.notes] == ["stopping"] and interrupted.stop[0].run == a
    assert stopping_notes(s.step([Cancel()], 2.0)) == [] and stopping_notes(s.step([], 50.0)) == []  # told once
    timed = core([experiment("a")], deadline=50.0)
    timed.step([], 0.0)
    assert stopping_notes(timed.step([], 50.0)) == [
        ("sid", Outcome(State.TIMED_OUT, Reason.TIMEOUT, "the sweep's deadline passed"))]
    cancelled = core([experiment("a"), experiment("b")])
    cancelled.step([], 0.0)
    assert stopping_notes(cancelled.step([Cancel(("b",))], 1.0)) == []  # one experiment: the sweep goes on
    assert stopping_notes(cancelled.step([Cancel()], 2.0)) == [
        ("sid", Outcome(State.CANCELLED, Reason.CANCELLED, "the whole sweep was cancelled"))]


class CountingSearcher:
    """A stand-in searcher: proposes `batch` experiments at a time until it has proposed `total`."""

    def __init__(self, total, batch):
        self.total, self.batch, self.proposed, self.seen, self.asked = total, batch, 0, [], []

    def propose(self, free_slots, now):
        self.asked.append((free_slots, now))
        count = min(self.batch, self.total - self.proposed)
        new = [experiment(f"t{self.proposed + i}") for i in range(count)]
        self.proposed += count
        return new

    def observe(self, run, outcome):
        self.seen.append((run.experiment.name, outcome.state))


def test_a_source_is_asked_for_more_whenever_slots_are_free_and_nothing_waits():
    searcher = CountingSearcher(total=5, batch=5)
    s = core([], slots={"h": [0, 1]}, searcher=searcher)
    first = s.step([], 0.0)
    assert names(first.start) == ["t0", "t1"] and searcher.asked == [(2, 0.0)]
    second = s.step([Finished(first.start[0], OK, 1.0)], 1.0)  # t2..t4 were queued: no need to ask
    assert names(second.start) == ["t2"] and searcher.asked == [(2, 0.0)]
    assert searcher.seen == [("t0", State.SUCCEEDED)]
    running = [first.start[1], second.start[0]]
    for t, run in enumerate(running, start=2):
        running += s.step([Finished(run, OK, float(t))], float(t)).start
    assert s.done and searcher.proposed == 5 and len(searcher.seen) == 5


def test_a_source_with_nothing_to_propose_ends_the_sweep_once_nothing_runs():
    s = core([], searcher=CountingSearcher(total=0, batch=1))
    assert s.step([], 0.0).start == [] and s.done


def test_abort_stops_what_runs_and_wind_down_records_each_end():
    s = core([experiment("a"), experiment("b"), experiment("c")], slots={"h": [0, 1]})
    a, b = s.step([], 0.0).start
    actions = s.abort(RuntimeError("disk"), 0.5, unstarted=[b])  # b was placed but never handed to an executor
    assert [stop.run for stop in actions.stop] == [a] and s.stopping == State.INTERRUPTED
    assert s.record.stops == {("a", 1): (State.INTERRUPTED, Reason.INTERRUPTED, 0.5)}  # recorded where it can be
    notes = s.wind_down([Finished(a, Outcome(State.INTERRUPTED, Reason.INTERRUPTED, "x"), 1.0)], 1.0).notes
    assert [n.what for n in notes] == ["finished"] and not s.busy


def test_an_unknown_event_is_a_bug_and_raises():
    with pytest.raises(TypeError):
        core([experiment("a")]).step([object()], 0.0)


def test_a_source_is_told_only_final_ends_and_of_what_was_cancelled_before_it_started():
    """A transient failure the scheduler retries is not the searcher's answer (it would give up a stage on a
    port clash): only the retry's end is told. A proposal cancelled while it waited is told too, or the
    searcher would count it as out for ever."""
    searcher = CountingSearcher(total=3, batch=3)
    s = core([], slots={"h": [0]}, searcher=searcher, retries=1)
    (t0,) = s.step([], 0.0).start
    launch_failed = Outcome(State.FAILED, Reason.LAUNCH, "address already in use")
    (retry,) = s.step([Finished(t0, launch_failed, 1.0)], 1.0).start
    assert retry.experiment.name == "t0" and retry.attempt == 2 and searcher.seen == []
    s.step([Cancel(("t2",))], 1.5)  # t2 waited in the queue
    assert searcher.seen == [("t2", State.CANCELLED)]
    s.step([Finished(retry, OK, 2.0)], 2.0)
    assert searcher.seen == [("t2", State.CANCELLED), ("t0", State.SUCCEEDED)]
