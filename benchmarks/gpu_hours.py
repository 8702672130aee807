"""What the sweep's GPU-hours cost to work out on a large ledger (issue 36): per experiment (report, compare), the
sweep's alone (status, the dashboard's summary), and the estimate of what stopping saved (views/gpu_hours.py).

  python benchmarks/gpu_hours.py --experiments 10000 --early 0.2 --calls 15
  PYTHONPATH=OLD python benchmarks/gpu_hours.py ...   # another tree's code (one without `saved_hours` skips it)

The ledger is tests/dashboard_rig.py's `recorded_sweep` (nothing runs), every succeeded attempt given a `measures`
row (10 steps of 0.1 s); with --early F, a share F of them stopped as outclassed and as many again ended once
measured until sure (their `stops` row), so that the saved estimate has that many rows to read. Prints the median
of --calls calls of each, in milliseconds.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]

from autotuner.ledger.store import Ledger  # noqa: E402
from autotuner.views import gpu_hours as hours  # noqa: E402
from autotuner.views.snapshot import load  # noqa: E402

from dashboard_rig import recorded_sweep  # noqa: E402


def median_ms(call: Callable[[], object], calls: int) -> float:
    took = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        took.append(time.perf_counter() - start)
    return statistics.median(took) * 1000


def ledger_of(directory: Path, experiments: int, early: float) -> Path:
    """The recorded sweep, with steps measured and a share of its runs ended early (see the module)."""
    sweep = recorded_sweep(directory, experiments)
    with Ledger.open(sweep) as ledger:
        db = ledger._db
        names = [row[0] for row in db.execute("SELECT name FROM attempts WHERE state = 'succeeded'")]
        db.executemany("INSERT INTO measures VALUES (?, 1, 1.0, 0.1, 10, NULL, NULL, NULL)", [(n,) for n in names])
        if early:
            every = max(1, round(1 / early))
            db.executemany("UPDATE attempts SET state = 'stopped', reason = 'outclassed' WHERE name = ?",
                           [(n,) for n in names[::every]])
            db.executemany("INSERT INTO stops VALUES (?, 1, 'succeeded', 'sure', 'measured until sure', 0)",
                           [(n,) for n in names[every // 2::every]])
        db.commit()
    return sweep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=10000)
    parser.add_argument("--early", type=float, default=0.0, help="share of runs stopped, and as many ended once sure")
    parser.add_argument("--calls", type=int, default=15)
    args = parser.parse_args()
    sweep = ledger_of(Path(tempfile.mkdtemp()) / "sweep", args.experiments, args.early)
    snap = load(sweep)
    with Ledger.open(sweep) as ledger:
        found = {"per experiment": median_ms(lambda: hours.gpu_hours(snap, ledger), args.calls),
                 "sweep's alone": median_ms(lambda: hours.gpu_hours(snap, ledger, each=False), args.calls)}
        saved = getattr(hours, "saved_hours", None)
        if saved is not None:
            found["saved alone"] = median_ms(lambda: saved(ledger), args.calls)
    print(", ".join(f"{what} {ms:.1f} ms" for what, ms in found.items()))


if __name__ == "__main__":
    main()
