"""What people and scripts read of a sweep, all from its ledger: the read model, the report, status and hosts
tables, two sweeps compared, plots, one HTML page, the live terminal view and the event streams.

- `snapshot`: `Snapshot`, the read model every view starts from (also the runner's result).
- `tables`: `render_table`, the one table renderer (fitted to a terminal's width and colour, `Output`).
- `report`: `autotune report` in every format; `status`: `autotune status`, and how `run` / `resume` end.
- `records`: a sweep's results for programs (`autotuner.load`): one record per experiment with its swept
  parameters and metrics, flat rows, a pandas DataFrame; the report's outputs are made from them.
- `hosts`: `autotune hosts` output, whatever the kind of cluster (the backend's HostsCheck).
- `compare`: two sweeps side by side.
- `analysis`: what the plots show, without matplotlib; `plots`: the figures (matplotlib only when drawn).
- `html`: the self-contained page.
- `live`: the terminal view of a running sweep and `watching`, which wires the observers a run is watched with.
  What it shows at one instant is `livestate.LiveState`, drawn by `panel.render`; its ETA is `eta.Eta`'s.
- `events`: the JSON event log (`--events`) and the plain one-line-per-event printer.

Nothing here imports matplotlib or torch on import, and each name below is imported from its module on first
use, so `autotune report` and `status` stay light. The functions named like their modules (`snapshot.snapshot`,
`compare.compare`) are not lifted here, so that `autotuner.views.snapshot` stays the module.
"""
from __future__ import annotations

import importlib
from typing import Any

# name -> its module: each imported on first use, so `autotune status` does not load the live view, the HTML
# page or the comparison to print a table (20 ms of every read command's start).
_LAZY = {
    "Comparison": "compare", "render_compare": "compare",
    "EventLog": "events", "PlainPrinter": "events", "check_events_path": "events",
    "write_html": "html",
    "LiveView": "live", "watching": "live",
    "write_plots": "plots",
    "ExperimentRecord": "records", "SweepResults": "records", "load_results": "records",
    "Snapshot": "snapshot", "load": "snapshot",
    "render_hosts_check": "hosts",
    "render_report": "report", "render_result": "status", "render_status": "status",
    "Output": "tables",
}

__all__ = [
    "Comparison",
    "EventLog",
    "ExperimentRecord",
    "LiveView",
    "Output",
    "PlainPrinter",
    "Snapshot",
    "SweepResults",
    "check_events_path",
    "load",
    "load_results",
    "render_compare",
    "render_hosts_check",
    "render_report",
    "render_result",
    "render_status",
    "watching",
    "write_html",
    "write_plots",
]


def __getattr__(name: str) -> Any:
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
