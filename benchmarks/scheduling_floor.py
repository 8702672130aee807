"""The floor under benchmarks/scheduling.py on this machine: 500 x 0.2 s on 8 slots with nothing but threads that
start processes and wait on them (no ledger, no judging, no clean-up), so what the runner adds stands apart from
what starting processes costs here.

  python benchmarks/scheduling_floor.py --rounds 2

Three launches, each timed as makespan/ideal:
  sleep     `sleep 0.2` itself: one exec per run
  standin   benchmarks/standin.sh, the scheduling benchmark's launcher (sh, then exec sleep)
  wrapped   the stand-in under the exit-status wrapper every attempt runs under (`backends.exitstatus.wrapped`:
            what adoption after a crash needs), as the runner starts it: its own session, stdin from /dev/null
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotuner.backends.exitstatus import wrapped  # noqa: E402

STANDIN = ROOT / "benchmarks" / "standin.sh"


def argv_of(kind: str, seconds: float, status: Path) -> list[str]:
    if kind == "sleep":
        return ["sleep", str(seconds)]
    if kind == "standin":
        return [str(STANDIN)]
    return wrapped([str(STANDIN)], status)


def makespan_ratio(kind: str, experiments: int, seconds: float, slots: int) -> float:
    """Wall time of `experiments` runs of `kind` on `slots` threads, over experiments x seconds / slots."""
    todo, lock = list(range(experiments)), threading.Lock()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "STANDIN_SECONDS": str(seconds), "AUTOTUNE_METRICS_PATH": str(Path(tmp, "m.json"))}

        def slot(number: int) -> None:
            argv = argv_of(kind, seconds, Path(tmp, f"exit_status{number}"))
            while True:
                with lock:
                    if not todo:
                        return
                    todo.pop()
                subprocess.Popen(argv, env=env, start_new_session=True, stdin=subprocess.DEVNULL).wait()

        started = time.perf_counter()
        threads = [threading.Thread(target=slot, args=(n,)) for n in range(slots)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return (time.perf_counter() - started) / (experiments * seconds / slots)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiments", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=0.2)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    opts = parser.parse_args()
    for kind in ("sleep", "standin", "wrapped"):
        ratios = [makespan_ratio(kind, opts.experiments, opts.seconds, opts.slots) for _ in range(opts.rounds)]
        print(f"{kind:<8} makespan/ideal " + " / ".join(f"{r:.3f}" for r in ratios), flush=True)


if __name__ == "__main__":
    main()
