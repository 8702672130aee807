"""`render_table`, the one table renderer every view that prints a table uses (fitted to a terminal's width and
colour, `Output`; laid out by hand beyond RICH_ROWS rows), `markdown_table`, and `json_with_rows` for the JSON
of a table: one compact object a row.
"""
from __future__ import annotations

import functools
import io
import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TextIO

FORMATS = ("table", "json", "csv", "md")
# rich lays out and renders every cell on its own (about 0.7 ms a row here: 7 s for a sweep of 10,000), so a
# larger table is laid out by hand: the same columns, one line per row, the last column running to the end.
RICH_ROWS = 1000


# --- where the text goes -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Output:
    """Where a table is printed: a terminal's width (None: a file or a pipe, where every row stays on one line
    however wide) and whether it may be coloured."""

    width: int | None = None
    color: bool = False

    @classmethod
    def of(cls, stream: TextIO, environ: Mapping[str, str] | None = None) -> Output:
        """A terminal gets its width and colour; a file or pipe neither. NO_COLOR (https://no-color.org) turns
        colour off, FORCE_COLOR on (NO_COLOR wins); COLUMNS overrides a terminal's width."""
        env = os.environ if environ is None else environ
        try:
            terminal = stream.isatty()
        except (AttributeError, ValueError):  # closed, or not a real stream
            terminal = False
        width = shutil.get_terminal_size().columns if terminal else None
        color = (terminal or bool(env.get("FORCE_COLOR"))) and not env.get("NO_COLOR")
        return cls(max(width, 40) if width else None, color)


PLAIN = Output()


# --- the table renderer --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    header: str
    right: bool = False  # numbers: aligned right, never wrapped
    whole: bool = False  # names: never wrapped either (the text columns around them wrap instead)


class Styled(NamedTuple):
    """A cell with a rich style ("red", "bold green"), used only when the output takes colour."""

    text: str
    style: str


Cell = str | Styled


def _text(cell: Cell) -> str:
    return cell.text if isinstance(cell, Styled) else cell


def render_table(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], *, title: str | None = None,
                 notes: Sequence[str] = (), output: Output = PLAIN, row_styles: Sequence[str] | None = None,
                 keep: int = 1, order: Sequence[int] | None = None) -> str:
    """Rows of plain-text cells (never read as markup) as a boxed rich table, or laid out by hand beyond
    RICH_ROWS rows; then `notes`, one line each. As wide as the rows need, or fitted to `output.width`: text
    columns wrap, and columns that still do not fit go on in another table below, beside the first `keep`
    columns again (as pandas prints a wide DataFrame). Coloured only when `output.color`. The rows are shown in
    `order` (positions in `rows` and `row_styles`; default: as given), laid out in their own order and put in
    `order` as finished lines (see `Snapshot.order`)."""
    # Column by column: one pass of C-level loops per column (widths, padding) where a row at a time made
    # 120,000 calls for a report of 10,000.
    texts = [[_text(c) for c in cells] if Styled in set(map(type, cells)) else list(cells)
             for cells in (zip(*rows, strict=True) if rows else [() for _ in columns])]
    natural = [max(_width(c.header), _widest(cells)) for c, cells in zip(columns, texts, strict=True)]
    plain = len(rows) > RICH_ROWS
    if order is not None and not plain:  # a few rows: put in order before rich lays them out
        rows = [rows[i] for i in order]
        row_styles = [row_styles[i] for i in order] if row_styles else row_styles
    parts = []
    for n, block in enumerate(_blocks(columns, natural, keep, output.width, plain)):
        heading = title if n == 0 else None
        chosen = [columns[i] for i in block]
        if plain:
            parts.append(_plain_table(chosen, [texts[i] for i in block], heading, output.width, order))
        else:
            parts.append(_rich_table(chosen, [[r[i] for i in block] for r in rows], heading, output, row_styles))
    return "\n".join(parts) + "".join(note + "\n" for note in notes)


def _widest(cells: Sequence[str]) -> int:
    """The most columns a cell of `cells` takes (0: none)."""
    if all(map(str.isascii, cells)):
        return max(map(len, cells), default=0)
    return max(map(_width, cells), default=0)


