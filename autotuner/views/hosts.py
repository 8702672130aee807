"""The text of `autotune hosts`, whatever the kind of cluster: each backend describes its hosts as a HostsCheck
(backends/base.py); this renders one as a table, JSON, CSV or Markdown."""
from __future__ import annotations

import csv
import io
import json

from ..backends.base import HostsCheck
from ..errors import UserError
from .tables import FORMATS, PLAIN, Cell, Column, Output, Styled, markdown_table, render_table


def render_hosts_check(check: HostsCheck, fmt: str = "table", output: Output = PLAIN) -> str:
    """One row per host, its state green where the host can run, red where not (coloured only on a terminal)."""
    if fmt not in FORMATS:
        raise UserError(f"unknown --format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "json":
        return json.dumps(check.json, indent=2) + "\n"
    if fmt == "csv":
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerows([check.columns, *check.rows])
        return buffer.getvalue()
    if fmt == "md":
        return markdown_table(check.columns, check.rows)
    at = check.columns.index(check.state)
    styled: list[tuple[Cell, ...]] = [(*c[:at], Styled(c[at], "green" if usable else "red"), *c[at + 1:])
                                      for c, usable in zip(check.rows, check.usable, strict=True)]
    return render_table([Column(name, whole=i == 0) for i, name in enumerate(check.columns)], styled,
                        title=check.title, output=output)
