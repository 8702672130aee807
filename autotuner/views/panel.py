"""The live view drawn: `render(state, now)` turns a `LiveState` into a rich renderable, a pure function (the
same state and clock, the same picture), so a test prints it into a recording Console. rich is imported only
when a frame is drawn.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..spec.metrics import format_value
from ..states import State
from .events import one_line
from .livestate import LiveState, Running
from .snapshot import format_slots

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.text import Text

MAX_RUNNING_ROWS = 24
MAX_DETAIL = 160  # characters of a failure's reason shown (the line is cut to the terminal's width as well)
MAX_NODE_ROWS = 32


def seconds(value: float | None) -> str:
    """A duration the way a person reads it: 42s, 3m05s, 2h07m."""
    if value is None:
        return "?"
    value = max(round(value), 0)
    if value < 60:
        return f"{value}s"
    if value < 3600:
        return f"{value // 60}m{value % 60:02d}s"
    return f"{value // 3600}h{value % 3600 // 60:02d}m"


def render(state: LiveState, now: float) -> RenderableType:
    """The live view of `state` at time `now`: a rich renderable (pure: same inputs, same picture)."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.text import Text

    best = Text("best so far: ")
    if state.best is None:
        best.append("none yet", style="dim")
    else:
        best.append(state.best[0], style="bold green")
        best.append(f"  {state.metric.name} {format_value(state.best[1])}")
    parts: list[RenderableType] = [_counts(state), _timing(state, now), best, Text(""), _nodes(state)]
    if state.running:
        parts += [Text(""), _running(state, now)]
    if state.failures:
        parts += [Text(""), _failures(state)]
    return Panel(Group(*parts), title=f"sweep {state.sweep}: {state.metric.name} ({state.metric.direction})",
                 title_align="left", expand=False)


def _counts(state: LiveState) -> Text:
    """`4 done   1 failed   2 timed out   3 running   4 queued   of 14`: failed and timed out apart, as the
    final summary counts them."""
    from rich.text import Text

    counts = state.counts()
    head = Text()
    for label, n, style in (("done", counts.get(State.SUCCEEDED, 0), "green"),
                            ("failed", counts.get(State.FAILED, 0), "red"),
                            ("timed out", counts.get(State.TIMED_OUT, 0), "red"),
                            ("running", counts.get(State.RUNNING, 0), "cyan"),
                            ("queued", counts.get(State.QUEUED, 0), "")):
        if n or label != "timed out":
            head.append(f"{n} {label}", style=style if n else "dim")
            head.append("   ")
    for stopped in (State.STOPPED, State.CANCELLED, State.INTERRUPTED):
        if counts.get(stopped):
            head.append(f"{counts[stopped]} {stopped}   ", style="yellow")
    if state.search is None:
        head.append(f"of {len(state.states)}")
    else:
        budget = f", budget {state.search.trials}" if state.search.trials is not None else ""
        head.append(f"of {len(state.states)} proposed ({state.search.tuner} search{budget})")
    return head


def _timing(state: LiveState, now: float) -> Text:
    """Elapsed and the ETA while the sweep goes on; why it winds down once it stops (no ETA then); at the end,
    the total it took."""
    from rich.text import Text

    total = seconds(now - state.since) if state.since is not None else "?"
    if state.stopping is not None and state.running and state.ended is None:
        timing = Text(f"elapsed {total}   ")
        n = len(state.running)
        timing.append(f"stopping: {state.stopping}; waiting for {n} run{'s' if n > 1 else ''} to end",
                      style="bold yellow")
        return timing
    if state.stopping is not None:
        return Text(f"stopped after {total}: {state.stopping}", style="bold yellow")
    if not state.left:
        return Text(f"finished in {total}", style="bold")
    if state.ended is not None:  # the run returned with work left (held for `resume`, or a fault of the machine)
        return Text(f"ended after {total}", style="bold yellow")
    timing = Text(f"elapsed {total}   ")
    eta, mean = state.eta(now), state.mean_duration()
    if state.search is not None:
        timing.append("ETA ? (the search proposes as runs end)", style="dim")
        if mean is not None:
            timing.append(f" (mean run {seconds(mean)} over {len(state.durations)})", style="dim")
        return timing
    if eta is None:
        timing.append("ETA ? (no run has ended yet)" if mean is None else "ETA ? (no slot is up)", style="dim")
        return timing
    timing.append("ETA < 1s" if eta < 1 else f"ETA ~{seconds(eta)}", style="bold")
    if mean is not None:
        timing.append(f" (mean run {seconds(mean)} over {len(state.durations)})", style="dim")
    return timing