def _width(text: str) -> int:
    """Columns `text` takes on a terminal (wide characters count two): its length, for the usual ASCII."""
    if text.isascii():
        return len(text)
    from rich.cells import cell_len

    return cell_len(text)


_SQUEEZED = 24  # what a text column that wraps counts for when a table is split to fit


def _blocks(columns: Sequence[Column], natural: Sequence[int], keep: int, width: int | None,
            plain: bool) -> list[list[int]]:
    """The columns of each table a wide one is split into to fit `width` (all in one without a width)."""
    everything = list(range(len(columns)))
    if width is None:
        return [everything]
    gap, edge = (2, -2) if plain else (3, 1)  # a plain table's two spaces; a box's bar and padding

    def size(block: list[int]) -> int:
        return edge + sum(gap + (natural[i] if columns[i].right or columns[i].whole else
                                 min(natural[i], _SQUEEZED)) for i in block)

    if size(everything) <= width:
        return [everything]
    keep = min(keep, len(columns) - 1)
    blocks, current = [], everything[:keep]
    for i in everything[keep:]:
        if len(current) > keep and size([*current, i]) > width:
            blocks.append(current)
            current = everything[:keep]
        current.append(i)
    return [*blocks, current]


def _rich_table(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], title: str | None, output: Output,
                row_styles: Sequence[str] | None) -> str:
    from rich.console import Console
    from rich.markup import escape
    from rich.measure import Measurement
    from rich.table import Table
    from rich.text import Text

    table = Table(title=escape(title) if title is not None else None, header_style="bold" if output.color else "",
                  title_style="" if output.color else None)
    for column in columns:
        whole = column.right or column.whole
        table.add_column(column.header, justify="right" if column.right else "left", no_wrap=whole,
                         overflow="ellipsis" if whole else "fold")
    for n, cells in enumerate(rows):
        texts = [Text(c.text, style=c.style if output.color else "") if isinstance(c, Styled) else Text(c)
                 for c in cells]
        table.add_row(*texts, style=row_styles[n] if output.color and row_styles else None)
    out = io.StringIO()
    console = Console(file=out, width=100_000, force_terminal=output.color, no_color=not output.color,
                      color_system="standard" if output.color else None, highlight=False, _environ={})
    natural = Measurement.get(console, console.options, table).maximum
    console.width = min(natural, output.width) if output.width else natural
    console.print(table)
    return out.getvalue()


def _plain_table(columns: Sequence[Column], cells: Sequence[Sequence[str]], title: str | None,
                 width: int | None = None, order: Sequence[int] | None = None) -> str:
    """The columns' `cells` (one list per column) laid out by hand: two spaces between columns, numbers
    right-aligned, no trailing spaces. A line break in a cell becomes a space (it ended the row there, the rest
    of it under other columns); the columns are searched for one whole, in C, not cell by cell."""
    cells = [[" ".join(cell.splitlines()) for cell in column] if _breaks("".join(column)) else column
             for column in cells]
    widths = [max(len(c.header), max(map(len, column), default=0)) for c, column in zip(columns, cells, strict=True)]
    padded = [[cell.rjust(w) for cell in column] if c.right else [cell.ljust(w) for cell in column]
              for c, column, w in zip(columns, cells, widths, strict=True)]
    head = [[c.header.rjust(w) if c.right else c.header.ljust(w) for c, w in zip(columns, widths, strict=True)],
            ["-" * w for w in widths]]
    body = ["  ".join(line).rstrip() for line in zip(*padded, strict=True)]
    lines = ([title] if title is not None else []) + ["  ".join(line).rstrip() for line in head] + (
        body if order is None else [body[i] for i in order])
    if width is not None:  # a terminal: the last column wraps under itself instead of the terminal's wrapping
        lines = [part for text in lines for part in _wrap_last(text, sum(widths[:-1]) + 2 * (len(widths) - 1), width)]
    return "\n".join(lines) + "\n"


