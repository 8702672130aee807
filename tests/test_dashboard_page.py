"""The dashboard's page in headless Chromium at 1400 px, on sweeps recorded straight into a ledger: text from the
sweep is plain text in every plot (legends, ticks, hover text), a big sweep's plots draw a bounded sample drawn
evenly over the whole sweep and say so, discrete axes show every value swept, and the page reads as it should
(titles above their plots, no text on the timeline's bars, whole-number ticks, a long value cut, the reason in
view, counts that say what they count, every metric of a run, what an empty log means, a server that stops
answering). Screenshots are kept under AUTOTUNE_SCREENSHOTS
when set, for a person to look at.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from cli_rig import wait_until
from dashboard_rig import HOSTILE, chromium_driver, recorded_sweep, start_dashboard

PLOTS = ("metric", "best", "timeline", "parallel")


@pytest.fixture
def browser(tmp_path):
    driver = chromium_driver(tmp_path / "profile", width=1400, height=1000)
    try:
        yield driver
    finally:
        driver.quit()


def _keep(browser, tmp_path: Path, name: str, at: str | None = None) -> None:
    if at:
        browser.execute_script("document.querySelector(arguments[0]).scrollIntoView()", at)
    path = tmp_path / f"{name}.png"
    assert browser.save_screenshot(str(path))
    keep = os.environ.get("AUTOTUNE_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)


def _open_plots(browser, shown) -> None:
    (sid,) = shown.sweep_ids()
    browser.get(f"{shown.base}/?token={shown.token}#/s/{sid}/plots")
    wait_until(lambda: browser.execute_script(
        "return document.querySelectorAll('.plot svg.chart').length >= 4 && "
        "[...document.querySelectorAll('.caption')].every((c) => c.textContent)"), timeout=120,
        message="four plots drawn")


# What the plots made of the text they drew: links, styled or nested elements inside text (what <b>, <i>, <a> and
# <span style> would become as markup), every style attribute, and the text itself, <title>s and the tooltip included.
MARKUP = """
const nodes = [...document.querySelectorAll(arguments[0])];
const all = (q) => nodes.flatMap((n) => [...n.querySelectorAll(q)]);
return {links: all('a').length, styled: all('[style]').map((t) => t.getAttribute('style')),
        nested: all('text *, title *').map((t) => t.outerHTML),
        text: nodes.map((n) => n.textContent).join('\\n')};
"""

# Each plot's hover texts, as the pointer finds them: the tooltip's text with the pointer on each mark in turn (the
# first 80), and the <title> of each line of parallel coordinates; and the text of its legend and ticks.
HOVER = """
const plot = document.getElementById('plot-' + arguments[0]), svg = plot.querySelector('svg.chart');
const box = svg.getBoundingClientRect(), tip = svg.querySelector('.tip'), out = [];
for (const m of (svg.hoverMarks || []).slice(0, 80)) {
  svg.dispatchEvent(new MouseEvent('mousemove', {clientX: box.left + (m.x0 + m.x1) / 2, clientY: box.top + m.y}));
  out.push(tip.getAttribute('visibility') === 'visible' ? tip.textContent : '');
}
return {hover: out.concat([...plot.querySelectorAll('title')].map((t) => t.textContent)),
        legend: [...plot.querySelectorAll('.legend text')].map((t) => t.textContent),
        ticks: [...plot.querySelectorAll('.tick')].map((t) => t.textContent)};
