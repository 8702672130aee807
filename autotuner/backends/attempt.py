"""An attempt's directory and the files that document it, the same for every executor.

Each experiment has one directory in the results; it shows its latest attempt, and earlier attempts' files
are moved into attempt-N/ beside it. Before the launch: no stale metrics or exit status. Once launched:
exp.json (what the attempt is), ds_config.json (the config it runs) and cmd.txt (how, copy-pasteable).
"""
from __future__ import annotations

import os
from pathlib import Path

from ..core.events import Run
from ..files import write_atomic, write_json_atomic
from ..jsonvalues import JSONObject
from ..spec.progress import PROGRESS_FILE
from . import exitstatus
from .launch import Command

EXP_FILES = ("exp.json", "ds_config.json", "cmd.txt", "stdout.log", "stderr.log", "metrics.json",
             exitstatus.FILENAME, PROGRESS_FILE)


def keep_previous_attempt(directory: Path, attempt: int) -> None:
    """Move an earlier attempt's files into attempt-N/ so the experiment's directory shows the latest one."""
    if attempt <= 1 or not directory.exists():
        return
    previous = directory / f"attempt-{attempt - 1}"
    previous.mkdir(exist_ok=True)
    for name in EXP_FILES:
        if (directory / name).exists():
            os.replace(directory / name, previous / name)


def prepare_directory(run: Run) -> None:
    """The attempt's own directory, with an earlier attempt's files moved aside and no stale metrics."""
    keep_previous_attempt(run.dir, run.attempt)
    try:
        run.dir.mkdir(parents=True)
    except FileExistsError:  # a directory made now is empty: only one that was there can hold stale files
        (run.dir / "metrics.json").unlink(missing_ok=True)
        (run.dir / PROGRESS_FILE).unlink(missing_ok=True)
        (run.dir / exitstatus.FILENAME).unlink(missing_ok=True)


def record_attempt(run: Run, config: JSONObject, command: Command) -> None:
    """exp.json, ds_config.json and cmd.txt: what this attempt is, what it runs, and how. The directory is
    synced once, after the last (its fsync makes all three renames durable): every attempt wrote them while the
    dispatcher's ledger commits waited on the same disk."""
    write_json_atomic(run.dir / "exp.json", {**run.experiment.to_json(), "attempt": run.attempt,
                                             "slots": run.reservation.as_dict(), "tag": run.tag}, sync_dir=False)
    write_json_atomic(run.dir / "ds_config.json", config, sync_dir=False)
    write_atomic(run.dir / "cmd.txt", command.shell() + "\n")
