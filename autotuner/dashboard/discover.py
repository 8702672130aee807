"""The sweeps under the directories a dashboard serves: a sweep's own directory, or a folder of sweeps (new
ones are found as they start), each with a short stable id for URLs.
"""
from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..ledger import FILENAME
from .feed import SweepFeed


@dataclass(frozen=True)
class Served:
    """A sweep the dashboard shows: its id in URLs, the directory served that holds it, and its feed."""

    id: str
    root: Path
    feed: SweepFeed


def sweep_id(directory: Path) -> str:
    """A short id from the sweep's resolved path: stable across restarts, safe in a URL, and no path in it."""
    return hashlib.sha256(str(directory).encode()).hexdigest()[:12]


def check_roots(directories: Sequence[Path]) -> list[Path]:
    """The directories to serve, each an existing directory (one line of bad input otherwise)."""
    roots = []
    for d in directories:
        path = Path(d)
        if not path.is_dir():
            raise UserError("not a directory" if path.exists() else "no such directory", path)
        roots.append(path.resolve())
    return list(dict.fromkeys(roots))


class Sweeps:
    """Every sweep found so far under the roots; `scan` looks again (cheap: one directory listing per root)."""

    def __init__(self, roots: Sequence[Path]):
        self.roots = list(roots)
        self._lock = threading.Lock()
        self._found: dict[str, Served] = {}

    def scan(self) -> list[Served]:
        """The sweeps now, newest first (a folder of sweeps is usually read for its latest)."""
        seen = []
        for root in self.roots:
            if (root / FILENAME).is_file():
                seen.append((root, root))
                continue
            try:
                children = sorted(root.iterdir())
            except OSError:
                continue
            seen += [(root, c.resolve()) for c in children if (c / FILENAME).is_file()]
        with self._lock:
            for root, directory in seen:
                key = sweep_id(directory)
                if key not in self._found:
                    self._found[key] = Served(key, root, SweepFeed(directory))
            here = {sweep_id(d) for _, d in seen}
            listed = [s for k, s in self._found.items() if k in here]
        return sorted(listed, key=lambda s: _mtime(s.feed.directory), reverse=True)

    def get(self, key: str) -> Served | None:
        """The sweep of that id; the roots are looked at again for one not seen yet."""
        with self._lock:
            found = self._found.get(key)
        if found is None:
            found = next((s for s in self.scan() if s.id == key), None)
        return found


def _mtime(directory: Path) -> float:
    try:
        return (directory / FILENAME).stat().st_mtime
    except OSError:
        return 0.0
