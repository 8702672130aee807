"""The dashboard's defences as a browser meets them (headless Chromium, Selenium): the page draws everything under
its Content-Security-Policy and markup slipped into it runs nothing; a page from another port of the same host
cannot frame it; and what the browser's history keeps of the link opens nothing.
"""
from __future__ import annotations

import http.server
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotuner.dashboard.client import sign_in

from cli_rig import finish, wait_until
from dashboard_rig import chromium_driver, stand_in_sweep, start_dashboard

# Every CSP violation the page meets, from its first script on (the browser's console says it too).
VIOLATIONS = ("window.violations = []; document.addEventListener('securitypolicyviolation', "
              "(e) => window.violations.push([e.violatedDirective, e.blockedURI, e.sourceFile, e.lineNumber]));")


@pytest.fixture
def browser(tmp_path):
    driver = chromium_driver(tmp_path / "profile")
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def sweep(tmp_path, runners) -> Path:
    out, run = stand_in_sweep(tmp_path / "b", [1, 2, 4], runners=runners, extra="num_gpus: 2", STANDIN_SECONDS=0.2)
    assert finish(run)[0] == 0
    return out


def _csp_messages(browser) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if "Content Security Policy" in e["message"]]


def test_the_page_draws_under_its_csp_and_markup_slipped_in_runs_nothing(sweep, runners, browser):
    shown = start_dashboard(runners, sweep.parent)
    browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": VIOLATIONS})
    (sid,) = shown.sweep_ids()
    browser.get(shown.next_link())
    wait_until(lambda: browser.execute_script("return document.querySelectorAll('#sweeps a').length"),
               message="signed in, the sweep listed")
    browser.execute_script("location.hash = arguments[0]", f"#/s/{sid}/plots")
    wait_until(lambda: browser.execute_script("return document.querySelectorAll('.plot svg.chart').length") >= 4,
               timeout=60, message="four plots drawn")
    # Every plot drawn, its lines and marks too, and nothing of it blocked (no style applied inline).
    wait_until(lambda: browser.execute_script(
        "return ['metric', 'best', 'timeline', 'parallel'].every((k) => "
        "document.querySelectorAll('#plot-' + k + ' .series > *').length)"),
        timeout=60, message="every plot's marks drawn")
    assert browser.execute_script("return window.violations") == []
    assert _csp_messages(browser) == []

    # The policy is the server's own, and it holds: markup put into the page (as an escaping bug would) runs
    # no script, neither inline nor from an attribute, and loads nothing from elsewhere.
    policy = browser.execute_async_script(
        "const done = arguments[0]; fetch('/').then((r) => done(r.headers.get('content-security-policy')))")
    assert "script-src 'self';" in policy and "frame-ancestors 'none'" in policy
    assert "style-src 'self';" in policy and "unsafe-inline" not in policy  # no style attribute applies
    # No 'unsafe-eval' (the plots are SVG, and nothing evaluates strings): the plots above drew
    # under it, and a string the page's timers would evaluate is refused and reported.
    assert "unsafe-eval" not in policy
    browser.execute_script("setTimeout('window.ran = 3', 0)")
    wait_until(lambda: browser.execute_script("return window.violations"), message="the string timer refused")
    assert [v[:2] for v in browser.execute_script("return window.violations.splice(0)")] == [["script-src", "eval"]]
    assert browser.execute_script("return window.ran") is None
    browser.execute_script(
        "document.body.insertAdjacentHTML('beforeend', '<img id=\"bad\" src=\"data:,\" onerror=\"window.ran = 1\">"
        "<img src=\"http://127.0.0.2:9/x.png\"><b id=\"big\" style=\"font-size: 40px\">x</b>');"
        "const s = document.createElement('script'); s.textContent = 'window.ran = 2'; document.body.append(s);")
    wait_until(lambda: len(browser.execute_script("return window.violations")) >= 4, message="four refusals")
    assert browser.execute_script("return window.ran") is None
    assert sorted({v[0] for v in browser.execute_script("return window.violations")}) == [
        "img-src", "script-src-attr", "script-src-elem", "style-src-attr"]
    assert browser.execute_script("return getComputedStyle(document.getElementById('big')).fontSize") != "40px"


