"""A run's own page shows its progress live: while it runs, its steps so far, the metric's mean so far with its 95%
interval, start-up and step time, as the runner records them (replaced without a transition), updating with no
reload; once it ended, its final figures. Before its steps are read, and for a run whose steps file is garbage, it
says none were read. Headless Chromium on the dashboard, over a ledger written as a runner leaves it and over a
real sweep of stand-ins.
"""
from __future__ import annotations

import math
import shutil
from pathlib import Path

from autotuner.ledger.lock import SweepLock
from autotuner.ledger.store import Ledger
from autotuner.spec.interval import Interval, RunTimes
from autotuner.states import State

from cli_rig import PREAMBLE, env, finish, wait_until, write_launcher, write_sweep
from dashboard_rig import chromium_driver, start_dashboard
from helpers import SWEEP_META, experiment

TO = "\u2013"  # the en dash between an interval's ends


def _figures(browser) -> dict[str, str] | None:
    """The progress card as drawn now: its title and each figure by its key (None: no card)."""
    return browser.execute_script("""
        const box = document.getElementById('progress');
        if (!box) return null;
        const found = { title: box.querySelector('h2').innerText, note: (box.querySelector('p') || {}).innerText };
        for (const dd of box.querySelectorAll('dd')) found[dd.dataset.key] = dd.innerText;
        return found""")


def _shows(browser, want: dict[str, str]) -> None:
    """Waits until the card shows these figures (`title`, `note`, or a figure's key)."""
    wait_until(lambda: (f := _figures(browser)) is not None and all(f.get(k) == v for k, v in want.items()),
               timeout=30, message=f"the card shows {want}: {_figures(browser)}")


def test_a_runs_page_follows_its_reading_and_shows_its_final_figures_once_it_ended(tmp_path, runners):
    (tmp_path / "s").mkdir()
    ledger = Ledger.create(tmp_path / "s", SWEEP_META)
    ledger.add_experiments([experiment("e1"), experiment("e2")], at=1.0)
    runner = SweepLock(tmp_path / "s").acquire()  # this test is the sweep's runner: it records what a runner does
    shown = start_dashboard(runners, tmp_path / "s")
    browser = chromium_driver(tmp_path / "profile")
    try:
        (sid,) = shown.sweep_ids()
        browser.get(f"{shown.base}/?token={shown.token}#/s/{sid}/run/e1")
        wait_until(lambda: browser.execute_script("return document.querySelectorAll('#attempts tbody tr').length"),
                   message="the run's page drawn")
        assert _figures(browser) is None  # queued: nothing measured, nothing to say yet
        browser.execute_script("window.notReloaded = true")

        ledger.start("e1", 1, slots={"localhost": [0]}, tag="e1", dir=str(tmp_path / "s" / "e1"), at=2.0)
        _shows(browser, {"title": "Progress so far"})
        assert _figures(browser)["note"].startswith("no steps read yet"), _figures(browser)
        # Its first steps: too few to bound the metric (no interval recorded).
        ledger.measured("e1", 1, RunTimes(1.5, 0.25, 2, None))
        _shows(browser, {"steps": "2 so far", "throughput": "not yet: no step measured it",
                         "95% interval": "not yet: too few steps", "start-up": "1.500 s", "step time": "0.2500 s"})
        ledger.measured("e1", 1, RunTimes(1.5, 0.2, 9, Interval(101.5, 90.0, math.inf, 7, 2)))
        _shows(browser, {"steps": "9 so far", "throughput": "101.500 so far (mean)",
                         "95% interval": f"90 {TO} no upper bound", "step time": "0.2000 s"})
        ledger.measured("e1", 1, RunTimes(1.5, 0.2, 30, Interval(100.0, 95.0, 105.0, 28, 4)))
        _shows(browser, {"steps": "30 so far", "throughput": "100 so far (mean)", "95% interval": f"95 {TO} 105"})

        # Ended while the page is open: its final figures, its value and interval as recorded with its metrics.
        ledger.measured("e1", 1, RunTimes(1.5, 0.2, 32, Interval(100.5, 96.0, 104.0, 30, 4)))
        ledger.finish("e1", 1, State.SUCCEEDED, 20.0, metric=100.5, metrics={
            "throughput": 100.5, "throughput_low": 96.0, "throughput_high": 104.0, "steps_measured": 32.0})
        _shows(browser, {"title": "Steps measured", "steps": "32", "throughput": "100.500",
                         "95% interval": f"96 {TO} 104", "start-up": "1.500 s"})
        assert browser.execute_script("return window.notReloaded") is True

        # One that failed after some steps recorded no value: its steps' mean when it ended, said to be that.
        ledger.start("e2", 1, slots={"localhost": [0]}, tag="e2", dir=str(tmp_path / "s" / "e2"), at=21.0)
        ledger.measured("e2", 1, RunTimes(2.5, 0.5, 6, Interval(80.25, 70.5, 90.5, 4, 2)))
        ledger.finish("e2", 1, State.FAILED, 30.0, exit_code=1)
        browser.get(f"{shown.base}/#/s/{sid}/run/e2")
        _shows(browser, {"title": "Steps measured", "steps": "6", "start-up": "2.500 s",
                         "throughput": "80.250 (its steps' mean; the run recorded no value)",
                         "95% interval": f"70.500 {TO} 90.500"})
    finally:
        browser.quit()
        ledger.close()
        runner.release()
    shown.stop()


