"""One self-contained HTML page of a sweep: the ranking, the best config ready to copy, its command, the plots.

Nothing on the page needs a network: the CSS is inline and the plots are PNG data URIs. Without matplotlib the
page is written all the same, with a line saying how to get the plots.
"""
from __future__ import annotations

import base64
import json
import time
from html import escape
from pathlib import Path

from ..errors import UserError
from ..files import write_atomic
from ..lock import holder_pid
from ..metrics import format_value
from ..results import OPTIMAL_COMMAND, OPTIMAL_CONFIG, config_file, optimal
from .plots import METRIC_PNG, TIMELINE_PNG, NoMatplotlib, render_plots
from .snapshot import Snapshot, load
from .tables import rows as report_rows

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
tr.cancelled td, tr.interrupted td, tr.queued td { color: #7a808a; }
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
"""

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


def render_html(snap: Snapshot, rows: list[dict], plots: dict[str, bytes] | None, plot_note: str | None,
                runner_pid: int | None, now: float | None = None) -> str:
    """The page, from a snapshot, its report rows (`tables.rows`), PNGs by file name (or None and a note)."""
    now = time.time() if now is None else now
    direction = snap.metric.direction
    best = snap.best
    counts = snap.counts()
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>sweep {escape(snap.name)}</title><style>{_CSS}</style><script>{_COPY_JS}</script>",
           "</head><body><main>",
           f"<h1>sweep {escape(snap.name)}</h1>",
           f'<p class="sub">{escape(snap.metric.name)} ({direction}) &middot; {len(snap.attempts)} experiments '
           f"&middot; {escape(str(snap.directory))} &middot; report of "
           f"{escape(time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now)))}"
           + (f' &middot; <span class="note">still running (runner pid {runner_pid})</span>' if runner_pid else "")
           + "</p>",
           '<p class="counts">' + "".join(f'<span class="{escape(s)}">{n} {escape(s)}</span>'
                                         for s, n in sorted(counts.items())) + "</p>"]
    if best is not None:
        out.append(f'<p class="bestline" id="best"><span class="marker">&#9733; best:</span> '
                   f"<b>{escape(best.name)}</b> with {escape(snap.metric.name)} "
                   f"{escape(format_value(best.metric))}</p>")
    else:
        out.append('<p class="bestline" id="best">no experiment has succeeded yet: no best configuration</p>')
    typed = snap.by_type
    if typed:  # a metric compares only within one GPU type: each type's best
        out.append('<p class="sub">best per GPU type: ' + "; ".join(
            f"{escape(t)}: <b>{escape(a.name)}</b> {escape(format_value(a.metric))} ({escape(config_file(t))})"
            for t, a in snap.best_by_type.items()) + "</p>")

    out.append("<h2>Experiments</h2>")
    out.append('<table id="experiments"><thead><tr><th>#</th><th>name</th>' + ("<th>GPU type</th>" if typed else "")
               + f'<th>state</th><th>{escape(snap.metric.name)}</th><th>time</th><th>slots</th><th>why</th></tr>'
               "</thead><tbody>")
    for r in rows:
        classes = [r["state"]] + (["best"] if r["best"] else [])
        rank = '<span class="marker">&#9733; best</span>' if r["best"] else str(r["rank"] or "")
        why = f"[{r['reason']}] {r['detail'] or ''}" if r["reason"] else ""
        duration = f"{r['duration_s']:.1f}s" if r["duration_s"] is not None else ""
        kind = f"<td>{escape(r['gpu_type'] or '')}</td>" if typed else ""
        out.append(f'<tr class="{" ".join(classes)}" data-name="{escape(r["name"])}"><td class="num">{rank}</td>'
                   f"<td>{escape(r['name'])}</td>{kind}<td>{escape(r['state'])}</td>"
                   f'<td class="num">{escape(format_value(r["metric"]))}</td><td class="num">{duration}</td>'
                   f"<td>{escape(r['slots'])}</td><td class=\"why\">{escape(why)}</td></tr>")
    out.append("</tbody></table>")

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


def write_html(directory: Path, path: Path | None = None, *, x: str | None = None, lines: str | None = None,
               plots: dict[str, bytes] | None = None) -> tuple[Path, str | None]:
    """Write the page (default DIR/report.html); returns its path and a note when the plots are missing."""
    directory = Path(directory)
    snap = load(directory)
    note = None
    if plots is None:
        try:
            plots = render_plots(snap, x, lines)
        except NoMatplotlib as e:
            note = str(e)
    target = Path(path) if path else directory / REPORT_HTML
    page = render_html(snap, report_rows(snap), plots, note, holder_pid(directory)).encode("utf-8")
    try:
        write_atomic(target, page)
    except OSError as e:  # no such directory, read-only, full: the user's choice of place, one line
        raise UserError(f"cannot write the HTML report: {e.strerror or e}", target) from None
    return target, note
