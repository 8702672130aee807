"""The training run in the dashboard: for a tune that stated one (tokens or samples, a price, a deadline), the feed
carries what the report's training section shows, computed by the same code (views/cost.py): each config's time,
GPU-hours, cost, the front, the deadline, the fastest and the cheapest within it; the page shows it as text. A
sweep without a training run shows nothing new. The tune is the stand-in's (tests/test_training_cost.py)."""
import json

import pytest
from test_training_cost import setup, tune

from autotuner.dashboard.feed import SweepFeed
from autotuner.views import cost
from autotuner.views.snapshot import load

from cli_rig import autotune, wait_until
from dashboard_rig import chromium_driver, recorded_sweep, start_dashboard


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """A folder of two sweeps: a tune priced for a training run (`priced`) and a sweep without one (`plain`)."""
    tmp_path = tmp_path_factory.mktemp("training")
    result = tune(tmp_path, setup(tmp_path, {"train_samples": 1e9, "gpu_hour_cost": 2.5, "deadline_days": 100}),
                  "-o", tmp_path / "sweeps" / "priced")
    assert result.returncode == 0, result.stdout + result.stderr
    recorded_sweep(tmp_path / "sweeps" / "plain", 12)
    return tmp_path / "sweeps"


def test_the_feed_carries_the_reports_training_run(sweeps):
    feed = SweepFeed(sweeps / "priced")
    feed.refresh()
    shown = feed.training()
    assert shown is not None and "error" not in shown
    report = json.loads(autotune("report", sweeps / "priced", "--format", "json").stdout)["training"]
    for key in ("fastest", "cheapest", "front", "candidates", "basis", "deadline_met"):
        assert shown[key] == report[key], key
    table = autotune("report", sweeps / "priced").stdout  # the table's rows and lines, word for word
    assert shown["headers"][:3] == ["name", "GPUs", "samples/s"]
    assert [row[0] for row in shown["cells"]] == [c["name"] for c in report["candidates"]]
    for line in shown["verdict"] + shown["notes"]:
        assert line.split(" (")[0] in table, line
    assert shown["verdict"][1].startswith("cheapest within 100 days: ")
    assert [c["meets_deadline"] for c in shown["candidates"]] == [c["days"] <= 100 for c in report["candidates"]]


def test_a_sweep_without_a_training_run_has_none(sweeps):
    feed = SweepFeed(sweeps / "plain")
    feed.refresh()
    assert feed.training() is None


def _reported(directory):
    """What the report's training section shows (views/cost.py), as the page should show it."""
    snap = load(directory, every_experiment=False)
    priced = cost.costing(snap, cost.goal_of(snap))
    assert priced is not None
    return {"headers": cost.headers(priced), "cells": [list(r) for r in cost.cells(priced)],
            "front": [c.name for c in priced.candidates if c.front], "fastest": priced.fastest.name,
            "cheapest": priced.cheapest, "verdict": priced.verdict, "notes": cost.notes(priced)[len(priced.verdict):]}


def test_the_page_shows_the_training_run_as_text_and_nothing_for_a_sweep_without(tmp_path, runners, sweeps):
    expected = _reported(sweeps / "priced")
    shown = start_dashboard(runners, sweeps)
    ids = {s["directory"].split("/")[-1]: s["id"] for s in shown.json("/api/sweeps")["sweeps"]}
    browser = chromium_driver(tmp_path / "profile", width=1400, height=1000)
    try:
        browser.get(f"{shown.base}/?token={shown.token}#/s/{ids['priced']}/experiments")
        wait_until(lambda: browser.execute_script("return document.querySelectorAll('#training tbody tr').length"),
                   timeout=120, message="the training run drawn")
        drawn = browser.execute_script("""
            const t = document.getElementById('training');
            return {head: [...t.querySelectorAll('thead th')].map((h) => h.textContent),
                    rows: [...t.querySelectorAll('tbody tr')].map((r) => [...r.cells].map((c) => c.textContent)),
                    front: [...t.querySelectorAll('tbody tr.front')].map((r) => r.dataset.name),
                    lines: [...t.querySelectorAll('.verdict, li')].map((l) => l.textContent),
                    elements: [...t.querySelectorAll('*')].map((e) => e.tagName.toLowerCase())};""")
        assert drawn["head"] == [*expected["headers"], ""]
        named = {expected["fastest"]: "fastest"}
        if expected["cheapest"]:
            named[expected["cheapest"]] = "fastest, cheapest" if expected["cheapest"] in named else "cheapest"
        assert drawn["rows"] == [[*row, named.get(row[0], "")] for row in expected["cells"]]
        assert drawn["front"] == expected["front"]
        assert drawn["lines"] == expected["verdict"] + expected["notes"]
        assert set(drawn["elements"]) <= {"h2", "span", "div", "table", "thead", "tbody", "tr", "th", "td", "ul", "li"}
        # A sweep without a training run: its summary drawn, no training card.
        browser.get(f"{shown.base}/?token={shown.token}#/s/{ids['plain']}/experiments")
        wait_until(lambda: browser.execute_script(
            "return document.querySelector('h1') && document.getElementById('best')"),
            timeout=120, message="the plain sweep's summary drawn")
        assert browser.execute_script("return document.getElementById('training')") is None
    finally:
        browser.quit()
