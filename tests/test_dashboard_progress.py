"""The dashboard shows each running attempt's steps so far and its metric so far with the 95% interval, live, as the
runner records them (readings are not transitions), and each ended run's interval; a page is sent only the running
rows whose reading changed. The feed read straight, and the page in headless Chromium on a stand-in whose steps
advance.
"""
from __future__ import annotations

import math

from autotuner.dashboard.feed import SweepFeed
from autotuner.ledger.store import Ledger
from autotuner.spec.interval import Interval, RunTimes
from autotuner.states import State

from cli_rig import PREAMBLE, env, finish, wait_until, write_launcher, write_sweep
from dashboard_rig import chromium_driver, start_dashboard
from helpers import SWEEP_META, experiment


def _reading(row: list, columns: tuple[str, ...]) -> tuple:
    return tuple(row[columns.index(c)] for c in ("name", "steps", "so_far", "low", "high"))


def test_a_running_rows_reading_is_sent_when_it_changes_and_only_then(tmp_path):
    ledger = Ledger.create(tmp_path, SWEEP_META)
    ledger.add_experiments([experiment(f"e{i}") for i in range(3)], at=1.0)
    for name in ("e1", "e2"):
        ledger.start(name, 1, slots={"localhost": [int(name[1])]}, tag=name, dir=str(tmp_path / name), at=2.0)
    feed = SweepFeed(tmp_path)
    assert feed.refresh()
    first = feed.changes(-1)
    assert {_reading(r, first.columns) for r in first.rows} == {(f"e{i}", None, None, None, None) for i in range(3)}

    # The runner replaces e1's reading: no transition, yet the page that saw `first` is sent e1's row, and only it.
    ledger.measured("e1", 1, RunTimes(1.0, 0.1, 5, Interval(100.0, 90.0, 110.0, 3, 2)))
    assert feed.refresh()
    moved = feed.changes(first.seq, first.mark)
    assert moved.seq == first.seq and not moved.full
    assert [_reading(r, moved.columns) for r in moved.rows] == [("e1", 5, 100.0, 90.0, 110.0)]
    assert not feed.refresh() and feed.changes(moved.seq, moved.mark).rows == []  # the same reading: nothing sent
    # No upper bound yet (recorded as NULL): none, which JSON can carry.
    ledger.measured("e1", 1, RunTimes(1.0, 0.1, 9, Interval(100.0, 80.0, math.inf, 7, 2)))
    feed.refresh()
    later = feed.changes(moved.seq, moved.mark)
    assert [_reading(r, later.columns) for r in later.rows] == [("e1", 9, 100.0, 80.0, None)]
    # A mark this feed did not give (the dashboard was started again): every running row that has a reading.
    assert [r[0] for r in feed.changes(later.seq, "0badc0de.3").rows] == ["e1"]

    # Ended: its steps and interval as recorded with its metrics; a stale reading of it is not shown.
    ledger.finish("e1", 1, State.SUCCEEDED, 3.0, metric=101.0,
                  metrics={"throughput": 101.0, "throughput_low": 95.0, "throughput_high": 108.0, "steps_measured": 12})
    feed.refresh()
    ended = feed.changes(later.seq, later.mark)  # every row: its metrics are new columns
    assert {_reading(r, ended.columns) for r in ended.rows if r[0] == "e1"} == {("e1", 12, None, 95.0, 108.0)}
    ledger.close()


