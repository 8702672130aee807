"""The dashboard reading a ledger while a writer (a runner, `resume`, `cancel`) opens it or leaves it: nothing is
left beside a ledger no writer has open (no `-wal`, no `-shm`), and a read a writer raced is read again.

The writer is another process holding the ledger open through `Ledger` (as the runner does), told when to write
and when to leave; the moment it does is pinned inside the dashboard's read by a hook, so every interleaving is
the same on every run.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import autotuner.dashboard.feed as feed_module
from autotuner.dashboard.feed import SweepFeed
from autotuner.ledger.store import FILENAME, Ledger
from autotuner.states import State

from cli_rig import ROOT
from helpers import SWEEP_META, experiment

# A writer: opens the ledger as the runner does, then on each line of stdin: "write N" finishes experiment eN,
# "close" closes the ledger and exits. It answers each command with a line once done.
WRITER = """
import sys
from pathlib import Path
from autotuner.ledger.store import Ledger
from autotuner.states import State
ledger = Ledger.open(Path(sys.argv[1]))
ledger.version()
print("open", flush=True)
for line in sys.stdin:
    word, *rest = line.split()
    if word == "write":
        ledger.finish(f"e{rest[0]}", 1, State.CANCELLED, 2.0)
        print("wrote", flush=True)
    else:
        ledger.close()
        print("closed", flush=True)
        break
"""


STARTED: list[subprocess.Popen] = []


class Writer:
    """The writer process: started with the ledger open, then told what to do, each step waited for."""

    def __init__(self, directory: Path):
        self.proc = subprocess.Popen([sys.executable, "-c", WRITER, str(directory)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=ROOT)
        STARTED.append(self.proc)
        self._expect("open")

    def _expect(self, word: str) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == word, (word, line)

    def write(self, n: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"write {n}\n")
        self.proc.stdin.flush()
        self._expect("wrote")

    def leave(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("close\n")
        self.proc.stdin.flush()
        self._expect("closed")
        assert self.proc.wait(timeout=60) == 0


@pytest.fixture(autouse=True)
def _no_writer_left():
    """A writer a failed test left open is ended (by its pid), never left to hold a ledger."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


@pytest.fixture
def ledger(tmp_path) -> Path:
    """A finished sweep's ledger as the runner leaves it: WAL mode, closed, nothing beside it."""
    made = Ledger.create(tmp_path, SWEEP_META)
    made.add_experiments([experiment(f"e{i}") for i in range(4)], at=1.0)
    made.close()
    assert _beside(tmp_path) == []
    return tmp_path


def _beside(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(FILENAME + "-"))


def _transitions(directory: Path) -> int:
    with Ledger.open(directory) as ledger:
        return int(ledger._db.execute("SELECT MAX(seq) FROM transitions").fetchone()[0])


def test_a_writer_leaving_between_the_look_and_the_open_leaves_nothing(ledger, monkeypatch):
    """The -wal is there when the feed looks (a reader then opens the usual way); the writer closes (removing
    -wal and -shm) before the feed opens: a read-only connection then made them again, empty, for good."""
    writer = Writer(ledger)
    writer.write(0)
    connect = feed_module.sqlite3.connect

    def late(*args, **kwargs):
        if writer.proc.poll() is None:
            writer.leave()
        return connect(*args, **kwargs)

    monkeypatch.setattr(feed_module.sqlite3, "connect", late)
    feed = SweepFeed(ledger)
    assert feed.refresh()
    assert writer.proc.poll() == 0 and feed.attempts["e0"].state == State.CANCELLED
    assert _beside(ledger) == []


def test_a_writer_leaving_while_the_feed_reads_leaves_nothing(ledger, monkeypatch):
    """The writer closes while the feed's connection is open: it cannot remove -wal and -shm then (it is not the
    last), so the feed's connection, the last to close, must."""
    writer = Writer(ledger)
    writer.write(1)
    version = Ledger.version

    def meanwhile(self: Ledger) -> int:
        found = version(self)  # the feed's read has begun
        if writer.proc.poll() is None:
            writer.leave()
        return found

    monkeypatch.setattr(Ledger, "version", meanwhile)
    feed = SweepFeed(ledger)
    assert feed.refresh()
    assert writer.proc.poll() == 0 and feed.attempts["e1"].state == State.CANCELLED
    assert _beside(ledger) == []


@pytest.mark.parametrize("leaves", [False, True], ids=["stays", "comes-and-goes"])
def test_a_writer_opening_during_an_immutable_read_is_read_again(ledger, monkeypatch, leaves):
    """The feed reads a closed ledger as an unchanging file; a writer opens it meanwhile and writes (and, the
    second time, leaves again, its changes now in the file and no -wal left to tell): read again the usual way."""
    calls: list[bool] = []
    read_only = feed_module.read_only
    version = Ledger.version
    writers: list[Writer] = []

    def spied(directory: Path, *, quiet: bool = True):
        calls.append(quiet)
        return read_only(directory, quiet=quiet)

    def meanwhile(self: Ledger) -> int:
        found = version(self)
        if not writers:
            writers.append(Writer(ledger))
            writers[0].write(2)
            if leaves:
                writers[0].leave()
        return found

    monkeypatch.setattr(feed_module, "read_only", spied)
    monkeypatch.setattr(Ledger, "version", meanwhile)
    feed = SweepFeed(ledger)
    try:
        assert feed.refresh()
        assert calls == [True, False]  # the raced read, then the usual one
        assert feed.seq == _transitions(ledger) and feed.attempts["e2"].state == State.CANCELLED
    finally:
        if not leaves:
            writers[0].leave()
    monkeypatch.undo()
    feed.refresh()  # read again with no writer: nothing made, nothing left
    assert _beside(ledger) == []


def test_a_ledger_left_with_wal_files_is_tidied_by_the_next_read(ledger):
    """-wal and -shm left beside a ledger no writer has open (by an older dashboard, or a reader that was last
    to close read only) are removed by the feed's next read, as the last connection's close does."""
    writer = Writer(ledger)
    writer.write(3)
    holder = feed_module.sqlite3.connect(f"file:{ledger / FILENAME}?mode=ro", uri=True)
    holder.execute("SELECT COUNT(*) FROM transitions").fetchone()  # a read-only reader: open when the writer left
    writer.leave()
    holder.close()
    assert _beside(ledger) == [FILENAME + "-shm", FILENAME + "-wal"]
    feed = SweepFeed(ledger)
    assert feed.refresh() and feed.attempts["e3"].state == State.CANCELLED
    assert _beside(ledger) == []