def _wrap_last(line: str, indent: int, width: int) -> list[str]:
    """A plain table's line cut to `width`, what runs past it continued on lines indented to the last column."""
    room = width - indent
    if len(line) <= width or room < 20:
        return [line]
    head, rest = line[:indent], line[indent:]
    parts = [rest[i:i + room] for i in range(0, len(rest), room)]
    return [head + parts[0]] + [" " * indent + part for part in parts[1:]]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], order: Sequence[int] | None = None) -> str:
    """A GitHub-flavoured Markdown table: a `|` in a cell (a header's too) becomes `/`, a line break a space (a
    swept string value holding one ended its row there, the rest a line of other columns). The rows in `order`
    (positions in `rows`; default: as given), each made in their own order."""
    body = [_md_row(cells) for cells in rows]
    lines = [_md_row(header), "|" + "---|" * len(header)] + (body if order is None else [body[i] for i in order])
    return "\n".join(lines) + "\n"


def _md_row(cells: Sequence[str]) -> str:
    """One row, searched for a line break once, joined (a call a cell made 10,000 rows take 1.5 times as long)."""
    text = " | ".join(cell.replace("|", "/") for cell in cells)
    if _breaks(text):
        text = " | ".join(" ".join(cell.replace("|", "/").splitlines()) for cell in cells)
    return f"| {text} |"


def _breaks(text: str) -> bool:
    return "\n" in text or "\r" in text


def json_with_rows(document: Mapping[str, object], key: str, order: Sequence[int] | None = None) -> str:
    """`document` as indented JSON, but the list under its top-level `key` one compact object a line: as easy
    to read, and written by json's C encoder (`indent=` makes it pure Python: seconds for 10,000 rows). The rows
    are written in `order` (positions in the list; default: as listed), each encoded in the list's own order,
    and the whole text joined once (each copy of a 100,000-row text was a tenth of a second)."""
    rows = document[key]
    if not isinstance(rows, list):
        raise TypeError(f"{key}: the rows are a list")
    text = json.dumps({**document, key: []}, indent=2)
    if not rows:
        return text + "\n"
    encode = _row_encoder()
    encoded = [encode(row) for row in rows]
    lines = encoded if order is None else [encoded[i] for i in order]
    marker = f'\n  {json.dumps(key)}: ['  # the top level's: two spaces in, nested keys are deeper; no string
    head, found, tail = text.partition(marker + "]")  # holds a line break
    if not found:
        raise TypeError(f"{key}: no list of that name at the top level")
    lines[0] = f"{head}{marker}\n    {lines[0]}"
    lines[-1] = f"{lines[-1]}\n  ]{tail}\n"
    return ",\n    ".join(lines)


# CPython's C encoder of json, undocumented (typeshed leaves it out; None where json has none), and a value of
# every kind a row holds, to check it against json.dumps itself.
_Chunks = Callable[[object, int], Sequence[str]]  # a made encoder: a value (at a level) -> its text in pieces
_C_ENCODER: Callable[..., _Chunks] | None = getattr(json.encoder, "c_make_encoder", None)
_PROBE: dict[str, object] = {"text": "\u00e9\n\"", "number": [1, -2.5, 1e300], "nothing": None, "yes": True,
                             "nested": {"k": []}}


@functools.cache
def _row_encoder() -> Callable[[object], str]:
    """`json.dumps` of a row, by json's C encoder made once: json.dumps makes one per call, a fifth of the
    encoding of 100,000 rows (0.1 s). The C encoder is CPython's undocumented one, so it is used only where it
    encodes a probe exactly as json.dumps does; json.dumps itself anywhere else."""
    if _C_ENCODER is None:  # not CPython
        return json.dumps
    try:
        encoder = _C_ENCODER(None, json.JSONEncoder().default, json.encoder.encode_basestring_ascii, None, ": ",
                             ", ", False, False, True)  # markers, default, strings, indent, separators, sort, skip, NaN
        if "".join(encoder(_PROBE, 0)) != json.dumps(_PROBE):
            return json.dumps
    except (TypeError, ValueError):  # it takes other arguments
        return json.dumps
    return lambda row: "".join(encoder(row, 0))
