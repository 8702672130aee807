"""Pictures of a sweep, drawn from its ledger: the metric against two swept keys, and the slot timeline.

matplotlib is an optional extra (`pip install 'ds-autotune[plots]'`): it is imported only here, only when a plot
is asked for, and its absence is a one-line error that says how to install it. Figures are built with the
object-oriented API (no pyplot, no GUI backend), so drawing works on a headless machine and in threads.

- `metric_figure`: the metric against one swept ds_config key (default: the micro-batch size), one line per
  value of another (default: the ZeRO stage). Where other keys vary too, each point is the best over them.
  Failed experiments are marked on the x axis, the best one with a star.
- `timeline_figure`: every slot of every node over the sweep, a bar per attempt on the slots it held (from
  the ledger's started_at / finished_at / slots), so idle gaps show as white space; utilisation (busy
  slot-seconds / (slots x makespan)) for the sweep and per node.

What the figures show is worked out in `analysis`, which needs no matplotlib.
"""
from __future__ import annotations

import io
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from ..errors import UserError
from ..files import write_atomic
from ..jsonvalues import JSON
from ..ledger.store import Attempt
from ..ledger.swept import MISSING
from ..spec import ABBREVIATIONS
from ..spec.metrics import UNITS, Metric, format_value
from ..states import State
from ..tune.goal import Goal
from .analysis import all_attempts, choose_axes, slot_rows, swept_keys, timeline_end, utilisation, value_of
from .cost import Costing, costing, goal_of, title
from .gpu_hours import gpu_hours
from .snapshot import Snapshot

if TYPE_CHECKING:  # matplotlib is an optional extra: its types only for the checker
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

Position = Callable[[JSON], float]  # an x value's place on the axis (x values: JSON leaves, lists and objects frozen)

METRIC_PNG = "plot_metric.png"
TIMELINE_PNG = "plot_timeline.png"
FRONT_PNG = "plot_front.png"  # the training run's time against its cost, the front marked (cost.py)
INSTALL_HINT = ("plots need matplotlib, which is not installed: pip install 'ds-autotune[plots]' "
                "(or pip install matplotlib)")

_STATE_COLORS: dict[str, str] = {State.SUCCEEDED: "#4c9a5f", State.FAILED: "#c8453c", State.TIMED_OUT: "#e08a2c",
                                State.CANCELLED: "#9a9a9a", State.STOPPED: "#6b8fb3", State.INTERRUPTED: "#b3a16b",
                                State.RUNNING: "#3b7dd8", State.QUEUED: "#dddddd"}


class NoMatplotlib(UserError):
    """Plots were asked for and matplotlib is not installed: one line that says how to install it."""


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise NoMatplotlib(INSTALL_HINT) from None


def _label(key: str) -> str:
    return {"train_micro_batch_size_per_gpu": "micro-batch size per GPU", "zero_optimization.stage": "ZeRO stage",
            "gradient_accumulation_steps": "gradient accumulation steps"}.get(key, key)


def _short(key: str) -> str:
    return {"zero_optimization.stage": "ZeRO"}.get(key) or ABBREVIATIONS.get(key) or key.rsplit(".", 1)[-1]


