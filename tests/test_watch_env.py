"""The seconds a backend's host watch waits between looks, set in the environment (`AUTOTUNE_SLURM_POLL`,
`AUTOTUNE_RAY_POLL`): one rule for both, as the README states it. A value that is no number of seconds a wait
can take (`inf`, `1e300`, NaN, negative, a word) is replaced by the default with a warning: `inf` once reached
the watch's `Event.wait`, which raised OverflowError and ended the thread that notices lost nodes."""
from __future__ import annotations

import logging

import pytest

from autotuner.backends.ray import watch as ray_watch
from autotuner.backends.slurm import executor as slurm_executor
from autotuner.backends.slurm import watch as slurm_watch


@pytest.mark.parametrize("backend", [ray_watch, slurm_watch], ids=["ray", "slurm"])
@pytest.mark.parametrize(("value", "seconds"), [("inf", None), ("1e300", None), ("nan", None), ("-5", None),
                                                ("soon", None), ("2.5", 2.5), ("0", 0.1)])
def test_a_poll_interval_from_the_environment_is_a_wait_a_thread_can_take(monkeypatch, caplog, backend, value,
                                                                          seconds):
    monkeypatch.setenv(backend.POLL_ENV, value)
    with caplog.at_level(logging.WARNING, logger="autotuner"):
        interval = backend.poll_interval()
    assert interval == (backend.POLL if seconds is None else seconds)
    warned = [r.getMessage() for r in caplog.records if backend.POLL_ENV in r.getMessage()]
    assert len(warned) == (1 if seconds is None else 0), warned


@pytest.mark.parametrize(("value", "seconds"), [("inf", None), ("soon", None), ("-1", None), ("5", 5.0)])
def test_the_seconds_a_slurm_step_may_go_unlisted_follow_the_same_rule(monkeypatch, caplog, value, seconds):
    """AUTOTUNE_SLURM_STEP_WAIT (how long a new step may go unlisted before the user is told why) reads as the
    poll intervals do."""
    monkeypatch.setenv(slurm_executor.STEP_SHOWS_ENV, value)
    with caplog.at_level(logging.WARNING, logger="autotuner"):
        within = slurm_executor.step_shows_within()
    assert within == (slurm_executor.STEP_SHOWS_WITHIN if seconds is None else seconds)
    assert len([r for r in caplog.records if slurm_executor.STEP_SHOWS_ENV in r.getMessage()]) == (seconds is None)