class _Hostile(http.server.BaseHTTPRequestHandler):
    """Another server on this host (another port: the same site): its page frames the dashboard."""

    page = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hostile() -> Iterator[tuple[http.server.ThreadingHTTPServer, type[_Hostile]]]:
    handler = type("Hostile", (_Hostile,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, handler
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def test_a_page_of_another_port_cannot_frame_the_dashboard(sweep, runners, browser, hostile):
    """A page on another port of the same host framed the dashboard; the frame found the token in the tab's
    session storage and showed live data, and a click through it cancelled a run (found by a security review)."""
    shown = start_dashboard(runners, sweep.parent, "--allow-cancel")
    server, handler = hostile
    handler.page = f'<!doctype html><iframe id="f" src="{shown.base}/" width="900" height="600"></iframe>'.encode()
    browser.get(shown.next_link())  # this tab signed in: the token is in its session storage
    wait_until(lambda: browser.execute_script("return document.querySelectorAll('#sweeps a').length"))
    browser.get(f"http://127.0.0.1:{server.server_address[1]}/")
    frame = wait_until(lambda: browser.find_elements("id", "f"))[0]
    wait_until(lambda: any("frame-ancestors" in m for m in _csp_messages(browser)), message="the framing refused")
    browser.switch_to.frame(frame)
    try:
        assert browser.execute_script("return [location.protocol, document.querySelector('#main')]") == \
            ["chrome-error:", None]
    finally:
        browser.switch_to.default_content()


def test_the_history_keeps_nothing_that_opens_the_dashboard(sweep, runners, tmp_path):
    """The token stayed in the browser's history (`/?token=...`) although it left the address bar: Chromium's
    History database keeps the URL navigated to, whatever replaceState does after. Read here: the address after
    the page loaded, the tab's history (length, the navigation entry), and, the browser closed, every URL in the
    profile's History database: none carries the token, and each code in one is spent."""
    shown = start_dashboard(runners, sweep.parent)
    link = shown.next_link()
    profile = tmp_path / "history-profile"
    driver = chromium_driver(profile)
    try:
        before = driver.execute_script("return history.length")
        driver.get(link)
        wait_until(lambda: driver.execute_script("return document.querySelectorAll('#sweeps a').length"),
                   message="signed in with the link")
        assert driver.current_url == shown.base + "/"
        assert driver.execute_script("return history.length") == before + 1  # one entry, the code taken out of it
        navigated = driver.execute_script("return performance.getEntriesByType('navigation')[0].name")
        assert navigated == link  # the page was opened with the code, now spent
        # The same link in a new tab (no session storage yet) opens nothing, and says why.
        driver.switch_to.new_window("tab")
        driver.get(link)
        wait_until(lambda: "used already" in driver.execute_script("return document.getElementById('main').innerText"))
        assert driver.current_url == shown.base + "/"
        driver.get(f"{shown.base}/?token=not-the-token")  # an old ?token= link: taken out too, and said so
        wait_until(lambda: "not this dashboard's" in driver.execute_script(
            "return document.getElementById('main').innerText"))
        assert driver.current_url == shown.base + "/"
    finally:
        driver.quit()
    with sqlite3.connect(f"file:{profile / 'Default' / 'History'}?mode=ro", uri=True) as db:
        urls = [row[0] for row in db.execute("SELECT url FROM urls")]
    assert link in urls  # the database was read: the visit is there
    for url in urls:
        assert shown.token not in url, url
        if "#code=" in url:
            with pytest.raises(PermissionError, match="used already"):
                sign_in(url)
