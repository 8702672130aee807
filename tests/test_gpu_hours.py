"""GPU-hours accounted (views/gpu_hours.py): each experiment's attempts (GPUs held x wall time, a failed and
retried one counted twice), the sweep's, the best config's (its confirming re-runs too), until the best ended,
and the runs recorded with a stopping reason; the same figures in status, every report format, the plot's title,
the HTML page and compare."""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
import shutil
from pathlib import Path

import pytest

import autotuner
from autotuner.dashboard.feed import SweepFeed
from autotuner.ledger.store import Ledger
from autotuner.spec import Sweep
from autotuner.spec.interval import RunTimes
from autotuner.spec.metrics import metric_named
from autotuner.states import Reason, State
from autotuner.views import plots
from autotuner.views.gpu_hours import gpu_hours
from autotuner.views.report import render_report
from autotuner.views.snapshot import load

from cli_rig import wait_until
from dashboard_rig import chromium_driver, start_dashboard
from helpers import experiment
from recorded import T0, two_nodes

H = 3600.0
NAMES = ("g_retried", "g_best", "g_best_confirm1", "g_oom", "g_waits")


@pytest.fixture
def sweep(tmp_path):
    """g_retried: 100 s on two slots that failed to launch, then 36 s on one (236 slot-s); g_best: 72 s, the best,
    with its re-run g_best_confirm1 (18 s); g_oom: 36 s, out of memory; g_waits never started."""
    directory = tmp_path / "s"
    exps = tuple(experiment(n, ds_config={"train_micro_batch_size_per_gpu": i + 1}) for i, n in enumerate(NAMES))
    autotuner.prepare(Sweep("g", exps, metric_named("throughput"), "test"), two_nodes(), directory,
                      launcher=["sh", "-c", "true"])
    with Ledger.open(directory) as ledger:
        def ran(name: str, attempt: int, slots: dict, start: float, end: float, state: State, **how: object) -> None:
            ledger.start(name, attempt, slots=slots, tag=f"t.{name}.{attempt}", dir=name, at=T0 + start)
            ledger.finish(name, attempt, state, T0 + end, **how)

        ran("g_retried", 1, {"node-a": [0, 1]}, 0, 100, State.FAILED, reason=Reason.LAUNCH)
        ledger.requeue(["g_retried"], at=T0 + 100)
        ran("g_retried", 2, {"node-b": [0]}, 100, 136, State.SUCCEEDED, metric=10.0, metrics={"throughput": 10.0})
        ran("g_best", 1, {"node-b": [1]}, 0, 72, State.SUCCEEDED, metric=50.0, metrics={"throughput": 50.0})
        ran("g_best_confirm1", 1, {"node-b": [1]}, 72, 90, State.SUCCEEDED, metric=48.0, metrics={"throughput": 48.0})
        ran("g_oom", 1, {"node-b": [2]}, 10, 46, State.FAILED, reason=Reason.OOM)
    return directory


def test_each_experiment_counts_every_attempt_and_the_sweep_its_best_and_stopped_runs(sweep):
    hours = gpu_hours(load(sweep))
    assert hours.per_experiment == {"g_retried": round(236 / H, 6), "g_best": 0.02, "g_best_confirm1": 0.005,
                                    "g_oom": 0.01}
    assert hours.spent == pytest.approx((236 + 72 + 18 + 36) / H)
    # until the best ended (T0 + 72): the first try's 72 s on two slots, the best, 36 s out of memory
    assert hours.on_best == pytest.approx(0.02) and hours.to_best == pytest.approx((144 + 72 + 36) / H)
    assert hours.stopped == 0 and "stopped" not in hours.line()
    assert hours.saved == 0 and "saved" not in hours.line()  # nothing stopped early: nothing saved
    stopped = gpu_hours(load(sweep), stopped=Reason.OOM)  # the reason stopping records, handed in
    assert stopped.stopped == pytest.approx(0.01) and stopped.line().endswith(", 0.01 on runs stopped early")
    assert stopped.to_json()["stopped"] == 0.01


