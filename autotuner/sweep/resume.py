"""What `resume` adds to a sweep: its spec files read again and compared with what the ledger recorded.

A spec that changed since the sweep started is refused (the results would mix two sweeps), unless only its new
experiments are asked for; a spec that is gone (a /tmp wiped by a reboot) leaves the recorded experiments to
finish, with a note.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .. import limits
from ..errors import UserError
from ..jsonvalues import JSONObject
from ..ledger.store import FILENAME, open_sweep
from ..spec import Experiment, Sweep, SweepInputs
from ..spec.load import load_sweep


@dataclass(frozen=True)
class SpecChanges:
    """Experiment names of the spec now against the sweep's record."""

    new: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.new or self.changed or self.removed)

    def __str__(self) -> str:
        return "; ".join(f"{label}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}"
                         for label, names in (("new", self.new), ("changed", self.changed), ("removed", self.removed))
                         if names)


@dataclass(frozen=True)
class ResumePlan:
    """What `resume` runs besides what the ledger left unfinished."""

    new_experiments: tuple[Experiment, ...] = ()
    timeout: float | None = limits.DEFAULT_TIMEOUT  # the run's limit for experiments whose spec gives none
    notes: tuple[str, ...] = ()  # for the user: why the spec was not read again, or what of it is left aside
    # The sweep's record of its backend, as the ledger holds it: what a backend re-enters before anything is
    # reached (the Slurm allocation it last ran in, while that still runs). Opaque: only its backend reads it.
    recorded: JSONObject | None = None
    inputs: tuple[str, ...] = ()  # the files the spec was read from again (Sweep.paths): no output may be one


def spec_changes(directory: str | Path, sweep: Sweep) -> SpecChanges:
    """The experiments of `sweep` that are new, changed or gone against the sweep recorded in `directory`."""
    with open_sweep(directory) as ledger:
        recorded = ledger.digests()
    current = {e.name: e.digest for e in sweep.experiments}
    return SpecChanges(new=tuple(n for n in current if n not in recorded),
                       changed=tuple(n for n in current if n in recorded and recorded[n] != current[n]),
                       removed=tuple(n for n in recorded if n not in current))


def resume_plan(directory: str | Path, *, only_new: bool = False) -> ResumePlan:
    """Read the sweep's spec files again: a UserError if they changed (with `only_new`, their new experiments
    are added instead). A sweep made in Python, or whose files are gone, finishes what its ledger recorded."""
    with open_sweep(directory) as ledger:
        meta = ledger.meta()
    reload = dict(meta.reload)
    timeout = timeout_seconds(reload.get("timeout"))
    recorded = meta.backend.to_json() if meta.backend is not None else None
    try:
        inputs = SweepInputs.from_json(reload)
    except ValueError as e:
        raise UserError(f"corrupt sweep ledger: {e}", Path(directory) / FILENAME) from None
    if inputs is None:
        return ResumePlan(timeout=timeout, recorded=recorded)
    gone = [p for p in inputs.specs if not os.path.exists(p)]
    if gone:  # the ledger holds every experiment's spec: finish those
        return ResumePlan(timeout=timeout, notes=(f"{gone[0]} is gone: resuming the experiments recorded in the "
                                                  "ledger",), recorded=recorded)
    # The run's timeout is not part of the experiments: `resume --timeout` may change it.
    sweep = load_sweep(list(inputs.specs), script=inputs.script, args=inputs.args, metric=inputs.metric,
                       gpu_type=inputs.gpu_type, gpu_mixed=inputs.gpu_mixed)
    changes = spec_changes(directory, sweep)
    if changes and not only_new:
        raise UserError(f"the sweep's spec changed since it started ({changes}); `--only-new` runs just the new "
                        "experiments", sweep.source)
    new = set(changes.new) if only_new else set()
    kept = SpecChanges(changed=changes.changed, removed=changes.removed)
    notes = (f"the spec's other changes are left as recorded ({kept}): those experiments keep the config they "
             "ran with; `autotune run` starts a sweep of the spec as it is now",) if kept else ()
    return ResumePlan(tuple(e for e in sweep.experiments if e.name in new), timeout, notes=notes, recorded=recorded,
                      inputs=sweep.paths())


def timeout_seconds(value: object) -> float | None:
    """The one reading of a run's timeout for experiments whose spec gives none, whether given (`--timeout`,
    parsed to seconds or `none`) or recorded in the ledger: seconds, `none` (no limit), or nothing (not given,
    a ledger from before it was recorded, or not a usable value: the default limit)."""
    if value == "none":
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf"):
        return float(value)
    return limits.DEFAULT_TIMEOUT
