"""What one poll of the runner's step reader costs (sweep/steps.py `StepReader.check`): CPU seconds to read every
followed attempt's steps, N attempts whose files hold K steps each.

  python benchmarks/step_reader.py --attempts 16 64 --steps 1000 100000 --polls 5
  PYTHONPATH=OLD python benchmarks/step_reader.py ...   # another tree's code

Each attempt (adopted, so its files count as its own) has either a progress file (`--source progress`: one JSON
line a step) or DeepSpeed's throughput lines in its stdout.log (`--source deepspeed`: ~190 bytes a step, so 100,000
steps are 19 MB, more than the 8 MiB a read keeps). After a first poll (reading what is there), each timed poll
follows one step more appended to every attempt's file (`grown`: a running sweep's case, steps computed again),
then as many follow nothing new (`quiet`). Prints the medians of --polls polls in CPU seconds
(`time.process_time`), and the median CPU time of one `measure` over K steps (what a grown poll costs at least,
once per attempt).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from autotuner.core import Post, Progress, Reservation, Run
from autotuner.spec import Experiment
from autotuner.spec.interval import measure
from autotuner.spec.progress import PROGRESS_FILE, Window, read_steps
from autotuner.sweep.steps import StepReader

START = 1_764_000_000.0
DS_LINE = ("[{stamp},{millis:03d}] [INFO] [timer.py:264:stop] epoch=0/micro_step={n}/global_step={n}, "
           "RunningAvgSamplesPerSec=1801.52, CurrSamplesPerSec={value:.2f}, MemAllocated=0.52GB, "
           "MaxMemAllocated=1.21GB\n")


def step_line(source: str, n: int) -> str:
    at, value = START + n * 0.25, 1800.0 + (n * 37 % 101)
    if source == "progress":
        return json.dumps({"step": n, "time": at, "throughput": value}) + "\n"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    return DS_LINE.format(stamp=stamp, millis=int(at * 1000) % 1000, n=n, value=value)


def file_of(source: str) -> str:
    return PROGRESS_FILE if source == "progress" else "stdout.log"


def attempts(root: Path, source: str, count: int, steps: int) -> list[Run]:
    """`count` attempt directories, each a copy of one file of `steps` steps."""
    first = root / "a0"
    first.mkdir(parents=True)
    with open(first / file_of(source), "w") as f:
        f.writelines(step_line(source, n) for n in range(1, steps + 1))
    runs = []
    for i in range(count):
        directory = root / f"a{i}"
        if i:
            directory.mkdir()
            shutil.copyfile(first / file_of(source), directory / file_of(source))
        experiment = Experiment(name=f"a{i}", ds_config={}, num_gpus=1, num_nodes=1, script="/bin/true", args=(),
                                timeout=None, env={}, source="benchmark")
        runs.append(Run(experiment, 1, Reservation.of({"h": [0]}), f"sid.a{i}.1", directory))
    return runs


def cpu(call: object) -> float:
    start = time.process_time()
    call()  # type: ignore[operator]
    return time.process_time() - start


def polls(root: Path, source: str, count: int, steps: int, rounds: int) -> tuple[float, float, float]:
    """The first poll's CPU seconds, the median of `rounds` polls each after one step more an attempt, then the
    median of `rounds` polls with nothing new."""
    runs = attempts(root, source, count, steps)
    posted: list[Progress] = []
    post: Post = posted.append
    reader = StepReader(post, "throughput", 60.0)
    for run in runs:
        reader("adopted", run, None)
    first = cpu(reader.check)
    grown, made = [], steps
    for _ in range(rounds):
        made += 1
        for run in runs:
            with open(run.dir / file_of(source), "a") as f:
                f.write(step_line(source, made))
        grown.append(cpu(reader.check))
    quiet = [cpu(reader.check) for _ in range(rounds)]
    shutil.rmtree(root)
    return first, statistics.median(grown), statistics.median(quiet)


def measure_alone(root: Path, source: str, steps: int, rounds: int) -> float:
    runs = attempts(root, source, 1, steps)
    found, window = read_steps(runs[0].dir, "throughput", Window(4))
    shutil.rmtree(root)
    return statistics.median(cpu(lambda: measure(found, window, rate=True)) for _ in range(rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--steps", type=int, nargs="+", default=[1000, 100_000])
    parser.add_argument("--source", nargs="+", choices=("progress", "deepspeed"), default=["progress", "deepspeed"])
    parser.add_argument("--polls", type=int, default=5)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="step-reader-"))
    try:
        for source in args.source:
            for steps in args.steps:
                alone = measure_alone(base / "m", source, steps, args.polls)
                for count in args.attempts:
                    first, grown, quiet = polls(base / "p", source, count, steps, args.polls)
                    print(f"{source:9} K={steps:>7} N={count:>3}: first {first:8.3f} s, grown {grown:8.3f} s, "
                          f"quiet {quiet:8.3f} s a poll; measure alone {alone * 1000:7.2f} ms an attempt",
                          flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
