"""One self-contained HTML page of a sweep: the ranking (every swept parameter and metric, sortable by any
column, each run's logs linked), makespan and utilisation, the best config ready to copy, its command, the plots.

Nothing on the page needs a network: the CSS and the few lines of script are inline, the plots are PNG data
URIs, and the logs are relative links into the results directory (they work wherever it is copied, the page
with it). Without matplotlib the page is written all the same, with a line saying how to get the plots.
"""
from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Mapping
from html import escape
from pathlib import Path
from urllib.parse import quote

from ..errors import UserError
from ..files import write_atomic
from ..jsonvalues import JSON
from ..ledger.lock import holder_pid
from ..limits import memory
from ..spec.interval import interval_text
from ..spec.metrics import UNITS, format_compact, format_value
from ..spec.outputs import is_sweep_file, same_file
from ..tune.goal import Goal
from . import cost
from .analysis import all_attempts, timeline_end, utilisation
from .cost import Costing
from .gpu_hours import hours_text
from .panel import seconds
from .plots import METRIC_PNG, TIMELINE_PNG, NoMatplotlib, render_plots
from .records import ExperimentRecord, SweepResults, from_snapshot
from .report import headers
from .snapshot import Snapshot, format_slots, load
from .summary import OPTIMAL_COMMAND, OPTIMAL_CONFIG, config_file, optimal

REPORT_HTML = "report.html"

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2430; margin: 0;
       background: #f6f7f9; }
