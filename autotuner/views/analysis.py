"""What the pictures of a sweep show, worked out without matplotlib: the keys a sweep varies, the plot's axes,
how busy the slots were, and the timeline's rows. `autotune report` and `status` stay free of plotting imports.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ..errors import UserError
from ..jsonvalues import JSON, JSONObject
from ..ledger.lock import holder_pid
from ..ledger.store import Attempt, Ledger
from ..ledger.swept import MISSING, flatten, summarize
from ..spec import FIELD_KEYS, Experiment
from ..spec.model import dotted_value

DEFAULT_X = "train_micro_batch_size_per_gpu"
DEFAULT_LINES = "zero_optimization.stage"


def value_of(experiment: Experiment, key: str) -> JSON:
    """An experiment's value of a swept key (num_gpus and num_nodes its own); MISSING where it has none."""
    if key in FIELD_KEYS:
        return getattr(experiment, key)
    return dotted_value(experiment.ds_config, key, MISSING)


def spec_of(experiment: Experiment) -> JSONObject:
    """What `swept_specs` reads of an experiment: its ds_config, num_gpus and num_nodes (as the ledger's spec)."""
    return {"ds_config": experiment.ds_config} | {k: getattr(experiment, k) for k in FIELD_KEYS}


def swept_specs(specs: Sequence[Mapping[str, JSON]]) -> tuple[list[str], list[JSONObject]]:
    """The keys whose value differs between experiments (or that some lack), in first-seen order, and each
    experiment's values of those keys (a key it lacks left out), from their specs as the ledger records them
    (`spec_of`): what the report, `autotuner.load` and the plots call the swept parameters (see `ledger.swept`)."""
    leaves, values = summarize(specs)
    return leaves.keys, values


def swept_keys(experiments: Iterable[Experiment]) -> list[str]:
    """Dotted keys (and num_gpus / num_nodes) whose value differs between experiments, in first-seen order."""
    return swept_specs([spec_of(e) for e in experiments])[0]


def choose_axes(experiments: Sequence[Experiment], x: str | None, lines: str | None) -> tuple[str, str | None]:
    """The x key and the lines key: as named (each must exist in some experiment), else sensible defaults."""
    present = set()
    for e in experiments:
        present |= set(flatten(e.ds_config)) | set(FIELD_KEYS)
    swept = swept_keys(experiments)
    for key, option in ((x, "--x"), (lines, "--lines")):
        if key is not None and key not in present:
            raise UserError(f"{option} {key}: no experiment of this sweep has that ds_config key; swept keys: "
                            f"{', '.join(swept) or 'none'}")
    if x is None:
        numeric = [k for k in swept if all(isinstance(value_of(e, k), (int, float)) for e in experiments)]
        x = DEFAULT_X if DEFAULT_X in swept or (DEFAULT_X in present and not numeric) else (
            numeric[0] if numeric else (swept[0] if swept else DEFAULT_X))
    if lines is None:
        if DEFAULT_LINES in swept and x != DEFAULT_LINES:
            lines = DEFAULT_LINES
        else:
            lines = next((k for k in swept if k != x), None)
    if lines == x:
        raise UserError(f"--x and --lines name the same key {x}")
    return x, lines


# --- the timeline --------------------------------------------------------------------------------------------
def utilisation(attempts: Sequence[Attempt], slots: Mapping[str, Sequence[int]], now: float) -> JSONObject:
    """Busy slot-seconds / (slots x makespan), for the sweep and for each host; makespan from the first
    start to the last end (now, for attempts still running)."""
    spans = [(a, a.started_at, a.finished_at if a.finished_at is not None else now)
             for a in attempts if a.started_at is not None]
    if not spans:
        return {"makespan_s": 0.0, "busy_slot_s": 0.0, "slots": sum(len(v) for v in slots.values()),
                "utilisation": None, "per_host": {h: None for h in slots}}
    start = min(s for _, s, _ in spans)
    end = max(e for _, _, e in spans)
    makespan = max(end - start, 1e-9)
    busy: dict[str, float] = {h: 0.0 for h in slots}
    for a, s, e in spans:
        for host, ids in a.slots.items():
            busy[host] = busy.get(host, 0.0) + max(e - s, 0.0) * len(ids)
    count = {h: len(slots.get(h, ())) for h in busy}
    total = sum(count.values())
    return {"start": start, "end": end, "makespan_s": end - start, "busy_slot_s": sum(busy.values()),
            "slots": total, "utilisation": sum(busy.values()) / (total * makespan) if total else None,
            "per_host": {h: (busy[h] / (count[h] * makespan) if count[h] else None) for h in busy}}


def slot_rows(slots: Mapping[str, Sequence[int]], attempts: Sequence[Attempt]) -> list[tuple[str, int]]:
    rows = [(h, i) for h, ids in slots.items() for i in sorted(ids)]
    known = set(rows)
    for a in attempts:
        for h, ids in a.slots.items():
            for i in ids:
                if (h, i) not in known:
                    known.add((h, i))
                    rows.append((h, i))
    return rows


def all_attempts(directory: Path) -> list[Attempt]:
    with Ledger.open(directory) as ledger:
        return ledger.attempts()


def timeline_end(directory: Path, attempts: Sequence[Attempt]) -> float:
    """Where running attempts end on the timeline: now while a runner holds the sweep; else (the runner died,
    `resume` will record them interrupted) the last time the ledger knows of."""
    if holder_pid(Path(directory)) is not None:
        return time.time()
    known = [t for a in attempts for t in (a.started_at, a.launched_at, a.finished_at) if t is not None]
    return max(known, default=time.time())