"""


def test_text_from_the_sweep_is_plain_text_in_every_plot(tmp_path, runners, browser):
    hosts = ("node<b>1</b>", '<a href="https://evil.example/h">n2</a>')
    recorded_sweep(tmp_path / "sweeps" / "hostile", 40, strings=HOSTILE, key="<b>k</b>", hosts=hosts,
                   gpu_types={hosts[0]: "<i>A100</i>", hosts[1]: "H100<br>x"}, extra_metric="<b>m</b>")
    shown = start_dashboard(runners, tmp_path / "sweeps")
    _open_plots(browser, shown)
    drawn = browser.execute_script(MARKUP, ".plot")
    assert drawn["links"] == 0 and drawn["styled"] == [] and drawn["nested"] == [], drawn
    for text in ("<b>bold</b>", '<a href="https://evil', "<i>it</i><br>x", "&lt;b&gt;ent", "%{x}%{text}", "$x^2$",
                 "node<b>1</b>:0", "<i>A100</i>", "H100<br>x", "<b>k</b>"):
        assert text in drawn["text"], text
    plots = {plot: browser.execute_script(HOVER, plot) for plot in PLOTS}
    for plot, got in plots.items():
        assert got["hover"] and all(h.strip() for h in got["hover"]), plot
    assert any(h.startswith("<i>A100</i> · stage ") for h in plots["metric"]["hover"])  # a line's name, as text
    assert any("node<b>1</b>" in h for h in plots["timeline"]["hover"] + plots["timeline"]["ticks"])
    assert browser.execute_script(MARKUP, ".plot")["nested"] == []  # the tooltip too: text only
    # Hostile values as they were, in legends (GPU types, a state), ticks (hosts) and hover text (values, hosts).
    legend = plots["metric"]["legend"]
    assert any(t.startswith("<i>A100</i> · ") for t in legend) and any(t.startswith("H100<br>x · ") for t in legend)
    assert "node<b>1</b>:0" in plots["timeline"]["ticks"], plots["timeline"]["ticks"]
    assert any("<b>bold</b>" in t for t in plots["parallel"]["ticks"]), plots["parallel"]["ticks"]
    assert any("<b>bold</b>" in t for t in plots["metric"]["ticks"] + plots["parallel"]["ticks"])
    _keep(browser, tmp_path, "dashboard-hostile-plots", ".plots")


def test_a_big_sweeps_plots_draw_a_bounded_sample_of_the_whole_sweep(tmp_path, runners, browser):
    n = 5000
    recorded_sweep(tmp_path / "sweeps" / "big", n)
    shown = start_dashboard(runners, tmp_path / "sweeps")
    _open_plots(browser, shown)
    got = browser.execute_script("""
        const plot = (k) => document.getElementById('plot-' + k);
        const marks = (k) => plot(k).querySelector('svg.chart').hoverMarks;
        const names = (k) => marks(k).filter((m) => m.series === 'runs').map((m) => m.text.split(/[ :]/)[0]);
        return {metric: names('metric'), best: names('best'), timeline: marks('timeline').length,
                parallel: plot('parallel').querySelectorAll('.run').length,
                ticks: [...plot('parallel').querySelectorAll('.axis')].map((a) =>
                  [...a.querySelectorAll('text')].map((t) => t.textContent)),
                captions: [...document.querySelectorAll('.caption')].map((c) => c.textContent),
                succeeded: [...view.rows.values()].filter((r) => r[1] === 'succeeded').length}""")
    assert got["succeeded"] > 4000
    # Bounded, whatever the sweep's size.
    assert 0 < len(got["metric"]) <= 1000 and 0 < len(got["best"]) <= 1000
    assert got["timeline"] <= 1000 and 0 < got["parallel"] <= 300
    # Drawn evenly over the whole sweep: each tenth of it (a.b = 0..9, in the order it ran) holds its share of the
    # dots (the latest runs alone held only a.b 7-9).
    for dots in (got["metric"], got["best"]):
        tenths = [0] * 10
        for name in dots:
            tenths[int(name[1:]) * 10 // n] += 1
        assert all(len(dots) * 0.05 <= t <= len(dots) * 0.15 for t in tenths), tenths
    # The parallel axes cover every value swept: a.b 0..9, stage 0, 1, 2 (whole numbers, no fraction between them).
    axis = got["ticks"]
    assert axis[0] == ["b", *map(str, range(10))], axis[0]
    assert axis[2] == ["stage", "0", "1", "2"], axis[2]
    # Each plot says what it shows.
    metric, best, timeline, parallel = got["captions"]
    assert (f"a sample of 1,000 of the {got['succeeded']:,} runs that succeeded, drawn evenly over the whole sweep"
            in metric)
    assert "drawn evenly over the whole sweep" in best and "a sample of 300 of the" in parallel
    assert "The 1,000 runs that ended last or run now" in timeline
    _keep(browser, tmp_path, "dashboard-big-plots", ".plots")


def test_the_page_reads_at_1400_px(tmp_path, runners, browser):
    long_value, detail = "v" * 3000, "torch.OutOfMemoryError: CUDA out of memory. " + "Tried to allocate 2.00 GiB " * 8
    recorded_sweep(tmp_path / "sweeps" / "readable", 40, strings=[long_value, "short"],
                   key="a_rather_long_swept_key_name", detail=detail, logs=True)
    shown = start_dashboard(runners, tmp_path / "sweeps")
    browser.get(f"{shown.base}/?token={shown.token}")
    wait_until(lambda: browser.execute_script("return document.querySelectorAll('#sweeps tbody td').length > 1"))
    # The list says what its counts count: every one of the 40 but the queued and the running one ended.
    line = browser.execute_script(
        "const heads = [...document.querySelectorAll('#sweeps th')].map((h) => h.textContent);"
        "const cells = [...document.querySelectorAll('#sweeps tbody td')].map((d) => d.textContent);"
        "return Object.fromEntries(heads.map((h, i) => [h, cells[i]]))")
    assert line["ended"] == "38 of 40" and line["succeeded"] == "36" and line["failed"] == "2"
    assert line["best"].endswith("· throughput 5,651"), line["best"]

    (sid,) = shown.sweep_ids()
    browser.get(f"{shown.base}/#/s/{sid}")
    wait_until(lambda: browser.execute_script("return document.querySelectorAll('#experiments tbody tr').length == 40"))
    laid = browser.execute_script("""
        const table = document.getElementById('experiments'), why = [...table.querySelectorAll('.why')];
        const long = [...table.querySelectorAll('td.val')].find((td) => td.title.startsWith('vvv'));
        const name = table.querySelector('td.name');
        return {right: table.getBoundingClientRect().right, width: window.innerWidth, long: long.offsetWidth,
                why: why.map((w) => w.getBoundingClientRect().right), wrap: getComputedStyle(name).overflowWrap,
                wbr: name.querySelectorAll('wbr').length}""")
    assert laid["right"] <= laid["width"], laid  # a 3,000-character value widens nothing
    assert laid["long"] < 300 and laid["why"] and max(laid["why"]) <= laid["width"], laid
    assert laid["wrap"] == "normal"  # names break after their separators only, never mid-word
    _keep(browser, tmp_path, "dashboard-table", ".tabs")

    browser.get(f"{shown.base}/#/s/{sid}/plots")
    wait_until(lambda: browser.execute_script(
        "return [...document.querySelectorAll('.caption')].every((c) => c.textContent) && "
        "document.querySelectorAll('.plot svg.chart').length >= 4"), timeout=120)
    looks = browser.execute_script("""
        const box = (e) => e.getBoundingClientRect();
        const plots = ['metric', 'best', 'timeline', 'parallel'], title = (k) => document.getElementById('title-' + k);
        return {clear: plots.map((k) => box(title(k)).bottom <= box(document.getElementById('plot-' + k)).top),
                titles: plots.map((k) => title(k).textContent),
                bartext: document.querySelectorAll('#plot-timeline .series text').length,
                xticks: [...document.querySelectorAll('#plot-metric .tick.x')].map((t) => t.textContent)}""")
    assert all(looks["clear"]) and looks["bartext"] == 0, looks
    assert looks["xticks"] == ["1", "2", "4", "8"], looks["xticks"]  # every micro-batch swept, as a category
    assert looks["titles"][0] == "best throughput by train_micro_batch_size_per_gpu", looks["titles"]
    _keep(browser, tmp_path, "dashboard-plots", ".plots")

    # A finished run's page: every metric it measured, and its empty logs said empty (not "so far").
    browser.get(f"{shown.base}/#/s/{sid}/run/e00001")
    wait_until(lambda: browser.execute_script("return document.querySelectorAll('#attempts tbody tr').length"))
    run = browser.execute_script(
        "return {heads: [...document.querySelectorAll('#attempts th')].map((h) => h.textContent),"
        "        empty: ['stdout', 'stderr'].map((k) => getComputedStyle(document.getElementById('log-' + k), "
        "'::before').content)}")
    assert {"throughput", "latency", "FLOPS_per_gpu"} <= set(run["heads"]), run
    wait_until(lambda: browser.execute_script(
        "return getComputedStyle(document.getElementById('log-stderr'), '::before').content") == '"(empty)"')

    # The server out of reach: said plainly, with the time the page's data is from; back: the page goes on.
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.emulateNetworkConditions",
                            {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
    wait_until(lambda: "Disconnected" in (browser.execute_script(
        "const b = document.getElementById('offline'); return b && b.textContent") or ""), timeout=30)
    said = browser.execute_script("return [document.getElementById('offline').textContent, document.body.classList"
                                  ".contains('stale'), document.getElementById('live').textContent]")
    assert "as of" in said[0] and said[1] and said[2] == "disconnected", said
    _keep(browser, tmp_path, "dashboard-disconnected")
    browser.execute_cdp_cmd("Network.emulateNetworkConditions",
                            {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
    wait_until(lambda: browser.execute_script("return !document.getElementById('offline') && "
                                              "!document.body.classList.contains('stale')"), timeout=30,
               message="the page back live")
    # The dashboard itself stopped: the same.
    shown.proc.terminate()
    shown.proc.wait(30)
    wait_until(lambda: "Disconnected" in (browser.execute_script(
        "const b = document.getElementById('offline'); return b && b.textContent") or ""), timeout=30)


def test_the_first_sort_by_the_sweeps_metric_puts_its_best_first_as_the_metric_is_declared(tmp_path, runners,
                                                                                           browser):
    """A metric named with its direction (`--metric step_loss:min`) sorts lowest first on the first click,
    whatever its name says; another metric's column keeps the guess by its name (throughput highest first)."""
    recorded_sweep(tmp_path / "sweeps" / "lowest", 12, metric="step_loss:min", extra_metric="step_loss")
    shown = start_dashboard(runners, tmp_path / "sweeps")
    (sid,) = shown.sweep_ids()
    browser.get(f"{shown.base}/?token={shown.token}")
    browser.get(f"{shown.base}/#/s/{sid}")
    wait_until(lambda: browser.execute_script("return document.querySelectorAll('#experiments tbody tr').length == 12"),
               message="the 12 rows")

    def first_sort(column: str) -> list[float]:
        header = f'#experiments th[data-col="metric:{column}"]'
        browser.execute_script("document.querySelector(arguments[0]).click()", header)
        wait_until(lambda: "sorted-" in browser.execute_script("return document.querySelector(arguments[0]).className",
                                                               header))
        cells = browser.execute_script(
            "const i = [...document.querySelectorAll('#experiments th')].indexOf(document.querySelector(arguments[0]));"
            "return [...document.querySelectorAll('#experiments tbody tr')].map((r) => r.children[i].innerText)",
            header)
        return [float(c.replace(",", "")) for c in cells if c and c[0].isdigit()]

    lowest = first_sort("step_loss")
    assert len(lowest) == 9 and lowest == sorted(lowest), lowest  # 12 less the queued, failed and running one
    highest = first_sort("throughput")
    assert len(highest) == 9 and highest == sorted(highest, reverse=True), highest


