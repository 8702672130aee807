"""The crash test: kill -9 the runner at random moments, `autotune resume` each time, and check that the sweep
ends exactly as a clean run does: nothing lost, nothing that succeeded run again, no process left behind, and
what ran when the runner died adopted by the next one (finished under its own attempt, never launched again).
"""
from __future__ import annotations

import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from autotuner.states import State

from cli_rig import (
    PREAMBLE,
    WRITE_METRICS,
    attempts,
    autotune,
    env,
    expected_throughput,
    finish,
    latest,
    launches,
    sweep_id,
    tagged_pids,
    wait_until,
    write_launcher,
    write_sweep,
)

EXPERIMENTS = 20
SLOTS = 3
# 0.3 to 0.6 s per experiment, a pure function of its name.
STANDIN = PREAMBLE + 'sleep "0.$((3 + ck % 4))"\n' + WRITE_METRICS


def succeeded_results(directory: Path) -> dict[str, float]:
    return {a.name: a.metric for a in attempts(directory) if a.state == State.SUCCEEDED}


@pytest.mark.parametrize("seed", [3, 11])
def test_kill_9_at_random_moments_then_resume_finishes_as_a_clean_run_does(tmp_path, runners, seed):
    rng = random.Random(seed)
    spec = write_sweep(tmp_path, range(EXPERIMENTS), name="crash")
    launcher = write_launcher(tmp_path, STANDIN)

    # The reference: the same sweep, run cleanly.
    clean_dir, clean_log = tmp_path / "clean", tmp_path / "clean.log"
    done = autotune("run", spec, "--slots", SLOTS, "--launcher", launcher, "-o", clean_dir, "--grace", 1, "-q",
                    environ=env(LAUNCH_LOG=clean_log))
    assert done.returncode == 0, done.stderr
    clean = succeeded_results(clean_dir)
    assert len(clean) == EXPERIMENTS
    assert clean == {n: expected_throughput(n) for n in clean}  # the stand-in's metric reached the ledger

    directory, log = tmp_path / "sweep", tmp_path / "launches.log"
    environ = env(LAUNCH_LOG=log)
    proc = runners.start("run", spec, "--slots", SLOTS, "--launcher", launcher, "-o", directory, "--grace", 1, "-q",
                         environ=environ, directory=directory)
    kills = 0
    running_at_kills = set()  # (name, attempt) running, its process started, just before a kill
    moments = []

    def running_now() -> set[tuple[str, int]]:
        running = {(n, a.attempt) for n, a in latest(directory).items() if a.state == State.RUNNING}
        return running & set(launches(log))  # read second: these processes did start

    for round_ in range(8):
        if round_ % 2:  # every other kill lands while experiments run (on a slow machine, random moments
            wait_until(lambda p=proc: running_now() or p.poll() is not None)  # may all fall in start-ups)
        time.sleep(rng.uniform(0.05, 1.2 if round_ % 2 == 0 else 0.4))
        if proc.poll() is not None:
            break  # the sweep finished before this round's kill
        now = running_now()
        running_at_kills |= now
        moments.append((round_, sorted(now)))  # to tell what the kills hit, should they hit nothing
        proc.kill()  # SIGKILL: no handler, no clean-up, no last ledger write
        proc.wait()
        kills += 1
        if (directory / "ledger.sqlite").exists():
            proc = runners.start("resume", directory, "--grace", 1, "-q", environ=environ, directory=directory)
        else:  # killed before `run` recorded the sweep: nothing was launched, so it starts over
            assert not log.exists()
            proc = runners.start("run", spec, "--slots", SLOTS, "--launcher", launcher, "-o", directory,
                                 "--grace", 1, "-q", environ=environ, directory=directory)
    code, out, err = finish(proc, timeout=120)
    assert code == 0, (out, err)
    assert kills >= 3

    every = attempts(directory)
    # Every experiment has exactly one succeeded attempt, and it is its last one.
    per_name = Counter(a.name for a in every if a.state == State.SUCCEEDED)
    assert per_name == Counter({n: 1 for n in clean})
    last = {}
    for a in every:
        last[a.name] = a
    assert all(a.state == State.SUCCEEDED for a in last.values())
    # ... with the results a clean run gives.
    assert succeeded_results(directory) == clean
    # The kills did hit running experiments (otherwise this test tested nothing), and each of those was
    # adopted: it succeeded under the attempt that ran when the runner died (below: launched once).
    assert running_at_kills, moments
    succeeded_attempt = {a.name: a.attempt for a in every if a.state == State.SUCCEEDED}
    assert {(n, k) for n, k in running_at_kills if succeeded_attempt[n] != k} == set()
    # Only an attempt that never got its process (killed between recording it and starting it) is interrupted.
    assert all(a.state in (State.SUCCEEDED, State.INTERRUPTED) for a in every), Counter(a.state for a in every)

    # No attempt was launched twice, and nothing was launched after its experiment succeeded.
    logged = launches(log)
    assert len(logged) == len(set(logged)), Counter(logged).most_common(3)
    assert {(n, k) for n, k in logged if k == succeeded_attempt[n]} == set(succeeded_attempt.items())
    assert not [(n, k) for n, k in logged if k > succeeded_attempt[n]]
    # Every launch is an attempt the ledger knows.
    known = {(a.name, a.attempt) for a in every}
    assert set(logged) <= known

    # Nothing of the sweep is left running, and the outcome files name the clean run's best.
    assert tagged_pids(sweep_id(directory)) == []
    best = max(clean, key=clean.get)
    assert "| global         |" in (directory / "summary.txt").read_text()
    assert f"| {best} " in (directory / "summary.txt").read_text().splitlines()[-3]
    assert (directory / "ds_config_optimal.json").exists()


