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


def read_user_file(path: str | Path, what: str) -> str:
    """The text of a file the user named (`what` says which, e.g. "hostfile"); any failure is a UserError."""
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise UserError(f"{what}: no such file", path) from None
    except UnicodeDecodeError:
        raise UserError(f"{what} is not UTF-8 text", path) from None
    except OSError as e:
        raise UserError(f"cannot read {what}: {e.strerror or e}", path) from None