def test_a_tunes_best_config_counts_its_confirming_re_runs(sweep):
    snap = load(sweep)
    tune = dataclasses.replace(snap, meta=dataclasses.replace(snap.meta, search={"tuner": "gridsearch"}))
    assert gpu_hours(tune).on_best == pytest.approx(0.025)  # 72 s and its re-run's 18 s


def test_every_report_format_and_status_show_them(sweep):
    data = json.loads(render_report(sweep, "json"))
    assert data["gpu_hours"] == {"spent": round(362 / H, 6), "on_best": 0.02, "to_best": 0.07, "stopped": 0.0,
                                 "saved": 0.0}
    rows = {r["name"]: r["gpu_hours"] for r in data["experiments"]}
    assert rows == {"g_retried": 0.065556, "g_best": 0.02, "g_best_confirm1": 0.005, "g_oom": 0.01, "g_waits": None}
    csv_rows = {r["name"]: r["gpu_hours"] for r in csv.DictReader(io.StringIO(render_report(sweep, "csv")))}
    assert csv_rows == {"g_retried": "0.065556", "g_best": "0.02", "g_best_confirm1": "0.005", "g_oom": "0.01",
                        "g_waits": ""}
    assert autotuner.load(sweep)["g_retried"].gpu_hours == 0.065556
    line = "GPU-hours: 0.1006 spent, 0.02 on the best, 0.07 until it ended"
    table = render_report(sweep, "table")
    assert line in table.splitlines()
    retried = next(row for row in table.splitlines() if "g_retried" in row)
    assert "│ 0.06556 │" in retried
    md = render_report(sweep, "md").splitlines()
    assert "GPU-hours" in md[0] and "| 0.06556 |" in next(r for r in md if "g_retried" in r)
    assert md[-1] == f"- {line}"
    status = json.loads(autotuner.render_status(sweep, "json"))["gpu_hours"]
    assert status == data["gpu_hours"]
    assert line in autotuner.render_status(sweep).splitlines()


def test_the_html_page_and_the_timeline_plot_say_them(sweep, monkeypatch):
    page, _ = autotuner.write_html(sweep, plots={})
    html = page.read_text()
    assert '<p class="usage" id="gpu-hours">GPU-hours: 0.1006 spent, 0.02 on the best, 0.07 until it ended</p>' \
        in html
    retried = re.search(r'<tr [^>]*data-name="g_retried">(.*?)</tr>', html).group(1)
    assert '<td class="num" data-v="0.065556">0.06556</td>' in retried
    titles: list[str] = []
    monkeypatch.setattr(plots, "_png", lambda figure: titles.append(figure.axes[0].get_title(loc="left")) or b"")
    assert plots.TIMELINE_PNG in plots.render_plots(load(sweep))  # the figure's title, not its pixels
    assert any(t.endswith("\nGPU-hours: 0.1006 spent, 0.02 on the best, 0.07 until it ended") for t in titles)


def test_compare_says_each_sweeps_and_each_experiments(sweep, tmp_path):
    data = json.loads(autotuner.render_compare(sweep, sweep, "json"))
    assert data["a"]["gpu_hours"] == data["b"]["gpu_hours"] == {"spent": 0.100556, "on_best": 0.02, "to_best": 0.07,
                                                                "stopped": 0.0, "saved": 0.0}
    row = next(r for r in data["experiments"] if r["name"] == "g_retried")
    assert row["a_gpu_hours"] == row["b_gpu_hours"] == 0.065556
    table = autotuner.render_compare(sweep, sweep, "table").splitlines()
    assert "in A: GPU-hours: 0.1006 spent, 0.02 on the best, 0.07 until it ended" in table
    assert "in B: GPU-hours: 0.1006 spent, 0.02 on the best, 0.07 until it ended" in table