def _nodes(state: LiveState) -> RenderableType:
    """Each node's slots: the key of the run that holds it, `.` free, `x` down."""
    from rich.table import Table
    from rich.text import Text

    owner = {(host, i): r.key for r in state.running for host, ids in r.slots.items() for i in ids}
    nodes = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
    nodes.add_column("node")
    nodes.add_column("slots")
    nodes.add_column("busy", justify="right")
    hosts = list(state.slots)
    for host in hosts[:MAX_NODE_ROWS]:
        ids = state.slots[host]
        cells = Text()
        busy = 0
        for i in ids:
            if host in state.down:
                cells.append("x", style="bold red")
            elif (host, i) in owner:
                busy += 1
                cells.append(owner[(host, i)], style="bold black on cyan")
            else:
                cells.append(".", style="dim")
            cells.append(" ")
        nodes.add_row(host, cells, Text("down", style="red") if host in state.down else f"{busy}/{len(ids)}")
    if len(hosts) > MAX_NODE_ROWS:
        nodes.add_row(f"... {len(hosts) - MAX_NODE_ROWS} more nodes", "", "")
    return nodes


def _running(state: LiveState, now: float) -> RenderableType:
    """What runs: its key, name, attempt, where, for how long against its timeout."""
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold", pad_edge=False)
    shown = state.running[:MAX_RUNNING_ROWS]
    stepping = any(r.steps for r in shown)  # the steps columns only once a run's progress was read
    for column, right in (("", False), ("running", False), ("try", True), ("on", False), ("elapsed", True),
                          ("timeout", True), *((("steps", True), (f"{state.metric.name} so far", True))
                                               if stepping else ())):
        table.add_column(column, justify="right" if right else "left")
    for r in shown:
        elapsed = now - r.started_at
        late = r.timeout is not None and elapsed > 0.8 * r.timeout
        table.add_row(Text(r.key, style="bold black on cyan"), Text(r.name), str(r.attempt),
                      format_slots(r.slots), Text(seconds(elapsed), style="yellow" if late else ""),
                      seconds(r.timeout) if r.timeout is not None else "none",
                      *((str(r.steps or ""), _so_far(r)) if stepping else ()))
    if len(state.running) > MAX_RUNNING_ROWS:
        table.add_row("", f"... {len(state.running) - MAX_RUNNING_ROWS} more", *[""] * (6 if stepping else 4))
    return table


def _so_far(r: Running) -> str:
    """A running attempt's metric so far: its mean and 95% interval (`2,180 (2,150-2,210)`), where known."""
    found = r.so_far
    if found is None:
        return ""
    high = format_value(found.high) if math.isfinite(found.high) else "?"
    return f"{format_value(found.mean)} ({format_value(found.low)}-{high})"


def _failures(state: LiveState) -> RenderableType:
    """The latest failures as they came (oldest first): name, attempt, reason and the line that tells why,
    cut to one line of the terminal."""
    from rich.table import Table
    from rich.text import Text

    shown = len(state.failures)
    title = "failed" if state.failures_seen <= shown else f"failed (latest {shown} of {state.failures_seen})"
    table = Table(box=None, header_style="bold", pad_edge=False)
    longest = max(len(f.name) for f in state.failures)
    table.add_column(title, no_wrap=True, min_width=min(longest, 40))  # the name first: the why gives way
    table.add_column("try", justify="right")
    table.add_column("why", no_wrap=True, overflow="ellipsis", min_width=10)
    for f in state.failures:
        why = Text(f"[{f.reason or f.state}] ", style="red")
        if f.again:  # before the detail, which the terminal's width may cut
            why.append("(queued again) ", style="yellow")
        why.append(one_line(f.detail or "")[:MAX_DETAIL])
        table.add_row(Text(f.name, style="red"), str(f.attempt), why)
    return table