def test_a_page_further_behind_than_the_readings_kept_gets_every_running_row(tmp_path, monkeypatch):
    monkeypatch.setattr("autotuner.dashboard.readings.KEPT", 4)
    ledger = Ledger.create(tmp_path, SWEEP_META)
    ledger.add_experiments([experiment(f"e{i}") for i in range(3)], at=1.0)
    for name in ("e0", "e1"):
        ledger.start(name, 1, slots={"localhost": [int(name[1])]}, tag=name, dir=str(tmp_path / name), at=2.0)
    ledger.measured("e1", 1, RunTimes(1.0, 0.1, 3, Interval(50.0, 40.0, 60.0, 1, 2)))
    feed = SweepFeed(tmp_path)
    feed.refresh()
    first = feed.changes(-1)
    marks = []
    for steps in range(3, 9):  # e0's reading replaced six times, e1's never again
        ledger.measured("e0", 1, RunTimes(1.0, 0.1, steps, Interval(100.0, 90.0, 110.0, steps - 2, 2)))
        feed.refresh()
        marks.append(feed.changes(first.seq, first.mark).mark)
    assert [r[0] for r in feed.changes(first.seq, marks[-2]).rows] == ["e0"]  # kept: only what changed
    # Further behind than the changes kept: every running row, e1's too, though it did not change since.
    assert sorted(r[0] for r in feed.changes(first.seq, first.mark).rows) == ["e0", "e1"]
    ledger.close()


# A stand-in (named as such) that takes a step every 0.1 s, each written to the progress file with its throughput
# (100 to 110 samples/s), until the test opens the gate; then writes its metrics.
STEPPING = PREAMBLE + """\
i=0
while [ ! -e "$GATE" ] || [ $i -lt 6 ]; do
  i=$((i + 1))
  sleep 0.1
  printf '{"step": %d, "time": %s, "throughput": %d}\\n' $i "$(date +%s.%N)" $((100 + i % 3 * 5)) \\
    >> "$AUTOTUNE_PROGRESS_PATH"
done
printf '{"throughput": 105}\\n' > "$AUTOTUNE_METRICS_PATH"
"""


def _cell(browser, name: str, column: str) -> str | None:
    """The text of the row's cell in that column, as drawn now (None: no such row or column)."""
    return browser.execute_script("""
        const i = [...document.querySelectorAll('#experiments th')].findIndex((t) => t.dataset.col === arguments[1]);
        const row = document.querySelector('#experiments tr[data-name="' + arguments[0] + '"]');
        return i < 0 || !row ? null : row.children[i].innerText""", name, column)


def _steps(browser, name: str) -> int:
    text = _cell(browser, name, "steps")
    return int(text.replace(",", "")) if text else 0


def test_the_page_shows_a_running_runs_steps_advance_and_an_ended_runs_interval(tmp_path, runners):
    gate = tmp_path / "gate"
    spec = write_sweep(tmp_path, [1], name="p")
    launcher = write_launcher(tmp_path, STEPPING)
    out = tmp_path / "results" / "p"
    run = runners.start("run", spec, "--slots", 1, "--launcher", launcher, "-o", out, "-q", directory=out,
                        environ=env(LAUNCH_LOG=tmp_path / "launches.log", GATE=gate, AUTOTUNE_PROGRESS_POLL="0.2"))
    wait_until(lambda: (out / "ledger.sqlite").exists(), message="the sweep started")
    shown = start_dashboard(runners, out.parent)
    browser = chromium_driver(tmp_path / "profile")
    try:
        (sid,) = shown.sweep_ids()
        browser.get(f"{shown.base}/?token={shown.token}#/s/{sid}")
        wait_until(lambda: _steps(browser, "p_x1") >= 3, timeout=60, message="the running run's steps shown")
        browser.execute_script("window.notReloaded = true")
        measured = _cell(browser, "p_x1", "metric:throughput")
        assert "so far" in measured and "95%" in measured, measured
        seen = _steps(browser, "p_x1")
        # Its steps move on the page as the runner reads them, with no transition and no reload.
        wait_until(lambda: _steps(browser, "p_x1") >= seen + 4, timeout=60, message="the steps advance")
        assert browser.execute_script("return window.notReloaded") is True
        assert _cell(browser, "p_x1", "state") == "running"

        gate.touch()
        wait_until(lambda: (_cell(browser, "p_x1", "state") or "").startswith("succeeded"), timeout=60,
                   message="the run ended")
        ended = _cell(browser, "p_x1", "metric:throughput")
        assert ended.startswith("105") and "95%" in ended and "so far" not in ended, ended
        assert _steps(browser, "p_x1") > seen
        wait_until(lambda: "95% interval" in browser.execute_script(
            "return document.querySelector('#best').innerText"), timeout=30, message="the best's interval")
        # The interval's columns (the report's) are not repeated beside the value that shows them.
        assert browser.execute_script("return document.querySelector('#experiments th[data-col="
                                      "\"metric:throughput_low\"]')") is None
    finally:
        browser.quit()
    code, _, err = finish(run)
    assert code == 0, err


