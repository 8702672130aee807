"""Faults around a sweep, not in its input: stdout closed under `| head`, the --events file's disk filling up,
the results directory's disk filling up. Output errors never stop the sweep; a fault the runner cannot go on
with ends what runs, says so in one line with the resume hint, and `resume` finishes the sweep afterwards.

The full disks are small tmpfs mounts each test makes (tests run as root), filled while the sweep runs.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from autotuner.states import State

from cli_rig import (
    PREAMBLE,
    WRITE_METRICS,
    autotune,
    env,
    fill,
    launched,
    launches,
    states,
    sweep_id,
    tagged_pids,
    tmpfs,
    wait_until,
    write_launcher,
    write_sweep,
)

# The experiment named $GATE_NAME waits until the file $GATE exists; the others sleep $STANDIN_SECONDS.
GATED = PREAMBLE + """\
if [ "$name" = "$GATE_NAME" ]; then
    while [ ! -e "$GATE" ]; do sleep 0.02; done
else
    sleep "${STANDIN_SECONDS:-0.05}"
fi
""" + WRITE_METRICS


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs of this test's own, unmounted afterwards."""
    with tmpfs(tmp_path / "small", "size=1m") as mount:
        yield mount


def setup(tmp_path: Path, n: int = 5):
    spec = write_sweep(tmp_path, range(n))
    launcher = write_launcher(tmp_path, GATED)
    log, gate = tmp_path / "launches.log", tmp_path / "gate"
    return spec, launcher, log, gate, env(LAUNCH_LOG=log, GATE=gate, GATE_NAME="s_x1")


def one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_stdout_closed_under_head_leaves_the_sweep_running_to_its_end(tmp_path, runners):
    spec, launcher, log, gate, environ = setup(tmp_path)
    out = tmp_path / "out"
    proc = runners.start("run", spec, "--slots", 1, "--launcher", launcher, "-o", out, environ=environ,
                         directory=out)
    # `| head -3`: the header line, s_x0 started and finished; s_x1 waits at the gate, and the pipe closes.
    lines = [proc.stdout.readline() for _ in range(3)]
    assert "s_x0" in lines[1], lines
    wait_until(lambda: "s_x1" in launched(out), message="s_x1 running")
    proc.stdout.close()
    gate.touch()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err
    note = one_line(err)
    assert note == "autotune: note: stdout cannot be written (Broken pipe): what this command prints is left out", note
    assert states(out) == {f"s_x{i}": State.SUCCEEDED for i in range(5)}
    assert sorted(launches(log)) == [(f"s_x{i}", 1) for i in range(5)]
    assert tagged_pids(sweep_id(out)) == []


def test_an_events_file_whose_disk_fills_is_left_out_and_the_sweep_goes_on(tmp_path, runners, small_disk):
    spec, launcher, log, gate, environ = setup(tmp_path)
    out, events = tmp_path / "out", small_disk / "events.jsonl"
    proc = runners.start("run", spec, "--slots", 1, "--launcher", launcher, "-o", out, "-q", "--events", events,
                         environ=environ, directory=out)
    wait_until(lambda: "s_x1" in launched(out) and events.exists() and len(events.read_text().splitlines()) == 3,
               message="s_x1 running, three events written")
    fill(small_disk / "filler")
    fill(events)  # the page the events file still had room in
    gate.touch()
    out_text, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    note = one_line(err)
    assert note.startswith(f"autotune: note: --events {events} failed (OSError: [Errno 28]"), note
    assert states(out) == {f"s_x{i}": State.SUCCEEDED for i in range(5)}
    assert "best: " in out_text
    assert sorted(launches(log)) == [(f"s_x{i}", 1) for i in range(5)]


def test_a_full_disk_under_the_ledger_ends_what_runs_says_so_once_and_resume_finishes(tmp_path, runners,
                                                                                    small_disk):
    spec, launcher, log, gate, environ = setup(tmp_path, 4)
    out = small_disk / "out"
    proc = runners.start("run", spec, "--slots", 2, "--launcher", launcher, "-o", out, "-q", environ=environ | {
        "STANDIN_SECONDS": "600"}, directory=out)
    sid = wait_until(lambda: sweep_id(out))
    wait_until(lambda: sorted(launched(out)) == ["s_x0", "s_x1"] and len(tagged_pids(sid)) >= 2,
               message="s_x0 and s_x1 running")
    fill(small_disk / "filler")
    gate.touch()  # s_x1 ends: the runner must record it, and cannot
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    line = one_line(err)
    assert line == (f"autotune: error: the ledger: database or disk is full; `autotune resume {out}` finishes "
                    "the sweep"), line
    assert tagged_pids(sid) == []  # s_x0, which ran fine, was ended with the runner
    assert "s_x2" not in [n for n, _ in launches(log)]

    (small_disk / "filler").unlink()
    done = autotune("resume", out, "-q", environ=environ | {"STANDIN_SECONDS": "0.05"})
    assert done.returncode == 0, done.stderr
    assert states(out) == {f"s_x{i}": State.SUCCEEDED for i in range(4)}
    assert tagged_pids(sid) == []
