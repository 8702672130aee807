"""The one polling watcher every backend's host watch is (backends/watch.py): a real thread asking a look that
the test steers, its events as the scheduler would get them."""
from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence

from autotuner.backends.watch import PollingWatcher
from autotuner.core.events import Event, HostBack, HostLost


class Answers:
    """A look whose answers the test sets: host -> None (answers) or why it is lost; every call recorded."""

    def __init__(self, answers: dict[str, str | None]):
        self.answers = answers
        self.asked: list[list[str]] = []

    def __call__(self, hosts: Sequence[str]) -> Iterator[tuple[str, str | None]]:
        self.asked.append(list(hosts))
        for host in hosts:
            yield host, self.answers.get(host)


def test_lost_and_back_are_posted_once_each_for_the_hosts_every_look_asks():
    answers = Answers({"a": None, "b": None})
    events: queue.Queue[Event] = queue.Queue()
    watcher = PollingWatcher("test-watch", answers, events.put, 0.01, hosts=["a", "b"])
    try:
        answers.answers["b"] = "gone"
        assert events.get(timeout=30) == HostLost("b", "gone")
        answers.answers["b"] = None
        assert events.get(timeout=30) == HostBack("b")
    finally:
        watcher.close()
    assert events.empty()  # one event per change, however many looks saw it
    assert all(asked == ["a", "b"] for asked in answers.asked)


def test_with_no_hosts_only_those_told_lost_are_asked_and_only_their_return_is_posted():
    answers = Answers({"x": "no answer"})
    events: queue.Queue[Event] = queue.Queue()
    looked = threading.Event()
    watcher = PollingWatcher("test-watch", answers, events.put, 0.01, then=looked.set)
    try:
        assert looked.wait(30) and events.empty()  # nothing told lost: nothing asked, nothing posted
        watcher.watch("x")
        looked.clear()
        assert looked.wait(30)
        looked.clear()
        assert looked.wait(30) and events.empty()  # still down: its loss was told, not found, so not posted
        answers.answers["x"] = None
        assert events.get(timeout=30) == HostBack("x")
    finally:
        watcher.close()
    assert ["x"] in answers.asked and all(asked in ([], ["x"]) for asked in answers.asked)


def test_lost_now_watches_what_does_not_answer_without_posting():
    answers = Answers({"a": None, "b": "dead"})
    events: queue.Queue[Event] = queue.Queue()
    watcher = PollingWatcher("test-watch", answers, events.put, 3600, hosts=["a", "b"])
    try:
        assert watcher.lost_now() == ["b"]
        answers.answers["b"] = None
        watcher.check()
    finally:
        watcher.close()
    assert [events.get_nowait()] == [HostBack("b")] and events.empty()


def test_a_transient_error_is_asked_again_and_another_ends_the_thread():
    class Restarting(Exception):
        pass

    failures = iter([Restarting("controller restarting")])
    events: queue.Queue[Event] = queue.Queue()

    def look(hosts: Sequence[str]) -> Iterator[tuple[str, str | None]]:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        yield "a", "lost"

    watcher = PollingWatcher("test-watch", look, events.put, 0.01, hosts=["a"], transient=(Restarting,))
    try:
        assert events.get(timeout=30) == HostLost("a", "lost")  # the look after the failure
    finally:
        watcher.close()

    def broken(hosts: Sequence[str]) -> Iterator[tuple[str, str | None]]:
        raise ValueError("a bug")
        yield  # a generator

    watcher = PollingWatcher("test-watch", broken, events.put, 0.01, hosts=["a"], transient=())
    try:
        for thread in watcher._workers.running():
            thread.join(30)
        assert watcher._workers.running() == []  # the bug ended the thread (logged by Workers), not looped
    finally:
        watcher.close()


def test_close_leaves_a_look_between_hosts():
    events: queue.Queue[Event] = queue.Queue()
    started, release = threading.Event(), threading.Event()
    probed: list[str] = []

    def slow(hosts: Sequence[str]) -> Iterator[tuple[str, str | None]]:
        for host in hosts:
            probed.append(host)
            started.set()
            release.wait(30)
            yield host, "down"

    watcher = PollingWatcher("test-watch", slow, events.put, 0.01, hosts=["a", "b", "c"])
    assert started.wait(30)
    closing = threading.Thread(target=watcher.close)
    closing.start()
    while not watcher._stop.is_set():
        threading.Event().wait(0.01)
    release.set()
    closing.join(30)
    assert not closing.is_alive() and probed == ["a"] and events.empty()
