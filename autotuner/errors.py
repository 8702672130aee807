"""The one exception type for bad input: the CLI prints it as a single line and exits 2."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class UserError(Exception):
    """A problem in what the user gave us, located as precisely as we can (file, line, column)."""

    message: str
    path: str | Path | None = None
    line: int | None = None
    col: int | None = None

    def __str__(self) -> str:
        where = [str(self.path)] if self.path is not None else []
        if self.path is not None and self.line is not None:
            where.append(str(self.line))
            if self.col is not None:
                where.append(str(self.col))
        return ":".join(where) + (": " if where else "") + self.message
