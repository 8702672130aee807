"""The dashboard as a user sees it: headless Chromium (Selenium, Debian's chromium-driver) on a stand-in sweep
that runs. The page updates without a reload, a run's log follows, sorting and filtering work, a cancel from the
page ends the run and the ledger says so, a page without the token gets nothing; screenshots light, dark and
narrow (kept under AUTOTUNE_SCREENSHOTS when set, for a person to look at).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By

from autotuner.states import State

from cli_rig import finish, states, wait_until
from dashboard_rig import chromium_driver, stand_in_sweep, start_dashboard


@pytest.fixture
def browser(tmp_path):
    driver = chromium_driver(tmp_path / "profile")
    try:
        yield driver
    finally:
        driver.quit()


# The page redraws what changed several times a second: each read and click is one script, so it cannot meet an
# element replaced between finding it and using it.
def _texts(browser, selector: str) -> list[str]:
    return browser.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((e) => e.innerText)", selector)


def _text(browser, selector: str) -> str:
    return "\n".join(_texts(browser, selector))


def _row_state(browser, name: str) -> str | None:
    found = _texts(browser, f'#experiments tr[data-name="{name}"] .state')
    return found[0] if found else None


def _click(browser, selector: str) -> None:
    """Clicked once the script has returned (a click that opens a confirm() would hold the script)."""
    assert browser.execute_script(
        "const e = document.querySelector(arguments[0]); if (e) setTimeout(() => e.click(), 0); return !!e",
        selector), selector


def _alert(browser):
    try:
        return browser.switch_to.alert
    except NoAlertPresentException:
        return None


def _keep(browser, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.png"
    assert browser.save_screenshot(str(path))
    keep = os.environ.get("AUTOTUNE_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)
    return path


def test_the_page_follows_a_running_sweep_and_cancels_from_the_page(tmp_path, runners, browser):
    # Short runs, one held until the test opens its gate, and a long one that keeps running to the end.
    gate = tmp_path / "gate"
    out, run = stand_in_sweep(tmp_path / "a", [1, 2, 4, '"gate"', '"long"'], runners=runners, STANDIN_SECONDS=1,
                              LONG_SECONDS=120, GATE=gate)
    wait_until(lambda: (out / "ledger.sqlite").exists(), message="the sweep started")
    shown = start_dashboard(runners, out.parent, "--allow-cancel")
    browser.get(f"{shown.base}/?token={shown.token}")
    wait_until(lambda: _texts(browser, "#sweeps a"), message="the sweep listed")
    assert "token=" not in browser.current_url  # taken out of the address bar
    _click(browser, "#sweeps a")
    wait_until(lambda: _row_state(browser, "s_x1"), message="the table drawn")
    browser.execute_script("window.notReloaded = true")

    # Live: states move on the page as the runner records them, without a reload.
    wait_until(lambda: _row_state(browser, "s_xgate") == "running", timeout=60, message="s_xgate running")
    gate.touch()
    wait_until(lambda: _row_state(browser, "s_xgate") == "succeeded", timeout=60, message="s_xgate succeeded")
    wait_until(lambda: "4 succeeded" in _text(browser, ".counts"), timeout=30)
    assert browser.execute_script("return window.notReloaded") is True
    assert _text(browser, "#best a") in {"s_x1", "s_x2", "s_x4", "s_xgate"}

    # Sorting by the metric, both ways; filtering by name and by state.
    def throughputs() -> list[float]:
        cells = browser.execute_script(
            "const i = [...document.querySelectorAll('#experiments th')].findIndex((t) => t.innerText === "
            "'throughput'); return [...document.querySelectorAll('#experiments tbody tr')].map("
            "(r) => r.children[i].innerText)")
        return [float(c.replace(",", "")) for c in cells if c]

    header = '#experiments th[data-col="metric:throughput"]'
    _click(browser, header)
    wait_until(lambda: "sorted-desc" in browser.execute_script(f"return document.querySelector('{header}').className"))
    assert throughputs() == sorted(throughputs(), reverse=True) and len(throughputs()) == 4
    _click(browser, header)
    wait_until(lambda: "sorted-asc" in browser.execute_script(f"return document.querySelector('{header}').className"))
    assert throughputs() == sorted(throughputs())
    browser.find_element(By.ID, "filter").send_keys("xgat")
    assert _texts(browser, "#experiments tbody td.name") == ["s_xgate"]
    browser.find_element(By.ID, "filter").clear()  # clear() fires no input event: the page is told
    browser.execute_script("document.getElementById('filter').dispatchEvent(new Event('input'))")
    assert len(_texts(browser, "#experiments tbody td.name")) == 5
    browser.find_element(By.CSS_SELECTOR, '#state-filter option[value="running"]').click()
    assert _texts(browser, "#experiments tbody td.name") == ["s_xlong"]
    # Nothing changes in the ledger while s_xlong runs: its duration still counts up on the page.
    duration = '#experiments th[data-col="duration"]'
    column = browser.execute_script(f"return [...document.querySelectorAll('#experiments th')].indexOf("
                                    f"document.querySelector('{duration}'))")
    took = f"#experiments tbody tr td:nth-child({column + 1})"
    first = _text(browser, took)
    wait_until(lambda: _text(browser, took) not in ("", first), timeout=10, message="the running duration grows")

    # The long run's log, followed as it grows.
    _click(browser, '#experiments tr[data-name="s_xlong"] td.name a')
    wait_until(lambda: "step 2 of s_xlong" in _text(browser, "#log-stdout"), timeout=30)
    seen = _text(browser, "#log-stdout").count("\n")
    wait_until(lambda: _text(browser, "#log-stdout").count("\n") >= seen + 5, timeout=30,
               message="more lines followed")
    assert "warning" in _text(browser, "#log-stderr")
    assert browser.execute_script("return window.notReloaded") is True

    # Cancel from the page: the run ends, and the ledger says so.
    wait_until(lambda: _texts(browser, "#cancel-run"), message="the run page drawn")
    _click(browser, "#cancel-run")
    wait_until(lambda: _alert(browser), message="the page asks to confirm").accept()
    wait_until(lambda: states(out).get("s_xlong") == State.CANCELLED, timeout=60, message="cancelled in the ledger")
    code, _, err = finish(run)
    assert code == 1, err  # a sweep with a cancelled experiment
    wait_until(lambda: "cancelled" in _texts(browser, "#attempts .state"), timeout=10, message="the page says so")


def test_without_the_token_nothing_is_shown_and_light_dark_narrow_look_right(tmp_path, runners, browser):
    out, run = stand_in_sweep(tmp_path / "b", [1, 2, 4], runners=runners, extra="num_gpus: 2", STANDIN_SECONDS=0.2)
    assert finish(run)[0] == 0
    shown = start_dashboard(runners, out.parent)

    browser.get(shown.base + "/")  # no token: a notice, and the API refuses the page
    wait_until(lambda: "printed last" in _text(browser, "#main"))
    status = browser.execute_async_script(
        "const done = arguments[0]; fetch('/api/sweeps').then((r) => done(r.status))")
    assert status == 403

    (sid,) = shown.sweep_ids()
    browser.get(f"{shown.base}/?token={shown.token}#/s/{sid}")
    wait_until(lambda: _row_state(browser, "s_x4") == "succeeded")
    light = browser.execute_script("return getComputedStyle(document.body).backgroundColor")
    _keep(browser, tmp_path, "dashboard-light")
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia",
                            {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
    dark = browser.execute_script("return getComputedStyle(document.body).backgroundColor")
    assert light == "rgb(247, 248, 250)" and dark == "rgb(17, 20, 24)"
    browser.get(f"{shown.base}/#/s/{sid}/plots")
    wait_until(lambda: len(browser.find_elements(By.CSS_SELECTOR, ".plot svg.chart")) >= 4, timeout=30,
               message="four plots drawn")
    # The plots' text takes the page's colours: light text on the dark page.
    fill = browser.execute_script("return getComputedStyle(document.querySelector('#plot-metric .axis-title')).fill")
    assert fill == "rgb(154, 163, 178)", fill  # --muted, dark
    _keep(browser, tmp_path, "dashboard-dark-plots")
    # The slot timeline: each two-slot run a bar (a segment from its start to its end) on each of its slots.
    bars = browser.execute_script("""
        const plot = document.getElementById('plot-timeline');
        const rows = [...plot.querySelectorAll('.tick.y')].map((t) => [+t.getAttribute('y'), t.textContent]);
        return plot.querySelector('svg.chart').hoverMarks.map((m) =>
          [m.text, rows.find(([y]) => Math.abs(y - m.y) < 0.5)[1]])""")
    assert sorted(map(tuple, bars)) == [(f"s_x{x} · succeeded", slot) for x in (1, 2, 4)
                                        for slot in ("localhost:0", "localhost:1")]

    browser.set_window_size(400, 900)
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia",
                            {"features": [{"name": "prefers-color-scheme", "value": "light"}]})
    browser.get(f"{shown.base}/#/s/{sid}")
    wait_until(lambda: _row_state(browser, "s_x4") == "succeeded")
    # Nothing but the table's own scroller is wider than a narrow window.
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    _keep(browser, tmp_path, "dashboard-narrow")