def test_the_dashboards_feed_carries_them_and_moves_a_row_whose_attempt_ended(sweep):
    feed = SweepFeed(sweep)
    feed.refresh()
    first = feed.changes(-1)
    at = first.columns.index("gpu_hours")
    assert {row[0]: row[at] for row in first.rows} == {"g_retried": 0.065556, "g_best": 0.02,
                                                       "g_best_confirm1": 0.005, "g_oom": 0.01, "g_waits": None}
    assert feed.gpu_hours() == {**json.loads(render_report(sweep, "json"))["gpu_hours"],
                                "line": "GPU-hours: 0.1006 spent, 0.02 on the best, 0.07 until it ended"}
    with Ledger.open(sweep) as ledger:  # the one that waited runs 36 s on two slots
        ledger.start("g_waits", 1, slots={"node-a": [0, 1]}, tag="t.w", dir="g_waits", at=T0 + 200)
        ledger.finish("g_waits", 1, State.FAILED, T0 + 236, reason=Reason.EXIT)
    feed.refresh()
    moved = feed.changes(first.seq)
    assert not moved.full and [(row[0], row[at]) for row in moved.rows] == [("g_waits", 0.02)]
    assert feed.gpu_hours()["spent"] == round((362 + 72) / H, 6)


def test_the_dashboard_page_shows_the_sweeps_and_each_experiments(sweep, tmp_path, runners):
    """The summary's line and the table's column; the compare tab's line for each sweep (a copy of the sweep
    beside it: the same figures)."""
    served = tmp_path / "served"
    shutil.copytree(sweep, served / "one")
    shutil.copytree(sweep, served / "two")
    shown = start_dashboard(runners, served)
    ids = {s["directory"].split("/")[-1]: s["id"] for s in shown.json("/api/sweeps")["sweeps"]}
    line = "GPU-hours: 0.1006 spent, 0.02 on the best, 0.07 until it ended"
    compared = shown.json(f"/api/compare?a={ids['one']}&b={ids['two']}")
    assert compared["gpu_hours"] == {"a": line, "b": line}
    assert {r["name"]: r["a_gpu_hours"] for r in compared["rows"]}["g_retried"] == 0.065556
    browser = chromium_driver(tmp_path / "profile", width=1600, height=1000)
    try:
        browser.get(f"{shown.base}/?token={shown.token}#/s/{ids['one']}/experiments")
        wait_until(lambda: browser.execute_script("return document.querySelectorAll('#experiments tbody tr').length"),
                   timeout=120, message="the experiments drawn")
        drawn = browser.execute_script("""
            const t = document.getElementById('experiments');
            const head = [...t.querySelectorAll('thead th')].map((h) => h.textContent);
            const at = head.indexOf('GPU-hours');
            return {line: document.getElementById('gpu-hours').textContent, at,
                    cells: Object.fromEntries([...t.querySelectorAll('tbody tr')].map(
                        (r) => [r.dataset.name, r.cells[at].textContent]))};""")
        assert drawn["line"] == line
        assert drawn["at"] > 0 and drawn["cells"] == {"g_retried": "0.06556", "g_best": "0.02000",
                                                     "g_best_confirm1": "0.005000", "g_oom": "0.01000", "g_waits": ""}
        browser.get(f"{shown.base}/?token={shown.token}#/s/{ids['one']}/compare")
        wait_until(lambda: browser.execute_script(
            "return document.querySelectorAll('#compare-with option').length > 1"), timeout=120,
            message="the sweeps to compare with listed")
        browser.execute_script("""const pick = document.getElementById('compare-with');
            pick.value = arguments[0]; pick.dispatchEvent(new Event('change'));""", ids["two"])
        wait_until(lambda: browser.execute_script("return document.getElementById('compare-gpu-hours')"),
                   timeout=120, message="the comparison drawn")
        assert browser.execute_script("return document.getElementById('compare-gpu-hours').textContent") == \
            f"A: {line} · B: {line}"
    finally:
        browser.quit()


