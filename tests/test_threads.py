"""Owned threads: joined on close, failures logged rather than printed."""
from __future__ import annotations

import logging
import threading

from autotuner.threads import Workers


def test_close_joins_every_thread():
    workers = Workers("test")
    release = threading.Event()
    done = []
    for i in range(3):
        workers.start(f"t{i}", lambda i=i: (release.wait(), done.append(i)))
    assert len(workers.running()) == 3
    release.set()
    assert workers.close(timeout=10) == []
    assert sorted(done) == [0, 1, 2]
    assert workers.running() == []


def test_a_failure_is_logged_with_its_thread_and_not_printed(caplog, capsys):
    workers = Workers("owner")
    with caplog.at_level(logging.ERROR, logger="autotuner"):
        workers.start("boom", lambda: 1 / 0)
        workers.close(timeout=10)
    assert "owner-boom" in caplog.text and "ZeroDivisionError" in caplog.text
    assert capsys.readouterr().err == ""


def test_close_names_threads_that_do_not_end_in_time(caplog):
    workers = Workers("slow")
    release = threading.Event()
    workers.start("stuck", release.wait)
    with caplog.at_level(logging.WARNING, logger="autotuner"):
        assert workers.close(timeout=0.05) == ["slow-stuck"]
    assert "slow-stuck" in caplog.text
    release.set()
    assert workers.close(timeout=10) == []
