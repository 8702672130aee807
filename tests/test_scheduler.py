"""The real-time dispatcher (dispatcher + its thread loop) driven by a hand-operated executor (a stand-in for
processes, named as such)."""
import itertools
import queue
import threading
import time

from autotuner.core import Cancel, Finished, HostBack, HostLost, Interrupt, Launched, Queued, Scheduler, SlotPool
from autotuner.core.outcome import Outcome
from autotuner.ledger.store import Ledger
from autotuner.states import Reason, State
from autotuner.sweep.dispatcher import Dispatcher

from helpers import SWEEP_META, experiment


class ManualExecutor:
    """Stand-in executor: records starts; the test decides when and how each run ends."""

    def __init__(self):
        self.started = queue.Queue()
        self.stopped = []
        self.post = None
        self.pids = itertools.count(1000)

    def start(self, run, post):
        self.post = post
        post(Launched(run, next(self.pids), 29500, 0.0))
        self.started.put(run)

    def stop(self, run, state, detail, reason=None):
        self.stopped.append((run.experiment.name, state))
        self.post(Finished(run, Outcome(state, reason or state, detail), 0.0))

    def next_started(self):
        return self.started.get(timeout=5)

    def finish(self, run, outcome=None):
        self.post(Finished(run, outcome or Outcome(State.SUCCEEDED, metrics={"throughput": 1.0}), 0.0))


def run_in_thread(dispatcher):
    """The dispatcher on a thread of its own, as the runner runs it; what it raised, in `.errors`."""
    errors = []

    def target():
        try:
            dispatcher.run()
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=target, name="dispatcher", daemon=True)
    thread.errors = errors
    thread.start()
    return thread


