"""A running attempt's steps read as its files grow (spec/followed.py): every reading equals a whole read
(spec/progress.py `read_steps`) of the same files, whatever was done to them between two readings; and the runner's
step reader reads only what they gained."""
import json
import os
import random
import time

import pytest

from autotuner.core import Reservation, Run
from autotuner.spec import followed, progress
from autotuner.spec.followed import FollowedSteps
from autotuner.spec.progress import PROGRESS_FILE, Window, read_steps
from autotuner.sweep.steps import StepReader

from helpers import experiment

DS_LINE = ("[{stamp},{ms:03d}] [INFO] [timer.py:264:stop] epoch=0/micro_step={n}/global_step={n}, "
           "RunningAvgSamplesPerSec=99.5, CurrSamplesPerSec={v}, MemAllocated=0.5GB")
FILES = (PROGRESS_FILE, "stdout.log", "stderr.log")
T0 = 1_764_000_000.0


def ds_line(n, value=100.5):
    at = T0 + n * 0.5
    return DS_LINE.format(stamp=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)), ms=int(at * 1000) % 1000,
                          n=n, v=value)


def progress_line(n, value=100.5):
    return json.dumps({"step": n, "time": T0 + n * 0.5, "throughput": value})


def random_line(rng, name, n):
    """A line as a script or a log may write it: a step (its number now and then going back, or repeated), or
    something that is none, or is one only in part."""
    n = n if rng.random() < 0.8 else max(0, n - rng.randrange(1, 8))
    value = rng.choice([100.5, 250.0, 1e308, "nan", 3])
    step = progress_line(n, value if value != "nan" else 1.0) if name == PROGRESS_FILE else ds_line(n, value)
    pad = "y" * rng.randrange(1000, 2500)  # a step's line longer than a read keeps
    long = step.replace('{"step"', f'{{"pad": "{pad}", "step"').replace("=99.5", f"=99.5{pad}")
    return rng.choice([step] * 7 + [long,
        "noise, not a step", "", "é" * rng.randrange(1, 40), "junk" + step, step + "\r" + step, step[:-7],
        json.dumps({"step": 10 ** 30, "time": 5.0}), step.replace("Running", "Run\nning"),
        "x" * rng.randrange(100, 900),
    ])


class Files:
    """The three files of an attempt, written in random pieces (a line split anywhere, a character too)."""

    def __init__(self, directory, rng):
        self.directory, self.rng = directory, rng
        self.pending = {name: b"" for name in FILES}
        self.n = 0

    def text(self, name, count):
        lines = []
        for _ in range(count):
            self.n += 1
            lines.append(random_line(self.rng, name, self.n))
        return "".join(line + "\n" for line in lines).encode()

    def act(self):
        rng, name = self.rng, self.rng.choice(FILES)
        path = self.directory / name
        what = rng.choices(["queue", "write", "truncate", "rewrite", "replace", "remove", "big"],
                           [6, 10, 1, 1, 1, 0.5, 0.5])[0]
        if what == "queue":
            self.pending[name] += self.text(name, rng.randrange(1, 12))
        elif what == "write":
            cut = rng.randrange(0, len(self.pending[name]) + 1)
            with open(path, "ab") as f:
                f.write(self.pending[name][:cut])
            self.pending[name] = self.pending[name][cut:]
        elif what == "truncate" and path.exists():
            os.truncate(path, rng.randrange(0, path.stat().st_size + 1))
        elif what == "rewrite":  # in place: the same inode, other bytes
            with open(path, "r+b" if path.exists() else "wb") as f:
                f.write(f"rewritten {self.n}\n".encode() + self.text(name, rng.randrange(1, 30)))
                f.truncate()
        elif what == "replace":
            other = self.directory / "other"
            other.write_bytes(self.text(name, rng.randrange(0, 30)))
            os.replace(other, path)
        elif what == "remove" and path.exists():
            path.unlink()
        elif what == "big":
            with open(path, "ab") as f:
                f.write(self.text(name, rng.randrange(10, 60)))
        return what, name