main { max-width: 1200px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 10px; border-bottom: 1px solid #d8dce3; padding-bottom: 4px; }
.sub { color: #5b6473; margin: 0 0 16px; }
.counts span { display: inline-block; margin-right: 14px; padding: 2px 10px; border-radius: 10px; background: #e7eaf0; }
.counts .succeeded { background: #d9efdf; } .counts .failed, .counts .timed_out { background: #f6d9d6; }
.counts .running { background: #dbe7fa; }
.bestline { font-size: 16px; margin: 14px 0; padding: 10px 14px; background: #fff8df; border: 1px solid #eed27a;
            border-radius: 6px; }
table { border-collapse: collapse; width: 100%; background: #fff; font-size: 13px; }
th, td { padding: 5px 9px; border-bottom: 1px solid #e3e6eb; text-align: left; vertical-align: top; }
th { background: #eef0f4; position: sticky; top: 0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.best td { background: #fff3c4; font-weight: 600; }
tr.failed td, tr.timed_out td { color: #9d2c22; }
tr.cancelled td, tr.interrupted td, tr.queued td, tr.stopped td { color: #7a808a; }
tr.running td { color: #2458a6; }
.why { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; word-break: break-word; }
.marker { color: #b8860b; font-weight: 700; }
pre { background: #1f2430; color: #e8eaf0; padding: 12px 14px; border-radius: 6px; overflow-x: auto;
      font: 12.5px/1.45 ui-monospace, SFMono-Regular, Menlo, monospace; white-space: pre-wrap; word-break: break-all; }
.copy { float: right; font-size: 12px; padding: 3px 10px; cursor: pointer; border: 1px solid #aab; border-radius: 4px;
        background: #fff; }
figure { margin: 0 0 18px; background: #fff; padding: 10px; border: 1px solid #e3e6eb; border-radius: 6px; }
figure img { max-width: 100%; height: auto; display: block; }
figcaption { color: #5b6473; font-size: 12px; margin-top: 6px; }
.note { color: #7a5b00; }
th.sort { cursor: pointer; user-select: none; white-space: nowrap; }
th.sort:hover { background: #e2e6ee; }
th[aria-sort="ascending"]::after { content: " \\25B2"; font-size: 10px; }
th[aria-sort="descending"]::after { content: " \\25BC"; font-size: 10px; }
td.logs a { margin-right: 6px; }
td.num, td.slots, td.logs { white-space: nowrap; }
.usage { margin: 6px 0 0; }
"""

# Click a header to sort by it (again: the other way). Numbers sort as numbers (each cell's data-v), empty cells
# last either way, ties keep their order.
_SORT_JS = """
function sortBy(th) {
  var body = th.closest("table").tBodies[0], i = th.cellIndex;
  var up = th.getAttribute("aria-sort") !== "ascending";
  Array.prototype.forEach.call(th.parentNode.cells, function (c) { c.removeAttribute("aria-sort"); });
  th.setAttribute("aria-sort", up ? "ascending" : "descending");
  function key(row) { var c = row.cells[i], v = c.getAttribute("data-v"); return v === null ? c.textContent : v; }
  var rows = Array.prototype.slice.call(body.rows).map(function (r, n) { return [key(r), n, r]; });
  rows.sort(function (a, b) {
    if (a[0] === "" || b[0] === "") { return (a[0] === "") - (b[0] === "") || a[1] - b[1]; }
    var x = parseFloat(a[0]), y = parseFloat(b[0]);
    var order = isNaN(x) || isNaN(y) ? a[0].localeCompare(b[0]) : x - y;
    return (up ? order : -order) || a[1] - b[1];
  });
  rows.forEach(function (r) { body.appendChild(r[2]); });
}
"""
LOGS = ("stdout.log", "stderr.log", "cmd.txt", "ds_config.json", "metrics.json")

_COPY_JS = """
function copyText(id, button) {
  var text = document.getElementById(id).innerText;
  function done() { button.textContent = "copied"; setTimeout(function () { button.textContent = "copy"; }, 1500); }
  if (navigator.clipboard) { navigator.clipboard.writeText(text).then(done, function () {}); return; }
  var area = document.createElement("textarea"); area.value = text; document.body.appendChild(area);
  area.select(); document.execCommand("copy"); document.body.removeChild(area); done();
}
"""


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def render_html(snap: Snapshot, results: SweepResults, plots: dict[str, bytes] | None, plot_note: str | None,
                runner_pid: int | None, now: float | None = None, *, usage: Mapping[str, JSON] | None = None,
                links: Mapping[str, Mapping[str, str]] | None = None, training: Costing | None = None) -> str:
    """The page, from a snapshot, its records, PNGs by file name (or None and a note), the slots' use
    (`analysis.utilisation`), each experiment's log links (file name -> relative URL) and the training run
    priced (cost.py)."""
    now = time.time() if now is None else now
    direction = snap.metric.direction
    best = snap.best
    counts = snap.counts()
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>sweep {escape(snap.name)}</title><style>{_CSS}</style><script>{_COPY_JS}{_SORT_JS}</script>",
           "</head><body><main>",
           f"<h1>sweep {escape(snap.name)}</h1>",
           f'<p class="sub">{escape(snap.metric.name)} ({direction}) &middot; {len(snap.attempts)} experiments '
           f"&middot; {escape(str(snap.directory))} &middot; report of "
           f"{escape(time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now)))}"
           + (f' &middot; <span class="note">still running (runner pid {runner_pid})</span>' if runner_pid else "")
           + "</p>",
           '<p class="counts">' + "".join(f'<span class="{escape(s)}">{n} {escape(s)}</span>'
                                         for s, n in sorted(counts.items())) + "</p>"]
    if usage is not None:
        out.append(_usage_line(usage))
    if results.hours is not None:
        out.append(f'<p class="usage" id="gpu-hours">{escape(results.hours.line())}</p>')
    if best is not None:
        out.append(f'<p class="bestline" id="best"><span class="marker">&#9733; best:</span> '
                   f"<b>{escape(best.name)}</b> with {escape(snap.metric.name)} "
                   f"{escape(format_value(best.metric))}{escape(interval_text(best.metrics, snap.metric.name))}</p>")
    else:
        out.append('<p class="bestline" id="best">no experiment has succeeded yet: no best configuration</p>')
    typed = snap.by_type
    if typed:  # a metric compares only within one GPU type: each type's best
        out.append('<p class="sub">best per GPU type: ' + "; ".join(
            f"{escape(t)}: <b>{escape(a.name)}</b> {escape(format_value(a.metric))} ({escape(config_file(t))})"
            for t, a in snap.best_by_type.items()) + "</p>")

    out.append("<h2>Experiments</h2>")
    out.append(_experiments_table(results, links or {}))
    if training is not None:
        out.append(_training_section(training))

    found = optimal(snap)
    if found is not None:
        config, command = found
        out.append(f"<h2>Best config <small>({OPTIMAL_CONFIG})</small>"
                   '<button class="copy" onclick="copyText(\'config\', this)">copy</button></h2>'
                   f'<pre id="config">{escape(json.dumps(config, indent=2, sort_keys=True))}</pre>')
        out.append(f"<h2>Command <small>({OPTIMAL_COMMAND})</small>"
                   '<button class="copy" onclick="copyText(\'command\', this)">copy</button></h2>'
                   f'<pre id="command">{escape(command)}</pre>')

    out.append("<h2>Plots</h2>")
    captions = {METRIC_PNG: "The metric against the swept keys; the star marks the best, crosses mark "
                                   "failures.",
                TIMELINE_PNG: "Every slot of every node over the sweep: one bar per attempt, white space is "
                                     "idle time."}
    if plots:
        for name, png in plots.items():
            out.append(f'<figure><img id="{escape(name.rsplit(".", 1)[0])}" alt="{escape(name)}" '
                       f'src="{_data_uri(png)}"><figcaption>{escape(captions.get(name, name))}</figcaption></figure>')
    else:
        out.append(f'<p class="note">{escape(plot_note or "no plots")}</p>')
    out.append("</main></body></html>")
    return "\n".join(out) + "\n"


def _training_section(training: Costing) -> str:
    """The training run priced for each config: a table, the front marked, the answer and its basis."""
    head = "".join(f"<th>{escape(h)}</th>" for h in cost.headers(training))
    rows = "".join("<tr" + (' class="front"' if c.front else "") + ">" + "".join(f"<td>{escape(v)}</td>" for v in row)
                   + "</tr>" for c, row in zip(training.candidates, cost.cells(training), strict=True))
    notes = "".join(f"<li>{escape(line)}</li>" for line in cost.notes(training))
    return (f'<h2 id="training">Training run <small>({escape(cost.title(training))})</small></h2>'
            f'<table class="training"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table><ul>{notes}</ul>')


def _sortable(label: str, title: str = "") -> str:
    hint = f"{title}; click to sort" if title else "click to sort"
    return f'<th class="sort" title="{escape(hint)}" onclick="sortBy(this)">{escape(label)}</th>'


def _number(value: object) -> str:
    """A cell's sort key: the number itself (no rounding, no thousands separators), or empty."""
    return "" if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) else repr(value)


def _experiments_table(results: SweepResults, links: Mapping[str, Mapping[str, str]]) -> str:
    """Every experiment: rank, name, state, swept parameters, metrics, time, slots, why, and its files."""
    short = headers(results.parameters,
                    ("#", "name", "state", *results.metric_columns(), "time", "GPU-h", "peak mem", "slots", "why"))
    head = [_sortable("#", "rank"), _sortable("name"), *([_sortable("GPU type")] if results.typed else []),
            _sortable("state"),
            *(_sortable(short[k], k) for k in results.parameters),
            *(_sortable(c, f"{m} ({UNITS[m]})" if m in UNITS else m)
              for c, m in zip(results.metric_columns(), results.metrics, strict=True)),
            _sortable("time", "seconds it ran"), _sortable("GPU-h", "GPU-hours its attempts held, retries included"),
            *([_sortable("peak mem", "the most it held on one GPU")] if results.measured_memory else []),
            _sortable("slots"), _sortable("why"), "<th>files</th>"]
    out = ['<table id="experiments"><thead><tr>' + "".join(head) + "</tr></thead><tbody>"]
    out += [_experiment_row(r, results, links.get(r.name, {})) for r in results]
    out.append("</tbody></table>")
    return "\n".join(out)


def _experiment_row(r: ExperimentRecord, results: SweepResults, files: Mapping[str, str]) -> str:
    classes = [r.state] + (["best"] if r.best else [])
    rank = '<span class="marker">&#9733; best</span>' if r.best else str(r.rank or "")
    why = f"[{r.reason}] {r.detail or ''}" if r.reason else ""
    duration = f"{r.duration:.1f}s" if r.duration is not None else ""
    cells = [f'<td class="num" data-v="{r.rank or ""}">{rank}</td>', f"<td>{escape(r.name)}</td>",
             *([f"<td>{escape(r.gpu_type or '')}</td>"] if results.typed else []), f"<td>{escape(r.state)}</td>"]
    for key in results.parameters:
        value = r.parameters[key]
        text = "" if value is None else value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        cells.append(f'<td class="num" data-v="{_number(value)}">{escape(text)}</td>' if _number(value) else
                     f"<td>{escape(text)}</td>")
    for name in results.metrics:
        value = r.metrics.get(name)
        cells.append(f'<td class="num" data-v="{_number(value)}" title="{escape(format_value(value))}">'
                     f"{escape(format_compact(value)) if value is not None else ''}</td>")
    cells.append(f'<td class="num" data-v="{_number(r.duration)}">{duration}</td>')
    cells.append(f'<td class="num" data-v="{_number(r.gpu_hours)}">{hours_text(r.gpu_hours)}</td>')
    if results.measured_memory:
        peak = memory(r.peak_memory) if r.peak_memory is not None else ""
        cells.append(f'<td class="num" data-v="{_number(r.peak_memory)}">{peak}</td>')
    cells += [f'<td class="slots">{escape(format_slots(r.slots))}</td>', f'<td class="why">{escape(why)}</td>',
              '<td class="logs">' + " ".join(f'<a href="{escape(url)}">{escape(name.split(".")[0])}</a>'
                                             for name, url in files.items()) + "</td>"]
    return f'<tr class="{" ".join(classes)}" data-name="{escape(r.name)}">' + "".join(cells) + "</tr>"


def _usage_line(use: Mapping[str, JSON]) -> str:
    """Makespan and how busy the slots were: the sweep's and each host's."""
    if use.get("utilisation") is None:
        return '<p class="usage" id="usage">nothing has started yet</p>'
    hosts = ", ".join(f"{escape(h)} {share:.0%}" for h, share in use["per_host"].items() if share is not None)
    return (f'<p class="usage" id="usage">makespan <b>{seconds(use["makespan_s"])}</b> &middot; utilisation '
            f'<b>{use["utilisation"]:.0%}</b> ({use["busy_slot_s"]:,.0f} busy slot-seconds of {use["slots"]} '
            f'slots &times; {use["makespan_s"]:,.0f} s)' + (f" &middot; per host: {hosts}" if hosts else "") + "</p>")


def log_links(directory: Path, page: Path, names: list[str]) -> dict[str, dict[str, str]]:
    """name -> {file: URL relative to the page} for each experiment's files that exist (LOGS)."""
    base = os.path.relpath(directory.resolve(), page.resolve().parent)
    out: dict[str, dict[str, str]] = {}
    for name in names:
        found = {f: Path(base, name, f).as_posix() for f in LOGS if (directory / name / f).is_file()}
        if found:
            out[name] = {f: _url(u) for f, u in found.items()}
    return out


def _url(path: str) -> str:
    """A relative path as a URL: each part percent-encoded (names are safe, directories may not be)."""
    return quote(path, safe="/")


def _not_the_sweeps(directory: Path, target: Path, snap: Snapshot) -> None:
    """The page is written whole over `target`: never over a sweep's own files but its page (its summary, best
    config, hostfile..., as spelled or where links lead: `is_sweep_file`), nor into a run's directory (its logs,
    config, metrics the page links to)."""
    if target.name != REPORT_HTML and is_sweep_file(target):
        raise UserError("is one of the sweep's own files; --html wants a file of its own", target)
    if target.parent.name in snap.experiments and same_file(target.parent.parent, directory):
        raise UserError(f"is in the directory of the sweep's experiment {target.parent.name}; --html wants a file of "
                        "its own", target)


def write_html(directory: Path, path: Path | None = None, *, x: str | None = None, lines: str | None = None,
               plots: dict[str, bytes] | None = None, goal: Goal | None = None) -> tuple[Path, str | None]:
    """Write the page (default DIR/report.html); returns its path and a note when the plots are missing.
    `goal`: the training run to price the configs for, over the one the tune recorded (cost.py)."""
    directory = Path(directory)
    snap = load(directory)
    training = cost.costing(snap, cost.goal_of(snap, goal))
    note = None
    if plots is None:
        try:
            plots = render_plots(snap, x, lines)
        except NoMatplotlib as e:
            note = str(e)
    target = Path(path) if path else directory / REPORT_HTML
    _not_the_sweeps(directory, target, snap)
    attempts = all_attempts(directory)
    usage = utilisation(attempts, snap.slots, timeline_end(directory, attempts))
    links = log_links(directory, target, [a.name for a in snap.attempts])
    page = render_html(snap, from_snapshot(snap), plots, note, holder_pid(directory), usage=usage,
                       links=links, training=training).encode("utf-8")
    try:
        write_atomic(target, page)
    except OSError as e:  # no such directory, read-only, full: the user's choice of place, one line
        raise UserError(f"cannot write the HTML report: {e.strerror or e}", target) from None
    return target, note
