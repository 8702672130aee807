"""What the top of a sweep's page shows, worked out from the read model: the counts, whether a runner works on
it, the ETA, the best so far (each GPU type's, where it ran on several) with its config and command to copy, and
the nodes with their slots (busy, free, lost).
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..jsonvalues import JSON, JSONObject
from ..ledger.store import Attempt
from ..spec.interval import interval_text
from ..states import Reason, State
from ..views.snapshot import Snapshot
from ..views.summary import optimal
from .eta import Planner


def lost_hosts(attempts: Sequence[Attempt]) -> set[str]:
    """Hosts whose last run ended because the host went away, and where nothing runs since: lost, as far as the
    ledger can tell (the runner probes them; the ledger records only what their runs became)."""
    last: dict[str, Attempt] = {}
    busy: set[str] = set()
    for a in attempts:
        if a.state == State.RUNNING:
            busy.update(a.slots)
        elif a.finished_at is not None:
            for host in a.slots:
                seen = last.get(host)
                if seen is None or (seen.finished_at or 0.0) < a.finished_at:
                    last[host] = a
    return {h for h, a in last.items() if a.reason == Reason.LOST and h not in busy}


def nodes(snap: Snapshot, lost: set[str]) -> list[JSONObject]:
    """Each host the sweep may use, with each of its slots: the run that holds it, or none."""
    holder: dict[tuple[str, int], str] = {}
    for a in snap.attempts:
        if a.state == State.RUNNING:
            for host, ids in a.slots.items():
                for i in ids:
                    holder[(host, i)] = a.name
    out = []
    for host, ids in snap.slots.items():
        own = snap.slot_types.get(host, {})
        out.append({"host": host, "gpu_type": snap.host_types.get(host), "lost": host in lost,
                    "slots": [{"id": i, "run": holder.get((host, i)), "gpu_type": own.get(str(i))} for i in ids]})
    return out


def best(snap: Snapshot) -> list[JSONObject]:
    """The best so far (of each GPU type, where the sweep ran on several), with how sure its value is (its 95%
    interval as `status` says it, " (95% interval ...)"; "" where its steps left none), and the config and
    command that `ds_config_optimal.json` and `cmd_optimal.txt` hold (or will hold when the sweep ends)."""
    chosen: list[tuple[str | None, Attempt]] = (
        list(snap.best_by_type.items()) if snap.by_type else ([(None, snap.best)] if snap.best else []))
    out = []
    for gpu_type, a in chosen:
        found = optimal(snap, gpu_type=gpu_type) if a.name in snap.experiments else None
        out.append({"name": a.name, "value": snap.value(a), "gpu_type": gpu_type,
                    "interval": interval_text(a.metrics, snap.metric.name),
                    "config": found[0] if found else None, "command": found[1] if found else None})
    return out


def eta(snap: Snapshot, counts: Mapping[str, int], seq: int, runner: int | None, lost: set[str], planner: Planner,
        now: float) -> JSONObject:
    """{"end": planned end or None, "why": why there is none}: the live view's re-planned ETA, while a runner
    works on the sweep and something is left."""
    left = counts.get(State.QUEUED, 0) + counts.get(State.RUNNING, 0)
    if not left:
        return {"end": None, "why": "finished"}
    if runner is None:
        return {"end": None, "why": "no runner works on this sweep (autotune resume finishes it)"}
    if snap.meta.search is not None:
        return {"end": None, "why": "the search proposes experiments as runs end"}
    plan = planner.end(snap, seq, lost, now)
    if plan is None:
        return {"end": None, "why": "planning"}
    return {"end": plan.end, "why": None if plan.end is not None else "no run has ended yet"}


def standing(snap: Snapshot, sweep_id: str, root: Path) -> JSONObject:
    """What the ledger alone says (worked out once per transition): all of the summary but the runner and ETA."""
    meta = snap.meta
    lost = lost_hosts(snap.attempts)
    started = [a.started_at for a in snap.attempts if a.started_at is not None]
    return {"id": sweep_id, "name": snap.name, "directory": _shown(snap.directory, root),
            "metric": {"name": snap.metric.name, "direction": snap.metric.direction},
            "created": meta.created, "first_start": min(started) if started else None,
            "counts": snap.counts(), "total": len(snap.attempts),
            "search": None if meta.search is None else str(meta.search.get("tuner", "gridsearch")),
            "best": best(snap), "nodes": nodes(snap, lost), "lost": sorted(lost),
            "types": snap.types if snap.by_type else []}


def summary(snap: Snapshot, base: Mapping[str, JSON], seq: int, runner: int | None, planner: Planner) -> JSONObject:
    """Everything above the table, as JSON: what the ledger says, the runner, the ETA."""
    return {**base, "runner": runner,
            "eta": eta(snap, base["counts"], seq, runner, set(base["lost"]), planner, time.time())}


def _shown(directory: Path, root: Path) -> str:
    """The sweep's directory as the person named it: relative to the directory they served, where it is inside."""
    try:
        return str(directory.relative_to(root.parent)) if directory != root else directory.name
    except ValueError:
        return str(directory)


def brief(summary_json: Mapping[str, JSON]) -> JSONObject:
    """A sweep's line in the list of sweeps."""
    return {k: summary_json[k] for k in ("id", "name", "directory", "metric", "runner", "counts", "total",
                                         "created", "eta", "search")} | {"best": summary_json["best"][:1]}
