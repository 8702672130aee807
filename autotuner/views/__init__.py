"""What people and scripts read of a sweep, all from its ledger: the read model, the report, status and hosts
tables, two sweeps compared, plots, one HTML page, the live terminal view and the event streams.

- `snapshot`: `Snapshot`, the read model every view starts from (also the runner's result).
- `tables`: `autotune report` / `status` / `hosts` output, and `render_table`, the one table renderer (fitted
  to a terminal's width and colour, `Output`).
- `records`: a sweep's results for programs (`autotuner.load`): one record per experiment with its swept
  parameters and metrics, flat rows, a pandas DataFrame; the report's outputs are made from them.
- `compare`: two sweeps side by side.
- `analysis`: what the plots show, without matplotlib; `plots`: the figures (matplotlib only when drawn).
- `html`: the self-contained page.
- `live`: the terminal view of a running sweep and `watching`, which wires the observers a run is watched with.
- `events`: the JSON event log (`--events`) and the plain one-line-per-event printer.

Nothing here imports matplotlib or torch on import, so `autotune report` and `status` stay light. The
functions named like their modules (`snapshot.snapshot`, `compare.compare`) are not lifted here, so that
`autotuner.views.snapshot` stays the module.
"""
from __future__ import annotations

from .compare import Comparison, render_compare
from .events import EventLog, PlainPrinter, check_events_path
from .html import write_html
from .live import LiveView, watching
from .plots import write_plots
from .records import ExperimentRecord, SweepResults, load_results
from .snapshot import Snapshot, load
from .tables import Output, render_hosts, render_report, render_result, render_status

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
    "render_hosts",
    "render_report",
    "render_result",
    "render_status",
    "watching",
    "write_html",
    "write_plots",
]