@pytest.mark.parametrize("version", ["v6", "v7"])
@pytest.mark.parametrize("kind", ["local", "ssh", "slurm", "ray"])
def test_sweeps_written_by_an_older_autotuner_are_accounted_alike(kind, version, tmp_path):
    """tests/data/ledgers (schemas 6 and 7, one sweep of each kind): two runs of 10 s on one slot each ended, the
    second started a second after the best, one still running (or waiting) counts nothing yet."""
    directory = tmp_path / kind
    shutil.copytree(Path(__file__).resolve().parent / "data" / "ledgers" / version / kind, directory)
    data = json.loads(render_report(directory, "json"))
    assert data["gpu_hours"] == {"spent": round(20 / H, 6), "on_best": round(10 / H, 6), "to_best": round(19 / H, 6),
                                 "stopped": 0.0, "saved": 0.0}
    assert {r["name"]: r["gpu_hours"] for r in data["experiments"]} == {
        "fx_mbs1": round(10 / H, 6), "fx_mbs2": round(10 / H, 6), "fx_mbs4": None}
    assert json.loads(autotuner.render_status(directory, "json"))["gpu_hours"] == data["gpu_hours"]


def test_saved_counts_only_runs_stopping_ended_before_their_window_each_on_its_slots(tmp_path):
    """One count of steps (spec/progress.py `Window`): s_out: outclassed after measuring 6 of its window's 12
    (start_profile_step 3, end_profile_step 15) on two slots, 0.5 s a step; s_sure: ended once sure after 9 of 30 (a
    tolerance: start 3 + at most 30 measured), 0.2 s a step; s_end: its sure stop asked as it measured its window's
    last; s_full: ran its window; s_cancel: cancelled after 2 steps (what a user stops is not what stopping
    saved)."""
    window, sure = {"end_profile_step": 15}, {"tolerance": 0.05}
    exps = tuple(experiment(n, ds_config={"train_micro_batch_size_per_gpu": i + 1, "autotuning": a})
                 for i, (n, a) in enumerate((("s_out", window), ("s_sure", sure), ("s_end", sure), ("s_full", window),
                                             ("s_cancel", window))))
    directory = tmp_path / "s"
    autotuner.prepare(Sweep("s", exps, metric_named("throughput"), "test"), two_nodes(), directory,
                      launcher=["sh", "-c", "true"])
    with Ledger.open(directory) as ledger:
        def ran(name: str, slots: dict, steps: int, step: float, state: State, stop: Reason | None = None,
                **how: object) -> None:
            ledger.start(name, 1, slots=slots, tag=f"t.{name}", dir=name, at=T0)
            if stop is not None:
                ledger.stopping(name, 1, state, stop, "asked", T0 + 5)
            ledger.measured(name, 1, RunTimes(1.0, step, steps, None))
            ledger.finish(name, 1, state, T0 + 10, **how)

        ran("s_out", {"node-b": [0, 1]}, 6, 0.5, State.STOPPED, Reason.OUTCLASSED, reason=Reason.OUTCLASSED)
        ran("s_sure", {"node-b": [2]}, 9, 0.2, State.SUCCEEDED, Reason.SURE, metric=1.0, metrics={"throughput": 1.0})
        ran("s_end", {"node-b": [3]}, 30, 0.2, State.SUCCEEDED, Reason.SURE, metric=1.0, metrics={"throughput": 1.0})
        ran("s_full", {"node-a": [0]}, 12, 0.5, State.SUCCEEDED, metric=2.0, metrics={"throughput": 2.0})
        ran("s_cancel", {"node-a": [1]}, 2, 0.5, State.CANCELLED, Reason.CANCELLED, reason=Reason.CANCELLED)
    expected = ((12 - 6) * 0.5 * 2 + (30 - 9) * 0.2) / H
    hours = gpu_hours(load(directory))
    assert hours.saved == pytest.approx(expected)
    assert hours.to_json()["saved"] == round(expected, 6)
    assert hours.line().endswith(f", about {expected:,.4g} saved by stopping (estimated)")