def wait_for(condition, timeout=5.0):
    """The dispatcher works on its own thread: give it a moment to get there."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def make(tmp_path, exps, slots, retries=1):
    ledger = Ledger.create(tmp_path, SWEEP_META)
    ledger.add_experiments(exps, at=0.0)
    executor = ManualExecutor()
    clock = itertools.count(1).__next__
    scheduler = Scheduler(ledger, SlotPool(slots), "sid", tmp_path, "throughput", retries=retries)
    scheduler.submit(Queued(e, 1) for e in exps)
    return ledger, executor, Dispatcher(scheduler, executor, lambda: float(clock()))


def test_free_slots_are_filled_at_once_and_everything_finishes(tmp_path):
    exps = [experiment(f"e{i}") for i in range(5)]
    _ledger, executor, dispatcher = make(tmp_path, exps, {"h": [0, 1]})
    thread = run_in_thread(dispatcher)
    first, second = executor.next_started(), executor.next_started()
    assert {r.reservation.as_dict()["h"][0] for r in (first, second)} == {0, 1}
    assert executor.started.empty()
    executor.finish(first)
    third = executor.next_started()
    assert third.reservation == first.reservation  # the freed slot, reused at once
    executor.finish(second)
    executor.finish(third)
    executor.finish(executor.next_started())
    executor.finish(executor.next_started())
    thread.join(5)
    assert not thread.is_alive() and not thread.errors
    reader = Ledger.open(tmp_path)
    assert [a.state for a in reader.latest()] == [State.SUCCEEDED] * 5
    assert all(a.pid and a.tag == f"sid.{a.name}.1" for a in reader.latest())


def test_transient_failures_are_retried_deterministic_ones_are_not(tmp_path):
    exps = [experiment("flaky"), experiment("oom")]
    _ledger, executor, dispatcher = make(tmp_path, exps, {"h": [0, 1]}, retries=1)
    thread = run_in_thread(dispatcher)
    runs = {r.experiment.name: r for r in (executor.next_started(), executor.next_started())}
    executor.finish(runs["oom"], Outcome(State.FAILED, "oom", "CUDA out of memory", 1))
    executor.finish(runs["flaky"], Outcome(State.FAILED, "launch", "Address already in use", 1))
    retry = executor.next_started()
    assert (retry.experiment.name, retry.attempt) == ("flaky", 2)
    executor.finish(retry, Outcome(State.FAILED, "launch", "Address already in use", 1))  # retries used up
    thread.join(5)
    reader = Ledger.open(tmp_path)
    assert [(a.name, a.attempt, a.state, a.reason) for a in reader.attempts()] == [
        ("flaky", 1, State.FAILED, "launch"), ("flaky", 2, State.FAILED, "launch"), ("oom", 1, State.FAILED, "oom")]


def test_cancel_named_experiments_running_and_queued(tmp_path):
    exps = [experiment(f"e{i}") for i in range(4)]
    _ledger, executor, dispatcher = make(tmp_path, exps, {"h": [0]})
    thread = run_in_thread(dispatcher)
    executor.next_started()  # e0
    dispatcher.post(Cancel(("e0", "e2")))
    e1 = executor.next_started()
    assert e1.experiment.name == "e1"
    executor.finish(e1)
    executor.finish(executor.next_started())  # e3: e2 was cancelled while queued
    thread.join(5)
    assert executor.stopped == [("e0", State.CANCELLED)]
    assert {a.name: a.state for a in Ledger.open(tmp_path).latest()} == {
        "e0": State.CANCELLED, "e1": State.SUCCEEDED, "e2": State.CANCELLED, "e3": State.SUCCEEDED}


def test_interrupt_ends_running_and_leaves_queued_for_resume(tmp_path):
    exps = [experiment(f"e{i}") for i in range(3)]
    _ledger, executor, dispatcher = make(tmp_path, exps, {"h": [0]})
    thread = run_in_thread(dispatcher)
    executor.next_started()
    dispatcher.post(Interrupt())
    thread.join(5)
    assert not thread.is_alive()
    assert dispatcher.scheduler.stopping == State.INTERRUPTED
    assert [a.state for a in Ledger.open(tmp_path).latest()] == [State.INTERRUPTED, State.QUEUED, State.QUEUED]


def test_an_experiment_that_can_no_longer_fit_fails_instead_of_hanging(tmp_path):
    exps = [experiment("two-nodes", num_nodes=2)]
    _ledger, _executor, dispatcher = make(tmp_path, exps, {"a": [0], "b": [0]})
    dispatcher.scheduler.pool.mark_down("b")
    thread = run_in_thread(dispatcher)
    thread.join(5)
    a = Ledger.open(tmp_path).latest()[0]
    assert (a.state, a.reason) == (State.FAILED, "placement")


def test_a_lost_host_interrupts_its_runs_requeues_them_elsewhere_and_is_used_again_when_back(tmp_path):
    exps = [experiment(f"e{i}") for i in range(3)]
    _ledger, executor, dispatcher = make(tmp_path, exps, {"a": [0], "b": [0]})
    thread = run_in_thread(dispatcher)
    runs = {r.reservation.hosts[0]: r for r in (executor.next_started(), executor.next_started())}
    dispatcher.post(HostLost("a", "no answer"))
    wait_for(lambda: executor.stopped)
    assert executor.stopped == [(runs["a"].experiment.name, State.INTERRUPTED)]
    executor.finish(runs["b"])  # b frees up: the lost run goes first, on b
    again = executor.next_started()
    assert (again.experiment.name, again.attempt, again.reservation.hosts) == (runs["a"].experiment.name, 2, ("b",))
    dispatcher.post(HostBack("a"))
    last = executor.next_started()
    assert last.reservation.hosts == ("a",)
    executor.finish(again)
    executor.finish(last)
    thread.join(5)
    attempts = [(a.name, a.attempt, a.state, a.reason) for a in Ledger.open(tmp_path).attempts()]
    assert (runs["a"].experiment.name, 1, State.INTERRUPTED, "lost") in attempts
    assert [a.state for a in Ledger.open(tmp_path).latest()] == [State.SUCCEEDED] * 3


def test_hosts_down_fail_only_what_no_longer_fits_and_the_rest_still_runs(tmp_path):
    """A 2-node experiment that was overtaken to its limit must not hold the queue once a host is lost."""
    exps = [experiment("big", num_nodes=2)] + [experiment(f"s{i}") for i in range(4)]
    _ledger, executor, dispatcher = make(tmp_path, exps, {"a": [0], "b": [0]})
    dispatcher.scheduler._queue.max_bypass = 1
    thread = run_in_thread(dispatcher)
    first = executor.next_started()  # big: both slots
    assert first.experiment.name == "big"
    dispatcher.post(HostLost("b", "no answer"))
    wait_for(lambda: executor.stopped)
    for _ in range(4):  # big is queued again first, cannot fit on a alone: the small ones run there
        executor.finish(executor.next_started())
    thread.join(5)
    assert not thread.is_alive()
    latest = {a.name: (a.state, a.reason) for a in Ledger.open(tmp_path).latest()}
    assert latest == {"big": (State.FAILED, "placement"), "s0": (State.SUCCEEDED, None), "s1": (State.SUCCEEDED, None),
                      "s2": (State.SUCCEEDED, None), "s3": (State.SUCCEEDED, None)}


def test_an_observer_that_raises_is_left_out_with_one_note_and_the_sweep_goes_on(tmp_path):
    exps = [experiment(f"e{i}") for i in range(3)]
    _ledger, executor, dispatcher = make(tmp_path, exps, {"h": [0]})
    told, notes = [], []

    def broken(what, subject, outcome):
        raise BrokenPipeError(32, "Broken pipe")

    dispatcher.observers = [broken, lambda *note: told.append(note[0])]
    dispatcher.log = notes.append
    thread = run_in_thread(dispatcher)
    for _ in exps:
        executor.finish(executor.next_started())
    thread.join(5)
    assert not thread.is_alive() and not thread.errors
    assert notes == ["note: broken failed (BrokenPipeError: [Errno 32] Broken pipe); left out, the sweep goes on"]
    assert told == ["started", "finished"] * 3  # the other observer heard everything
    assert [a.state for a in Ledger.open(tmp_path).latest()] == [State.SUCCEEDED] * 3


def test_an_error_in_the_dispatcher_ends_and_records_what_runs_before_it_is_raised(tmp_path):
    exps = [experiment(f"e{i}") for i in range(3)]
    _ledger, executor, dispatcher = make(tmp_path, exps, {"h": [0, 1]})
    thread = run_in_thread(dispatcher)
    executor.next_started(), executor.next_started()
    dispatcher.post(object())  # a bug: an event nobody handles
    thread.join(5)
    assert not thread.is_alive()
    assert [type(e) for e in thread.errors] == [TypeError]
    assert sorted(executor.stopped) == [("e0", State.INTERRUPTED), ("e1", State.INTERRUPTED)]
    latest = {a.name: a.state for a in Ledger.open(tmp_path).latest()}
    # nothing new started; resume goes on
    assert latest == {"e0": State.INTERRUPTED, "e1": State.INTERRUPTED, "e2": State.QUEUED}
    assert executor.started.empty()


def test_observers_are_told_what_runs_again_and_why_right_after_it_finished(tmp_path):
    """The retry decision is the dispatcher's alone: a "requeued" note names the new attempt and carries the
    ended attempt's outcome; a deterministic failure, or a transient one with no retry left, gets none."""
    exps = [experiment("flaky"), experiment("oom"), experiment("moved")]
    _ledger, executor, dispatcher = make(tmp_path, exps, {"a": [0, 1], "b": [0]}, retries=1)
    told = []
    dispatcher.observers = [lambda what, subject, outcome: told.append((what, subject, outcome))]
    thread = run_in_thread(dispatcher)
    runs = {r.experiment.name: r for r in (executor.next_started() for _ in exps)}
    launch = Outcome(State.FAILED, Reason.LAUNCH, "Address already in use", 1)
    executor.finish(runs["oom"], Outcome(State.FAILED, Reason.OOM, "CUDA out of memory", 1))
    executor.finish(runs["flaky"], launch)
    retry = executor.next_started()
    executor.finish(retry, launch)  # retries used up: finished, not queued again
    wait_for(lambda: any(w == "finished" and s.key == ("flaky", 2) for w, s, _ in told))
    dispatcher.post(HostLost(runs["moved"].reservation.hosts[0], "no answer"))
    executor.finish(executor.next_started())  # moved, attempt 2, on the host still up
    thread.join(5)
    assert not thread.is_alive() and not thread.errors
    requeued = [(s.experiment.name, s.attempt, o.state, o.reason) for w, s, o in told if w == "requeued"]
    assert requeued == [("flaky", 2, State.FAILED, Reason.LAUNCH), ("moved", 2, State.INTERRUPTED, Reason.LOST)]
    for name in ("flaky", "moved"):  # each right after its attempt's "finished"
        i = next(i for i, (w, s, _) in enumerate(told) if w == "requeued" and s.experiment.name == name)
        assert told[i - 1][0] == "finished" and told[i - 1][1].key == (name, 1)
        assert isinstance(told[i][1], Queued) and told[i][2] is told[i - 1][2]