@pytest.mark.parametrize("seed", range(12))
def test_every_reading_equals_a_whole_read_whatever_was_done_to_the_files(tmp_path, monkeypatch, seed):
    """Lines split across readings, files appended, cut short, rewritten in place, replaced, removed, grown past
    the bytes a read keeps, steps past the steps kept: a follower's reading is the whole read's, each time."""
    for module in (progress, followed):  # small bounds, so that the files pass them often
        monkeypatch.setattr(module, "MAX_BYTES", 1500)
        monkeypatch.setattr(module, "MAX_STEPS", 12)
    monkeypatch.setattr(followed, "CHUNK", 100)
    rng = random.Random(seed)
    files = Files(tmp_path, rng)
    window = Window(2, 6)
    readers = {metric: FollowedSteps(tmp_path, metric) for metric in ("throughput", "tokens_per_s")}
    kinds = set()
    for i in range(400):
        kinds.add(files.act())
        if rng.random() < 0.7:
            for metric, reader in readers.items():
                assert reader.read(window) == read_steps(tmp_path, metric, window), (i, kinds)
    assert len(kinds) >= 15  # most of what can be done, to each file


class Counted:
    """Bytes read through os.read and os.pread (a whole read's and a follower's reads)."""

    def __init__(self, monkeypatch):
        self.bytes = 0
        for name in ("read", "pread"):
            real = getattr(os, name)
            monkeypatch.setattr(os, name, self.counting(real))

    def counting(self, real):
        def call(*args):
            data = real(*args)
            self.bytes += len(data)
            return data
        return call


@pytest.mark.parametrize("name", [PROGRESS_FILE, "stdout.log"])
def test_the_step_reader_reads_only_what_a_running_attempts_files_gained(tmp_path, monkeypatch, name):
    posted = []
    reader = StepReader(posted.append, "throughput", 60.0)
    run = Run(experiment("a"), 1, Reservation.of({"h": [0]}), "sid.a.1", tmp_path / "a")
    reader("adopted", run, None)
    (tmp_path / "a").mkdir()
    line = progress_line if name == PROGRESS_FILE else ds_line
    (tmp_path / "a" / name).write_text("".join(line(n) + "\n" for n in range(1, 2001)))
    reader.check()
    assert posted[-1].reading.steps == 2000 - 4
    more = line(2001) + "\n"
    with open(tmp_path / "a" / name, "a") as f:
        f.write(more)
    counted = Counted(monkeypatch)
    reader.check()
    assert posted[-1].reading.steps == 2001 - 4  # the new step read
    # its line and the bytes that say the file is the one read before (the out-of-memory scan reads the new
    # bytes through a file object: not counted); before, the whole file each poll
    assert counted.bytes <= len(more) + 2 * followed.FINGER


def test_a_run_past_the_steps_kept_is_still_read_as_its_steps_come(tmp_path, monkeypatch):
    """Once a long run's steps fill what is kept of them (MAX_STEPS, the highest), their count stops moving; each
    new step is still a new reading (before, none was posted after the count stopped)."""
    for module in (progress, followed):
        monkeypatch.setattr(module, "MAX_STEPS", 12)
    posted = []
    reader = StepReader(posted.append, "throughput", 60.0)
    run = Run(experiment("a"), 1, Reservation.of({"h": [0]}), "sid.a.1", tmp_path / "a")
    reader("adopted", run, None)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / PROGRESS_FILE).write_text("".join(progress_line(n) + "\n" for n in range(1, 31)))
    reader.check()
    first = len(posted)
    with open(tmp_path / "a" / PROGRESS_FILE, "a") as f:
        f.write(progress_line(31, 90.0) + "\n")
    reader.check()
    assert len(posted) == first + 1 and posted[-1].reading.steps == posted[first - 1].reading.steps