# --- the metric plot -----------------------------------------------------------------------------------------
def _sort_key(value: JSON) -> tuple:
    """Numbers in order before everything else (as text)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, str(value))


# Line colours: matplotlib's tab10 without its red, which marks failures and so is no line's colour.
LINE_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
LINE_STYLES = ("-", "--", ":", "-.")  # after nine lines, the colours again with another dash
FAILURE_COLOR = "#d62728"
_FAILURE_MARKERS = {"oom": "X", "timeout": "v", "config": "s", "metrics": "D", "exit": "P"}  # else "o"


def _axis_label(metric: Metric) -> str:
    """The y axis: the metric with its unit where it has a known one, and which way is better."""
    unit = UNITS.get(metric.name)
    return f"{metric.name} ({unit})\n{metric.direction}" if unit else f"{metric.name} ({metric.direction})"


def metric_figure(snap: Snapshot, x: str | None = None, lines: str | None = None) -> Figure:
    from matplotlib.figure import Figure

    experiments = list(snap.experiments.values())
    x, lines = choose_axes(experiments, x, lines)
    others = [k for k in swept_keys(experiments) if k not in (x, lines)]
    points: dict[JSON, dict[JSON, list[tuple[float, str]]]] = {}
    failures: list[tuple[JSON, JSON, str]] = []  # (x, line value, reason)
    broken: dict[JSON, set] = {}  # line -> x values where it has only failures: the line has a gap there
    for a in snap.attempts:
        e = snap.experiments.get(a.name)
        if e is None:
            continue
        xv, lv = value_of(e, x), (value_of(e, lines) if lines else None)
        if xv is MISSING:
            continue
        lv = None if lv is MISSING else lv
        if a.state == State.SUCCEEDED and a.metric is not None:
            points.setdefault(_freeze(lv), {}).setdefault(_freeze(xv), []).append((a.metric, a.name))
        elif a.state in (State.FAILED, State.TIMED_OUT):
            failures.append((_freeze(xv), _freeze(lv), str(a.reason or a.state)))
            broken.setdefault(_freeze(lv), set()).add(_freeze(xv))

    xs = sorted({xv for by_x in points.values() for xv in by_x} | {xv for xv, _, _ in failures}, key=_sort_key)
    numeric = bool(xs) and all(_sort_key(v)[0] == 0 for v in xs)
    position = (lambda v: float(v)) if numeric else {v: i for i, v in enumerate(xs)}.__getitem__
    rows = sorted({lv for _, lv, _ in failures}, key=_sort_key)

    fig = Figure(figsize=(9, 5.5 + (0.35 * len(rows) + 0.4 if failures else 0)), dpi=110, layout="constrained")
    if failures:  # a strip of their own under the plot: a failure is not a value, and hides nothing there
        grid = fig.add_gridspec(2, 1, height_ratios=[5.5, 0.35 * len(rows) + 0.4])
        ax = fig.add_subplot(grid[0])
        strip = fig.add_subplot(grid[1], sharex=ax)
    else:
        ax = strip = fig.add_subplot()
    best_point = _draw_lines(ax, snap, points, broken, position, lines)
    if failures:
        _draw_failures(strip, failures, rows, position, lines)
        ax.tick_params(labelbottom=False)
    if best_point is not None:
        bx, by, name = best_point
        ax.plot([bx], [by], marker="*", markersize=20, color="#f2b705", markeredgecolor="black", linestyle="none",
                zorder=5, label=f"best: {name}")
        ax.annotate(f"{format_value(by)}", (bx, by), textcoords="offset points", xytext=(0, 12), ha="center",
                    fontsize=9, fontweight="bold")
    if not points:
        ax.text(0.5, 0.5, "no experiment has succeeded yet", transform=ax.transAxes, ha="center", va="center",
                fontsize=13, color="#777777")
    _x_axis(strip, xs, position, numeric)
    strip.set_xlabel(_label(x) + (f"\n(each point: the best over {', '.join(others)})" if others else ""))
    ax.set_ylabel(_axis_label(snap.metric))
    ax.set_ylim(bottom=0)
    if points:
        top = max(v for by_x in points.values() for values in by_x.values() for v, _ in values)
        ax.set_ylim(top=top * 1.12 if top > 0 else None)  # room for the best's label
    ax.grid(True, alpha=0.3)
    title = f"{snap.name}: {snap.metric.name} by {_label(x)}" + (f", one line per {_label(lines)}" if lines else "")
    ax.set_title(title, fontsize=12)
    if points:
        ax.legend(loc="best", fontsize=9, framealpha=0.85)
    return fig


def _draw_lines(ax: Axes, snap: Snapshot, points: dict[JSON, dict[JSON, list[tuple[float, str]]]],
                broken: dict[JSON, set], position: Position, lines: str | None) -> tuple[float, float, str] | None:
    """One line per value of the `lines` key, each its own colour (never the failures' red); where the best
    experiment is."""
    best = snap.best
    best_point = None
    for n, lv in enumerate(sorted(points, key=_sort_key)):
        by_x = points[lv]
        order = sorted(by_x, key=_sort_key)
        gaps = sorted(broken.get(lv, set()) - set(by_x), key=_sort_key)
        drawn = sorted(order + gaps, key=_sort_key)
        ys = [_best_value(snap, by_x[xv]) if xv in by_x else float("nan") for xv in drawn]
        ax.plot([position(v) for v in drawn], ys, marker="o", linewidth=2, markersize=6,
                color=LINE_COLORS[n % len(LINE_COLORS)], linestyle=LINE_STYLES[n // len(LINE_COLORS) % 4],
                label=f"{_short(lines)} {lv}" if lines else snap.metric.name)
        for xv in order:
            for value, name in by_x[xv]:
                if best is not None and name == best.name:
                    best_point = (position(xv), value, name)
    return best_point


def _draw_failures(strip: Axes, failures: list[tuple[JSON, JSON, str]], rows: list[JSON], position: Position,
                   lines: str | None) -> None:
    """Failed and timed-out experiments in their strip: a row per line value, a marker per reason (red, no
    line's colour), side by side where several reasons meet at one x, `x2` beside a marker that stands for two."""
    from matplotlib.transforms import offset_copy

    count = Counter(failures)
    row_of = {lv: i for i, lv in enumerate(rows)}
    figure = cast("Figure", strip.figure)  # ours is drawn on a Figure, never a SubFigure
    for (xv, lv), reasons in _group(count).items():
        for n, reason in enumerate(reasons):
            shift = offset_copy(strip.transData, fig=figure, x=(n - (len(reasons) - 1) / 2) * 13, units="points")
            strip.plot([position(xv)], [row_of[lv]], marker=_FAILURE_MARKERS.get(reason, "o"), markersize=9,
                       color=FAILURE_COLOR, markeredgecolor="black", markeredgewidth=0.6, linestyle="none",
                       transform=shift, clip_on=False)
            times = count[(xv, lv, reason)]
            if times > 1:
                strip.annotate(f"\u00d7{times}", (position(xv), row_of[lv]), xycoords=shift,
                               textcoords="offset points", xytext=(6, 4), fontsize=8, color=FAILURE_COLOR)
    totals = Counter(reason for _, _, reason in failures)
    handles = [strip.plot([], [], marker=_FAILURE_MARKERS.get(r, "o"), color=FAILURE_COLOR, markeredgecolor="black",
                          markeredgewidth=0.6, linestyle="none", label=f"{r} ({n})")[0]
               for r, n in sorted(totals.items())]
    strip.legend(handles=handles, title="failed", loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8,
                 title_fontsize=8, frameon=False)
    strip.set_yticks(range(len(rows)))
    strip.set_yticklabels([f"{_short(lines)} {lv}" if lines and lv is not None else "failed" for lv in rows],
                          fontsize=8)
    strip.set_ylim(len(rows) - 0.5, -0.5)
    strip.grid(True, axis="x", alpha=0.3)


def _group(count: Iterable[tuple[JSON, JSON, str]]) -> dict[tuple[JSON, JSON], list[str]]:
    """(x, line value) -> the reasons of failures there, in order."""
    out: dict[tuple[JSON, JSON], list[str]] = {}
    for xv, lv, reason in sorted(count, key=lambda k: (_sort_key(k[0]), _sort_key(k[1]), k[2])):
        out.setdefault((xv, lv), []).append(reason)
    return out


def _x_axis(ax: Axes, xs: list[JSON], position: Position, numeric: bool) -> None:
    from matplotlib.ticker import FixedLocator, NullLocator

    if numeric and min(xs) > 0 and max(xs) / min(xs) >= 8:
        ax.set_xscale("log", base=2)
    if xs:
        ax.xaxis.set_major_locator(FixedLocator([position(v) for v in xs]))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([str(v) for v in xs])


def _best_value(snap: Snapshot, values: list[tuple[float, str]]) -> float:
    """The best of the (value, name) points at one x: where other keys vary too, the line shows the best."""
    return min(values, key=lambda point: snap.metric.sort_key(point[0]))[0]


def _freeze(value: JSON) -> JSON:
    return json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else value


# --- the timeline --------------------------------------------------------------------------------------------
def _labels(a: Attempt, sweep: str, is_best: bool) -> list[str]:
    """A bar's label, longest first: the name, then the name without the sweep's prefix."""
    suffix = (f" #{a.attempt}" if a.attempt > 1 else "") + (" \u2605" if is_best else "")
    names = [a.name]
    if a.name.startswith(sweep + "_") and len(a.name) > len(sweep) + 1:
        names.append(a.name[len(sweep) + 1:])
    labels = [n + suffix for n in names]
    if is_best:
        labels.append("\u2605 best")
    elif a.state in (State.FAILED, State.TIMED_OUT):
        labels.append(a.reason or a.state)
    return labels


_Corners = tuple[tuple[float, float], ...]  # a bar's, for a PolyCollection
# The most labels the slot axis holds (5-point type on the tallest figure, 60 inches): a plan on 1,024 nodes has
# 8,192 slots, each label measured and drawn over a dozen others (most of a minute, unreadable).
_LABELS = 300


def timeline_figure(name: str, slots: dict[str, list[int]], attempts: Sequence[Attempt], now: float | None = None,
                    best: Attempt | None = None, xlabel: str = "seconds since the first start",
                    spent: str | None = None) -> Figure:
    """The slot timeline of a sweep (`name`, its `slots`), a ledger's attempts or a plan's; `spent`, a line under
    its title (a sweep's GPU-hours). The bars, one per
    attempt and slot, are drawn as a few collections (the best outlined, running hatched), not a patch each: a
    plan of 10,000 experiments on 1,024 nodes has 140,000 bars, and a patch each took minutes to draw."""
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    now = time.time() if now is None else now
    rows = slot_rows(slots, attempts)
    for h, i in rows:
        slots.setdefault(h, [])
        if i not in slots[h]:
            slots[h].append(i)
    index = {row: n for n, row in enumerate(rows)}
    use = utilisation(attempts, slots, now)
    height = min(1.8 + 0.32 * len(rows), 60)
    fig = Figure(figsize=(12, height), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    start = use.get("start", now)
    span = max(use["makespan_s"], 1e-6)
    width_px = 12 * 100 * 0.78
    bars: dict[tuple[bool, bool], tuple[list[_Corners], list[str]]] = {}  # (best, running) -> corners, colours
    labelled = len(rows) <= 120  # more rows than that leave no room for a label
    for a in attempts:
        if a.started_at is None:
            continue
        s = a.started_at - start
        e = (a.finished_at if a.finished_at is not None else now) - start
        color = _STATE_COLORS.get(a.state, "#999999")
        is_best = best is not None and a.name == best.name and a.attempt == best.attempt
        corners, colours = bars.setdefault((is_best, a.state == State.RUNNING), ([], []))
        end = s + max(e - s, span * 0.002)
        for host, ids in a.slots.items():
            for i in ids:
                y = index[(host, i)]
                corners.append(((s, y - 0.39), (s, y + 0.39), (end, y + 0.39), (end, y - 0.39)))
                colours.append(color)
                room = (e - s) / span * width_px / 6.3  # characters that fit in the bar
                label = next((t for t in _labels(a, name, is_best) if len(t) <= room), None) if labelled else None
                if label:
                    ax.text(s + (e - s) / 2, y, label, ha="center", va="center", fontsize=7.5,
                            color="white" if a.state != State.QUEUED else "black", clip_on=True)
    edge = 0.8 if height * 72 / max(len(rows), 1) >= 4 else 0  # rows of a few points: a white edge hid the bars
    for (is_best, running), (corners, colours) in sorted(bars.items()):  # the running, then the best on top
        ax.add_collection(PolyCollection(corners, facecolors=colours, edgecolors="black" if is_best else "white",
                                         linewidths=2 if is_best else edge, hatch="//" if running else None,
                                         alpha=0.95), autolim=False)
    labelled_rows = range(0, len(rows), max(1, -(-len(rows) // _LABELS)))  # every row while they have room
    ax.set_yticks(labelled_rows)
    ax.set_yticklabels([f"{h}:{i}" for h, i in (rows[n] for n in labelled_rows)],
                       fontsize=8 if len(rows) <= 60 else 5)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, span * 1.01)
    ax.set_xlabel(xlabel)
    ax.grid(True, axis="x", alpha=0.3)
    # a line between nodes, and each node's utilisation at the right (while their names have room)
    first, counts, named = 0, Counter(h for h, _ in rows), len(slots) <= _LABELS // 2
    for host in slots:
        count = counts[host]
        if first and named:
            ax.axhline(first - 0.5, color="#444444", linewidth=0.8)
        share = use["per_host"].get(host)
        if count and named:
            ax.text(1.005, 1 - (first + count / 2) / len(rows), f"{host}\n{share:.0%}" if share is not None else host,
                    transform=ax.transAxes, fontsize=8, va="center", ha="left")
        first += count
    total = use["utilisation"]
    if total is None:  # nothing has started: an empty chart of the slots, without a time scale
        ax.set_xlim(0, 1)
        ax.set_xticks([])
    heading = (f"{name}: slot timeline    utilisation {total:.0%} ({use['busy_slot_s']:,.0f} busy slot-s of "
               f"{use['slots']} slots x {use['makespan_s']:,.0f} s makespan)" if total is not None
               else f"{name}: slot timeline (nothing has started yet)")
    ax.set_title(heading + (f"\n{spent}" if spent else ""), fontsize=11, loc="left")
    present = {a.state for a in attempts if a.started_at is not None}
    handles = [Patch(facecolor=_STATE_COLORS[s], label=s, hatch="//" if s == State.RUNNING else None)
               for s in _STATE_COLORS if s in present]
    if best is not None:
        handles.append(Patch(facecolor=_STATE_COLORS[State.SUCCEEDED], edgecolor="black", linewidth=2,
                             label=f"best: {best.name}"))
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 6), fontsize=8,
                   frameon=False)
    return fig


def front_figure(costing: Costing) -> Figure:
    """Each config's time to train against its cost (GPU-hours where not priced), one colour per size (GPUs, nodes);
    the front joined as a step line, the fastest and the cheapest within the deadline named, the deadline drawn."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.add_subplot()
    spend = "cost" if costing.goal.priced else "GPU-hours"
    for gpus, nodes in sorted({(c.gpus, c.nodes) for c in costing.candidates}):
        group = [c for c in costing.candidates if (c.gpus, c.nodes) == (gpus, nodes)]
        ax.scatter([c.days for c in group], [c.spend for c in group], s=18, alpha=0.7, label=group[0].where)
    front = sorted((c for c in costing.candidates if c.front), key=lambda c: c.days)
    ax.step([c.days for c in front], [c.spend for c in front], where="post", color="black", linewidth=1,
            label="front (not beaten on both)")
    named = {costing.fastest.name: "fastest", **({costing.cheapest: "cheapest"} if costing.cheapest else {})}
    for c in costing.candidates:
        if c.name in named:
            what = "fastest and cheapest" if costing.cheapest == costing.fastest.name else named[c.name]
            ax.annotate(f"{what}: {c.name}", (c.days, c.spend), textcoords="offset points", xytext=(6, 6),
                        fontsize=8)
    if costing.goal.deadline_days is not None:
        ax.axvline(costing.goal.deadline_days, color="#c8453c", linestyle="--", linewidth=1,
                   label=f"deadline {costing.goal.deadline_days:g} days")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("days to train (measured throughput)")
    ax.set_ylabel(spend)
    ax.set_title(f"training run: {title(costing)}", fontsize=10)
    ax.legend(fontsize=8)
    return fig


# --- files ---------------------------------------------------------------------------------------------------
def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def render_plots(snap: Snapshot, x: str | None = None, lines: str | None = None,
                 now: float | None = None, training: Costing | None = None) -> dict[str, bytes]:
    """{file name: PNG bytes} of both plots, and of the training run's front where it is priced."""
    _require_matplotlib()
    attempts = all_attempts(snap.directory)
    now = timeline_end(snap.directory, attempts) if now is None else now
    return {METRIC_PNG: _png(metric_figure(snap, x, lines)),
            TIMELINE_PNG: _png(timeline_figure(snap.name, snap.slots, attempts, now, snap.best,
                                               spent=gpu_hours(snap).line())),
            **({FRONT_PNG: _png(front_figure(training))} if training is not None else {})}


def write_plots(snap: Snapshot, x: str | None = None, lines: str | None = None,
                goal: Goal | None = None) -> list[Path]:
    """Draw the plots into the sweep's directory (the front's too, with a training run: `goal` over the one the
    tune recorded); returns their paths."""
    paths = []
    for name, data in render_plots(snap, x, lines, training=costing(snap, goal_of(snap, goal))).items():
        try:
            write_atomic(snap.directory / name, data)
        except OSError as e:  # a read-only or full results directory
            raise UserError(f"cannot write the plot: {e.strerror or e}", snap.directory / name) from None
        paths.append(snap.directory / name)
    return paths
