"""kill -9 the runner at random moments, resume each time, and count what a crash cost.

Sweeps of 16 stand-ins (0 to 3.9 s each, by name) on 3 slots. The runner is killed (SIGKILL) at a random moment
and started again (`resume`, or `run` when no ledger was made yet) until the wanted number of kills is reached;
then each sweep runs to its end. With `--stops`, each kill follows a stop the runner began (SIGINT or SIGTERM,
0-0.3 s before; the stand-ins take 0.2 s to end on SIGTERM), so most land during the stop. Counted over all sweeps:

- completed_rerun: launches of an experiment after one of its attempts had already completed (wrote its
  metrics and ended): the GPU time a crash wasted. Expected 0.
- lost: experiments that did not end succeeded. Expected 0.
- leftover_processes: processes still carrying a sweep's tag at the end. Expected 0.
- adopted_kept_attempt / running_at_kill: attempts that were running when a runner died and then succeeded
  under that same attempt number (adopted, not ended and run again).
- misjudged: attempts that ended other than succeeded or interrupted (a stand-in never fails on its own: a stop
  judged as a failure, a cancel or a timeout nobody asked for). Expected 0.

  python benchmarks/crash_fuzz.py --seed 1 --kills 20 [--stops]
"""
from __future__ import annotations

import argparse
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from cli_rig import (  # the test rig: stand-ins, ledger look-ups, tagged processes
    PREAMBLE,
    WRITE_METRICS,
    Runners,
    attempts,
    env,
    latest,
    launches,
    sweep_id,
    tagged_pids,
    write_launcher,
    write_sweep,
)

# Sleeps 0-3.9 s (by name), writes its metrics, then logs that it completed; on SIGTERM it ends 0.2 s later, 143.
STANDIN = PREAMBLE + "trap 'sleep 0.2; exit 143' TERM\n" + 'sleep "$((ck % 4)).$((ck % 10))"\n' + WRITE_METRICS + \
    'echo "$AUTOTUNE_TAG" >> "$END_LOG"\n'


def one_sweep(base: Path, number: int, rng: random.Random, runners: Runners, totals: Counter, kills: int,
              stops: bool = False) -> None:
    spec = write_sweep(base, range(16), name=f"f{number}")
    launcher = write_launcher(base, STANDIN)
    results, log, ends = base / "out", base / "launch.log", base / "end.log"
    environ = env(LAUNCH_LOG=log, END_LOG=ends)
    run = ("run", spec, "--slots", 3, "--launcher", launcher, "-o", results, "--grace", 1, "-q")
    proc = runners.start(*run, environ=environ, directory=results)
    hit: set[tuple[str, int]] = set()
    while totals["kills"] < kills:
        time.sleep(rng.uniform(0.2, 2.5))
        if proc.poll() is not None:
            break
        running = {(n, a.attempt) for n, a in latest(results).items() if a.state == "running"}
        hit |= running & set(launches(log))  # running, and its process did start
        if stops:  # a stop the runner begins, then the kill during it (or after)
            proc.send_signal(rng.choice([signal.SIGINT, signal.SIGTERM]))
            time.sleep(rng.uniform(0.0, 0.3))
            totals["stops"] += 1
        proc.kill()
        proc.wait()
        totals["kills"] += 1
        again = ("resume", results, "--grace", 1, "-q") if (results / "ledger.sqlite").exists() else run
        proc = runners.start(*again, environ=environ, directory=results)
    _, err = proc.communicate(timeout=300)
    if proc.returncode != 0:
        print(f"sweep {number} ended with {proc.returncode}: {err[-2000:]}")
        totals["bad_exit"] += 1
    final = latest(results)
    launched = launches(log)
    totals["experiments"] += len(final)
    totals["lost"] += sum(1 for a in final.values() if a.state != "succeeded")
    totals["launches"] += len(launched)
    first_end: dict[str, int] = {}
    for line in (ends.read_text().split() if ends.exists() else []):  # tags: SWEEP.NAME.ATTEMPT
        name, attempt = line.split(".", 1)[1].rsplit(".", 1)
        first_end.setdefault(name, int(attempt))
    totals["completed_rerun"] += sum(1 for n, k in launched if n in first_end and k > first_end[n])
    succeeded = {a.name: a.attempt for a in attempts(results) if a.state == "succeeded"}
    totals["running_at_kill"] += len(hit)
    totals["adopted_kept_attempt"] += sum(1 for n, k in hit if succeeded.get(n) == k)
    totals["leftover_processes"] += len(tagged_pids(sweep_id(results)))
    totals["misjudged"] += sum(1 for a in attempts(results) if a.state not in ("succeeded", "interrupted"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--stops", action="store_true", help="a SIGINT or SIGTERM shortly before each kill")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="crash-fuzz-"))
    runners = Runners()
    totals: Counter = Counter()
    try:
        number = 0
        while totals["kills"] < args.kills:
            number += 1
            base = root / f"s{number}"
            base.mkdir()
            one_sweep(base, number, rng, runners, totals, args.kills, args.stops)
    finally:
        runners.cleanup()
        shutil.rmtree(root, ignore_errors=True)
    print(dict(totals))


if __name__ == "__main__":
    main()