def test_a_sweep_of_one_run_and_of_odd_values_draws_readable_axes(tmp_path, runners, browser):
    """One run: its time axes span about a minute around it (not years: a range padded by a tenth of the epoch
    seconds); values of every JSON kind (null, booleans, lists) are categories named as written; nothing throws."""
    recorded_sweep(tmp_path / "sweeps" / "one", 1)
    recorded_sweep(tmp_path / "sweeps" / "odd", 7, strings=[None, True, 1.5, "x", [1, 2]])
    shown = start_dashboard(runners, tmp_path / "sweeps")
    parallel = []
    for sid in shown.sweep_ids():
        browser.get(f"{shown.base}/?token={shown.token}#/s/{sid}/plots")
        wait_until(lambda: browser.execute_script("return document.querySelectorAll('.plot svg.chart').length >= 4 "
                                                  "&& [...document.querySelectorAll('.caption')].every((c) => "
                                                  "c.textContent)"), timeout=60)
        got = browser.execute_script("""
            const ticks = (k, q) => [...document.querySelectorAll('#plot-' + k + ' ' + q)].map((t) => t.textContent);
            return {best: ticks('best', '.tick.x'), timeline: ticks('timeline', '.tick.x'),
                    parallel: ticks('parallel', '.tick')}""")
        assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
        for clock in got["best"] + got["timeline"]:
            assert len(clock) in (5, 8) and clock[2] == ":", got  # HH:MM or HH:MM:SS, no date: one day at most
        parallel += got["parallel"]
    assert {"(none)", "true", "1.5", "x", "[1,2]"} <= set(parallel), parallel
