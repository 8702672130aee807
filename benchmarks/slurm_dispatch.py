"""Dispatch latency inside Slurm: from a slot freed (an attempt's end, as the ledger records it) to the next
experiment's job step running its first command on the node, against the same sweep on this machine's own
slots (no Slurm) and against a bare `srun` (its start to the task's first line).

A real Slurm cluster on this machine (tests/slurm_lab.py: munged, slurmctld, three slurmd; needs root and the
slurmctld, slurmd, slurm-client and munge packages); one allocation of one node with one GPU, so that every
experiment waits for the one before it and each gap is one dispatch.

  python benchmarks/slurm_dispatch.py --experiments 30
"""
from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from autotuner.ledger.store import Ledger  # noqa: E402

from slurm_lab import SlurmLab  # noqa: E402

# Each experiment logs when its command started on the node, writes its metrics and ends at once.
STANDIN = """#!/bin/sh
python3 -c 'import time; print(time.time())' > "$(dirname "$AUTOTUNE_METRICS_PATH")/began"
printf '{"throughput": 1.0}\\n' > "$AUTOTUNE_METRICS_PATH"
"""


def sweep(directory: Path, n: int) -> Path:
    (directory / "train.py").touch()
    path = directory / "sweep.hjson"
    path.write_text(f'{{"name": "d", "script": "train.py", "num_gpus": 1, '
                    f'"ds_config": {{"train_micro_batch_size_per_gpu": 1}}, "space": {{"x": {list(range(n))}}}}}\n')
    return path


def gaps(results: Path) -> list[float]:
    """Seconds from each attempt's recorded end to the next one's first command."""
    with Ledger.open(results) as ledger:
        runs = sorted(ledger.latest(), key=lambda a: a.started_at or 0)
    out = []
    for before, after in itertools.pairwise(runs):
        began = float((results / after.name / "began").read_text())
        out.append(began - (before.finished_at or 0))
    return out


def run_sweep(work: Path, n: int, env: dict[str, str], *where: str) -> list[float]:
    results = work / f"r-{time.monotonic_ns()}"
    launcher = work / "standin.sh"
    launcher.write_text(STANDIN)
    done = subprocess.run([sys.executable, "-m", "autotuner.cli", "run", str(sweep(work, n)), *where,
                           "--launcher", f"sh {launcher}", "-o", str(results), "-q"],
                          env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    return gaps(results)


def bare_srun(lab: SlurmLab, job: str, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        began = time.time()
        done = lab.run("srun", "--jobid", job, "--exact", "-N1", "-n1", "--gpus-per-node=1", "python3", "-c",
                       "import time; print(time.time())")
        out.append(float(done.stdout.split()[-1]) - began)
    return out


def summary(label: str, values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    return (f"{label:<28} n={len(ms):3}  median {statistics.median(ms):7.1f} ms  p90 {ms[int(len(ms) * 0.9)]:7.1f} ms  "
            f"max {ms[-1]:7.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiments", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3, help="sweeps per kind, interleaved")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, SlurmLab(Path(tmp) / "lab") as lab:
        job = lab.allocate(1, 1)
        env = {**lab.env, "SLURM_JOB_ID": job}
        plain = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
        found: dict[str, list[float]] = {"slurm step (autotune)": [], "local slot (autotune)": [], "bare srun": []}
        for _ in range(args.rounds):
            found["slurm step (autotune)"] += run_sweep(Path(tmp), args.experiments, env, "--slurm")
            found["local slot (autotune)"] += run_sweep(Path(tmp), args.experiments, plain, "--slots", "1")
            found["bare srun"] += bare_srun(lab, job, args.experiments // 3)
        for label, values in found.items():
            print(summary(label, values))
        lab.release(job)


if __name__ == "__main__":
    main()
