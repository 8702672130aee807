"""PeakMemory (peaks.py) through the tests' FakeNvml: which processes are an attempt's (by the tag in their
environment, read from a /proc made here), per-GPU peaks, and no GPU as a normal state. Learned needs
(learned.py): the margin and its cap."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pynvml
from test_inventory import FakeDevice, FakeNvml

from autotuner.backends.local.peaks import PeakMemory
from autotuner.backends.tags import TAG_ENV, tag_of
from autotuner.planning.learned import MARGIN, STEP, largest_usable, need_of_peak, needs_of_sweep

GiB = 1 << 30


def fake_proc(root: Path, environs: dict[int, dict[str, str]]) -> Path:
    """A /proc with an environ file per pid."""
    for pid, env in environs.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0")
    return root


def wait_for(condition, seconds: float = 10.0) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "not within the time"
        time.sleep(0.01)


def test_tag_of_reads_the_tag_a_process_carries(tmp_path):
    proc = fake_proc(tmp_path, {7: {"PATH": "/bin", TAG_ENV: "s.a.1"}, 8: {"PATH": "/bin"}})
    assert (tag_of(7, proc), tag_of(8, proc), tag_of(9, proc)) == ("s.a.1", None, None)


def test_an_attempts_peak_is_what_its_processes_hold_together_on_its_fullest_gpu(tmp_path, caplog):
    caplog.set_level("INFO", logger="autotuner.backends.local.peaks")
    proc = fake_proc(tmp_path, {100: {TAG_ENV: "s.a.1"}, 101: {TAG_ENV: "s.a.1"}, 102: {TAG_ENV: "s.a.1"},
                                200: {TAG_ENV: "s.b.1"}, 300: {"USER": "someone-else"}})
    held = {0: [(100, 5 * GiB), (102, 1 * GiB), (300, 50 * GiB)],  # a's two processes on GPU 0: 6 GiB together
            1: [(101, 4 * GiB), (200, 3 * GiB), (999, 9 * GiB)],  # 999: gone, or of another PID namespace
            2: [(100, 70 * GiB)]}  # a holds memory on a GPU that is not its own: not counted
    devices = [FakeDevice("NVIDIA A100-SXM4-80GB", 80 * GiB, 10 * GiB, f"GPU-{i}", processes=lambda i=i: held[i])
               for i in range(3)]
    nvml = FakeNvml(devices)
    peaks = PeakMemory(nvml, period=0.01, proc=proc)
    peaks.watch(("a", 1), "s.a.1", frozenset({0, 1}))
    peaks.watch(("b", 1), "s.b.1", frozenset({1}))
    wait_for(lambda: nvml.calls.count("processes") >= 6)
    held[1] = [(101, 8 * GiB)]  # a grows on GPU 1; b let go of its memory: its peak stays
    wait_for(lambda: nvml.calls.count("processes") >= 12)
    assert peaks.done(("a", 1)) == 8 * GiB and peaks.done(("b", 1)) == 3 * GiB
    assert peaks.done(("c", 1)) is None  # never watched
    unseen = [r.getMessage() for r in caplog.records if "not visible here" in r.getMessage()]
    assert unseen == ["NVML lists a process on GPU 1 (pid 999) that is not visible here: pids of another PID "
                      "namespace (a container?) are not measured"]  # once, not at every reading
    peaks.close()
    assert nvml.calls.count("init") == nvml.calls.count("shutdown") == 1
    assert not [t for t in threading.enumerate() if t.name.startswith("peak-memory")]


def test_the_reader_sleeps_while_nothing_runs_and_reads_only_what_runs(tmp_path):
    nvml = FakeNvml([FakeDevice("NVIDIA A100-SXM4-80GB", 80 * GiB, 10 * GiB, "GPU-0"),
                     FakeDevice("NVIDIA A100-SXM4-80GB", 80 * GiB, 10 * GiB, "GPU-1")])
    peaks = PeakMemory(nvml, period=0.01, proc=tmp_path)
    peaks.watch(("a", 1), "s.a.1", frozenset({1}))
    wait_for(lambda: nvml.calls.count("processes") >= 3)
    assert peaks.done(("a", 1)) is None  # it held nothing
    time.sleep(0.05)  # the reader's last reading may be under way
    settled = nvml.calls.count("processes")
    time.sleep(0.2)
    assert nvml.calls.count("processes") == settled  # nothing runs: no reading, no wake-up
    peaks.close()


def test_no_gpu_or_no_process_list_measures_nothing_and_raises_nothing(tmp_path):
    absent = FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound)
    peaks = PeakMemory(absent, period=0.01, proc=tmp_path)
    peaks.watch(("a", 1), "s.a.1", frozenset({0}))
    assert peaks.done(("a", 1)) is None and not [t for t in threading.enumerate() if t.name.startswith("peak-")]
    peaks.close()
    assert absent.calls == ["init"]
    unlisted = FakeNvml([FakeDevice("NVIDIA A100-SXM4-80GB", 80 * GiB, 10 * GiB, "GPU-0", processes=None)])
    proc = fake_proc(tmp_path / "p", {5: {TAG_ENV: "s.a.1"}})
    peaks = PeakMemory(unlisted, period=0.01, proc=proc)
    peaks.watch(("a", 1), "s.a.1", frozenset({0}))
    wait_for(lambda: unlisted.calls.count("processes") >= 2)
    assert peaks.done(("a", 1)) is None
    peaks.close()


def test_a_need_is_the_peak_plus_the_margin_never_more_than_the_biggest_gpu_holds_nor_less_than_the_peak():
    assert need_of_peak(30 * GiB) == 30 * GiB + 30 * GiB * MARGIN // 100
    assert need_of_peak(GiB + 1) % STEP == 0 and GiB + 1 + GiB // 10 <= need_of_peak(GiB + 1) < GiB * 1.1 + STEP + 1
    usable = largest_usable({"a": 80 * GiB, "r": 24 * GiB}, None)  # the biggest: 80 GiB less 4 GiB of headroom
    assert need_of_peak(70 * GiB, usable) == 76 * GiB
    assert need_of_peak(78 * GiB, usable) == 78 * GiB  # it ran, so it is not made unplaceable
    # the sweep's own attempts override what was learned from an earlier sweep
    assert needs_of_sweep({"x": 5 * GiB, "y": 6 * GiB}, {"x": 10 * GiB}) == {"x": need_of_peak(10 * GiB),
                                                                         "y": 6 * GiB}


def test_a_reading_that_raises_what_nvml_errors_do_not_cover_loses_that_reading_not_the_reader(tmp_path, caplog):
    """A malformed answer (here a process list that raises ValueError, as a half-written source can) is one lost
    sample: the reader goes on, the attempt's peak is still measured, and the failure is said once."""
    caplog.set_level("WARNING", logger="autotuner.backends.local.peaks")
    proc = fake_proc(tmp_path, {100: {TAG_ENV: "s.a.1"}})
    failing = {"left": 3}

    def processes() -> list[tuple[int, int | None]]:
        if failing["left"]:
            failing["left"] -= 1
            raise ValueError("invalid literal for int() with base 10: ''")
        return [(100, 7 * GiB)]

    nvml = FakeNvml([FakeDevice("NVIDIA A100-SXM4-80GB", 80 * GiB, 10 * GiB, "GPU-0", processes=processes)])
    peaks = PeakMemory(nvml, period=0.01, proc=proc)
    peaks.watch(("a", 1), "s.a.1", frozenset({0}))
    wait_for(lambda: nvml.calls.count("processes") >= 6)
    assert peaks.done(("a", 1)) == 7 * GiB
    told = [r.getMessage() for r in caplog.records if "reading the GPUs' memory failed" in r.getMessage()]
    assert told == ["reading the GPUs' memory failed (ValueError: invalid literal for int() with base 10: ''); "
                    "that reading is lost, the next is made as ever"]
    peaks.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("peak-memory")]