def _order(browser) -> list[str]:
    return browser.execute_script(
        "return [...document.querySelectorAll('#experiments tbody tr')].map((r) => r.dataset.name)")


def test_sorted_by_the_metric_a_running_row_sorts_by_its_value_so_far_and_moves_as_it_changes(tmp_path, runners):
    # Written straight into a ledger as a runner leaves it (nothing runs): three ended runs, two running (one whose
    # steps were read, one whose were not yet), one queued.
    (tmp_path / "s").mkdir()
    ledger = Ledger.create(tmp_path / "s", SWEEP_META)
    ledger.add_experiments([experiment(n) for n in ("low", "high", "mid", "live", "fresh", "waits")], at=1.0)
    for i, (name, value) in enumerate((("low", 100.0), ("high", 300.0), ("mid", 200.0))):
        ledger.start(name, 1, slots={"localhost": [0]}, tag=name, dir=str(tmp_path / name), at=2.0 + i)
        ledger.finish(name, 1, State.SUCCEEDED, 3.0 + i, metric=value,
                      metrics={"throughput": value, "throughput_low": value - 5, "throughput_high": value + 5})
    for name in ("live", "fresh"):
        ledger.start(name, 1, slots={"localhost": [0]}, tag=name, dir=str(tmp_path / name), at=9.0)
    ledger.measured("live", 1, RunTimes(1.0, 0.1, 8, Interval(250.0, 240.0, 260.0, 6, 2)))
    shown = start_dashboard(runners, tmp_path / "s")
    browser = chromium_driver(tmp_path / "profile")
    try:
        (sid,) = shown.sweep_ids()
        browser.get(f"{shown.base}/?token={shown.token}#/s/{sid}")
        wait_until(lambda: len(_order(browser)) == 6, message="the table drawn")
        browser.execute_script("window.notReloaded = true")
        browser.execute_script("document.querySelector('#experiments th[data-col=\"metric:throughput\"]').click()")
        # Highest first, as a throughput sorts: the running run by its mean so far among the ended ones; the rows
        # with no value yet (running unread, queued) after them in the sweep's order.
        assert _order(browser) == ["high", "live", "mid", "low", "fresh", "waits"]
        assert "so far" in _cell(browser, "live", "metric:throughput")

        # Its reading replaced by the runner (no transition): its row moves to where its new value sorts, no reload.
        ledger.measured("live", 1, RunTimes(1.0, 0.1, 20, Interval(50.0, 45.0, 55.0, 18, 2)))
        wait_until(lambda: _order(browser) == ["high", "mid", "low", "live", "fresh", "waits"], timeout=30,
                   message=f"the running row moved as its value so far changed: {_order(browser)}")
        browser.execute_script("document.querySelector('#experiments th[data-col=\"metric:throughput\"]').click()")
        assert _order(browser) == ["live", "low", "mid", "high", "fresh", "waits"]  # lowest first: no value last still
        # Its first reading, of the run whose steps were not read yet: sorted in as well.
        ledger.measured("fresh", 1, RunTimes(2.0, 0.1, 4, Interval(150.0, 100.0, math.inf, 2, 2)))
        wait_until(lambda: _order(browser) == ["live", "low", "fresh", "mid", "high", "waits"], timeout=30,
                   message=f"the first reading sorted in: {_order(browser)}")
        assert browser.execute_script("return window.notReloaded") is True
    finally:
        browser.quit()
        ledger.close()
    shown.stop()