# Stand-ins (named as such) under one gate: p_x2 appends a step a line to its progress file every 0.1 s; p_x1
# fills its progress file with lines that are no steps (not JSON, not an object, a step that is negative or not a
# whole number, a time that is no number, bytes that are not UTF-8) and says when it wrote them. Both then write
# their metrics.
STEPS = PREAMBLE + """\
i=0
while [ ! -e "$GATE" ] || [ $i -lt 4 ]; do
  i=$((i + 1))
  case "$name" in
    *_x2) printf '{"step": %d, "time": %s, "throughput": %d}\\n' $i "$(date +%s.%N)" $((100 + i % 3 * 5)) \\
              >> "$AUTOTUNE_PROGRESS_PATH";;
    *) printf 'not json\\n[1, 2]\\n{"step": -1, "time": 5}\\n{"step": 1.5, "time": 5}\\n{"step": true, "time": 5}\\n' \\
         >> "$AUTOTUNE_PROGRESS_PATH"
       printf '{"step": %d, "time": "soon", "throughput": 1}\\n\\377\\376{"step"\\n' $i >> "$AUTOTUNE_PROGRESS_PATH"
       touch "$JUNK_WRITTEN";;
  esac
  sleep 0.1
done
printf '{"throughput": 105}\\n' > "$AUTOTUNE_METRICS_PATH"
"""


def test_a_run_whose_steps_file_is_garbage_says_no_steps_were_read_and_ends_as_its_metrics_say(tmp_path, runners):
    gate, written = tmp_path / "gate", tmp_path / "junk-written"
    spec = write_sweep(tmp_path, [1, 2], name="p")  # p_x1 writes junk, p_x2 good steps
    launcher = write_launcher(tmp_path, STEPS)
    out = tmp_path / "results" / "p"
    run = runners.start("run", spec, "--slots", 2, "--launcher", launcher, "-o", out, "-q", directory=out,
                        environ=env(LAUNCH_LOG=tmp_path / "launches.log", GATE=gate, JUNK_WRITTEN=written,
                                    AUTOTUNE_PROGRESS_POLL="0.2"))
    wait_until(lambda: (out / "ledger.sqlite").exists(), message="the sweep started")
    shown = start_dashboard(runners, out)
    browser = chromium_driver(tmp_path / "profile")
    try:
        (sid,) = shown.sweep_ids()
        base = f"/api/sweeps/{sid}/experiments/"

        def good_steps() -> int:
            return int(((shown.json(base + "p_x2")["attempts"] or [{}])[-1].get("measured") or {}).get("steps", 0))

        # The step reader reads every running attempt at each pass: once the good run's reading moved on twice
        # after the junk was written, a whole pass has read the junk.
        wait_until(written.exists, timeout=60, message="the junk written")
        seen = good_steps()
        wait_until(lambda: good_steps() > seen, timeout=60, message="a reading after the junk")
        seen = good_steps()
        wait_until(lambda: good_steps() > seen, timeout=60, message="a whole pass after the junk")
        assert shown.json(base + "p_x1")["attempts"][-1]["measured"] is None

        browser.get(f"{shown.base}/?token={shown.token}#/s/{sid}/run/p_x1")
        _shows(browser, {"title": "Progress so far"})
        assert _figures(browser)["note"].startswith("no steps read yet"), _figures(browser)
        browser.execute_script("window.notReloaded = true")
        gate.touch()
        _shows(browser, {"title": "Steps measured", "note": "no steps were read from this run"})
        wait_until(lambda: "105" in browser.execute_script("return document.getElementById('attempts').innerText"),
                   timeout=30, message="its metric in its attempts' table")
        assert browser.execute_script("return window.notReloaded") is True

        # The good run's page: its final figures from its steps.
        browser.get(f"{shown.base}/#/s/{sid}/run/p_x2")
        _shows(browser, {"title": "Steps measured"})
        figures = _figures(browser)
        assert 100 <= float(figures["throughput"]) <= 110 and int(figures["steps"]) >= 4, figures
        assert figures["95% interval"][0].isdigit() and figures["start-up"].endswith(" s"), figures
    finally:
        browser.quit()
    code, _, err = finish(run)
    assert code == 0, err


def test_a_run_of_a_ledger_older_than_the_steps_has_no_figures_and_its_page_says_so(tmp_path, runners):
    # Schema 6, before the `measures` table: every attempt's `measured` is none, never an error.
    old = tmp_path / "old"
    shutil.copytree(Path(__file__).resolve().parent / "data" / "ledgers" / "v6" / "local", old)
    shown = start_dashboard(runners, old)
    (sid,) = shown.sweep_ids()
    for name in ("fx_mbs1", "fx_mbs2", "fx_mbs4"):
        found = shown.json(f"/api/sweeps/{sid}/experiments/{name}")
        assert [a["measured"] for a in found["attempts"]] == [None] and found["metric"] == "throughput", found
        assert found["runner"] is None  # its runner is long gone
    browser = chromium_driver(tmp_path / "profile")
    try:
        browser.get(f"{shown.base}/?token={shown.token}#/s/{sid}/run/fx_mbs4")  # left running by a runner long gone
        _shows(browser, {"title": "Progress so far"})
        assert _figures(browser)["note"] == ("no steps read: no runner follows this sweep now (autotune resume "
                                             "follows its runs again)"), _figures(browser)  # not "yet": none will be
    finally:
        browser.quit()
    shown.stop()