# Ends on SIGTERM as a script that saves its state first would: a moment later, exit status 143.
STOPPABLE = PREAMBLE + "trap 'sleep 0.2; exit 143' TERM\n" + 'sleep "0.$((3 + ck % 4))"\n' + WRITE_METRICS


@pytest.mark.parametrize("seed", [7])
def test_a_stop_then_kill_9_at_random_moments_never_reads_as_a_failure(tmp_path, runners, seed):
    """Ctrl-C or SIGTERM, then kill -9 a moment later (during the stop, mostly: the stand-ins take 0.2 s to end and
    the grace is 1 s), then resume, round after round: each experiment's outcome is checked, not only that none
    was lost or run twice. A stand-in never fails on its own, so a failed attempt here is a stop misjudged."""
    rng = random.Random(seed)
    spec = write_sweep(tmp_path, range(EXPERIMENTS), name="stop")
    launcher = write_launcher(tmp_path, STOPPABLE)
    directory, log = tmp_path / "sweep", tmp_path / "launches.log"
    environ = env(LAUNCH_LOG=log)
    proc = runners.start("run", spec, "--slots", SLOTS, "--launcher", launcher, "-o", directory, "--grace", 1, "-q",
                         environ=environ, directory=directory)
    stopped_running = 0  # experiments running (their process started) when a stop was asked

    def running_now() -> set[tuple[str, int]]:
        running = {(n, a.attempt) for n, a in latest(directory).items() if a.state == State.RUNNING}
        return running & set(launches(log))

    for _ in range(6):
        wait_until(lambda p=proc: running_now() or p.poll() is not None)
        time.sleep(rng.uniform(0.05, 0.3))
        if proc.poll() is not None:
            break
        stopped_running += len(running_now())
        proc.send_signal(rng.choice([signal.SIGINT, signal.SIGTERM]))
        time.sleep(rng.uniform(0.0, 0.25))
        proc.kill()
        proc.wait()
        proc = runners.start("resume", directory, "--grace", 1, "-q", environ=environ, directory=directory)
    code, out, err = finish(proc, timeout=120)
    assert code == 0, (out, err)
    assert stopped_running, "no stop landed while experiments ran: this round tested nothing"

    every = attempts(directory)
    assert Counter(a.state for a in every if a.state not in (State.SUCCEEDED, State.INTERRUPTED)) == Counter()
    assert Counter(a.name for a in every if a.state == State.SUCCEEDED) == Counter(
        {f"stop_x{i}": 1 for i in range(EXPERIMENTS)})
    logged = launches(log)
    assert len(logged) == len(set(logged)), Counter(logged).most_common(3)
    assert tagged_pids(sweep_id(directory)) == []


def test_kill_9_while_run_records_the_sweep_leaves_nothing_or_a_whole_ledger(tmp_path, runners):
    """Killed while `run` writes its results directory: either no ledger (run again) or one resume finishes."""
    rng = random.Random(5)
    spec = write_sweep(tmp_path, range(3), name="early")
    launcher = write_launcher(tmp_path, PREAMBLE + "sleep 0.05\n" + WRITE_METRICS)
    outcomes = Counter()
    for round_ in range(6):
        directory, log = tmp_path / f"sweep{round_}", tmp_path / f"launches{round_}.log"
        environ = env(LAUNCH_LOG=log)
        proc = runners.start("run", spec, "--slots", 2, "--launcher", launcher, "-o", directory, "-q",
                             environ=environ, directory=directory)
        deadline = time.monotonic() + 60
        while not (directory / "hostfile").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(rng.uniform(0, 0.02))  # the moments while the ledger is written
        proc.kill()
        proc.wait()
        if (directory / "ledger.sqlite").exists():
            outcomes["ledger"] += 1
            done = autotune("resume", directory, "-q", environ=environ)
        else:
            outcomes["none"] += 1
            assert not log.exists()  # nothing was launched
            done = autotune("run", spec, "--slots", 2, "--launcher", launcher, "-o", directory, "-q",
                            environ=environ)
        assert done.returncode == 0, (outcomes, done.stdout, done.stderr)
        assert sorted(a.name for a in attempts(directory) if a.state == State.SUCCEEDED) == ["early_x0", "early_x1",
                                                                                        "early_x2"]
        assert tagged_pids(sweep_id(directory)) == []
