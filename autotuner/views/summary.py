"""The files a sweep leaves for people: summary.txt, the best config (ds_config_optimal.json) and its command.

All three come from the ledger's read model alone, so the runner rewrites them whenever a sweep ends (finished,
interrupted or resumed) and the report shows the same config and command before they are written. A sweep that
ran on several GPU types also leaves each type's best (`ds_config_optimal.TYPE.json`, `cmd_optimal.TYPE.txt`);
the two plain files then hold the best of its first type (hostfile order) that has one.
"""
from __future__ import annotations

import datetime
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..backends.launch import Launcher, optimal_command, without_autotuning
from ..errors import UserError
from ..files import write_atomic, write_json_atomic
from ..jsonvalues import JSONObject
from ..limits import memory
from ..spec.progress import tp_size
from ..states import State
from ..tune.batches import keeping
from ..tune.layout import lane
from ..tune.memory_loop import profile_facts
from ..tune.memory_model import Facts, budget
from ..tune.space import OFFLOAD_TAGS, SearchSpec
from .cost import Costing, costing, goal_of

if TYPE_CHECKING:  # the views import this module: a runtime import back would make a cycle
    from ..ledger.store import Attempt
    from ..spec import Experiment
    from .snapshot import Snapshot

OPTIMAL_CONFIG = "ds_config_optimal.json"
OPTIMAL_COMMAND = "cmd_optimal.txt"
SUMMARY = "summary.txt"
# The cheapest config within the deadline of the training run a tune was for, where it is not the best (cost.py).
CHEAPEST_CONFIG = "ds_config_cheapest.json"
CHEAPEST_COMMAND = "cmd_cheapest.txt"


def config_file(gpu_type: str | None = None) -> str:
    """The best config's file name: the sweep's, or one GPU type's."""
    return OPTIMAL_CONFIG if gpu_type is None else f"ds_config_optimal.{gpu_type}.json"


def command_file(gpu_type: str | None = None) -> str:
    return OPTIMAL_COMMAND if gpu_type is None else f"cmd_optimal.{gpu_type}.txt"


def optimal(snap: Snapshot, launcher: Launcher | None = None, gpu_type: str | None = None
            ) -> tuple[JSONObject, str] | None:
    """The best config (autotuning section removed) and a runnable command for it, as the files hold them;
    computed from the ledger, so it is there for a sweep that still runs, before the files are written. With
    `gpu_type`, that type's best."""
    best = snap.best if gpu_type is None else snap.best_by_type.get(gpu_type)
    if best is None:
        return None
    experiment = snap.experiments[best.name]
    config_path = (snap.directory / config_file(gpu_type)).resolve()
    return without_autotuning(experiment.config()), optimal_command(experiment, str(config_path),
                                                                    launcher or Launcher(), snap.env,
                                                                    snap.mig_of(best))


def write_outcome_files(snap: Snapshot, launcher: Launcher) -> Path | None:
    """summary.txt always; the optimal config and command when there is a best, and each GPU type's when the
    sweep ran on several. Returns the (sweep's) config's path."""
    write_atomic(snap.directory / SUMMARY, summary_text(snap))
    for gpu_type in snap.best_by_type if snap.by_type else ():
        _write_optimal(snap, launcher, gpu_type)
    found = cheapest(snap, launcher)
    if found is not None:
        write_json_atomic(snap.directory / CHEAPEST_CONFIG, found[0])
        write_atomic(snap.directory / CHEAPEST_COMMAND, found[1] + "\n")
    return _write_optimal(snap, launcher, None)


def recorded_costing(snap: Snapshot) -> Costing | None:
    """The training run the tune recorded, priced for its configs; None when it states none or cannot be
    priced (said by `report`, which refuses it in one line)."""
    try:
        return costing(snap, goal_of(snap))
    except UserError:
        return None


def cheapest(snap: Snapshot, launcher: Launcher | None = None) -> tuple[JSONObject, str] | None:
    """The config and command of the cheapest config within the deadline of the training run the tune was for,
    where it is not the best (whose files are ds_config_optimal.json and cmd_optimal.txt); else None."""
    priced = recorded_costing(snap)
    best = snap.best
    if priced is None or priced.cheapest is None or best is None or priced.cheapest == best.name:
        return None
    attempt = next(a for a in snap.attempts if a.name == priced.cheapest)
    experiment = snap.experiments[attempt.name]
    path = (snap.directory / CHEAPEST_CONFIG).resolve()
    return without_autotuning(experiment.config()), optimal_command(experiment, str(path), launcher or Launcher(),
                                                                    snap.env, snap.mig_of(attempt))


def _write_optimal(snap: Snapshot, launcher: Launcher, gpu_type: str | None) -> Path | None:
    found = optimal(snap, launcher, gpu_type)
    if found is None:
        return None
    config, command = found
    config_path = snap.directory / config_file(gpu_type)
    write_json_atomic(config_path, config)
    write_atomic(snap.directory / command_file(gpu_type), command + "\n")
    return config_path


def summary_text(snap: Snapshot) -> str:
    """summary.txt in the shape DeepSpeed's autotuner writes, so that scripts that read its summary keep
    working: a pipe table with one row per tuning space (the ZeRO stage: z0, z1, ...) that has a result and a
    `global` row, then "Tuning completed in H:MM:SS[.ffffff]. Total number of experiments: N." Names whole,
    numbers as plain as DeepSpeed prints them (no thousands separators). `autotune report` shows the rest."""
    spaces: dict[str, list[Attempt]] = {}
    profiles = _profile_runs(snap)
    for attempt in snap.attempts:
        if attempt.started_at is None or attempt.name in profiles:  # DeepSpeed counts no profile run either
            continue
        experiment = snap.experiments.get(attempt.name)
        stage = experiment.ds_config.get("zero_optimization", {}).get("stage", 0) if experiment else 0
        spaces.setdefault((f"z{stage}" if isinstance(stage, int) else "z?") + _tp_of(experiment), []).append(attempt)
    space_of = {id(a): space for space, attempts in spaces.items() for a in attempts}
    tops: dict[str, Attempt] = {}
    for a in snap.ranked:  # best first: the first of each space is its best
        if a.state == State.SUCCEEDED and snap.value(a) is not None and id(a) in space_of:
            tops.setdefault(space_of[id(a)], a)
    rows = [(space, len(spaces[space]), value, top.name) for space, top in sorted(tops.items())
            if (value := snap.value(top)) is not None]
    best = snap.best
    ran = sum(len(attempts) for attempts in spaces.values())
    if best is not None and (value := snap.value(best)) is not None:
        rows.append(("global", ran, value, best.name))
    text = pipe_table(["tuning_space", "num_experiments", "best_metric_val", "best_exp_name"], rows) if rows else ""
    starts = [a.started_at for a in snap.attempts if a.started_at is not None]
    ends = [a.finished_at for a in snap.attempts if a.finished_at is not None]
    took = datetime.timedelta(seconds=max(ends) - min(starts)) if starts and ends else datetime.timedelta(0)
    # Nothing after DeepSpeed's last line: how a tune's winner was confirmed is in the report and tune's end.
    return f"{text}\n\nTuning completed in {took}. Total number of experiments: {ran}.\n"


def _tp_of(experiment: Experiment | None) -> str:
    """A run's AutoTP size as its tuning space's suffix (`z1_tp2`), where it has one above 1."""
    size = tp_size(experiment.ds_config) if experiment is not None else 1
    return f"_tp{size}" if size > 1 else ""


DISAGREE = 0.1  # runs of one config that differ by more than this share of their mean measured the machine


def confirmation(snap: Snapshot) -> str | None:
    """How `autotune tune`'s winner was confirmed, in one line: which configs were run again, and the winner's
    runs (how many, their mean and spread), or why it is uncertain (`uncertain`). None when nothing was run
    again."""
    if not snap.runs:
        return None
    reruns = sum(len(runs) - 1 for runs in snap.runs.values())
    line = (f"Ranked by the mean of each config's runs: the best {len(snap.runs)} config(s) were run again "
            f"({reruns} re-run(s))")
    best = snap.best
    if best is None:
        return line
    if best.name not in snap.runs:
        return line + f"; the winner {best.name} ran once"
    values = _values(snap, best.name)
    mean, spread = sum(values) / len(values), max(values) - min(values)
    share = f" ({100 * spread / abs(mean):.1f}% of the mean)" if mean else ""
    why = uncertain(snap)
    if why is not None:
        return (line + f"; the winner {best.name} is uncertain: its {len(values)} runs measured "
                f"{min(values):.6g} to {max(values):.6g}, spread {spread:.6g}{share}, {why}: the measurements "
                "disagree beyond their noise (runs that share cores skew each other: fewer slots, or slots "
                "bound to their own cores, steady them)")
    return (line + f"; the winner {best.name} was confirmed: {len(values)} run(s), {snap.metric.name} mean "
            f"{mean:.6g}, spread {spread:.6g}{share}")


def _values(snap: Snapshot, name: str) -> list[float]:
    return [a.metric for a in snap.runs[name] if a.state == State.SUCCEEDED and a.metric is not None]


def uncertain(snap: Snapshot) -> str | None:
    """Why the winner's re-runs do not confirm it, or None when they do: its runs differ by more than its lead
    over the runner-up (the next config run again, by mean), or by more than DISAGREE of their mean. A winner
    whose own measurements disagree more than it leads by could as well be second."""
    best = snap.best
    if best is None or best.name not in snap.runs:
        return None
    values = _values(snap, best.name)
    if len(values) < 2:
        return None
    mean, spread = sum(values) / len(values), max(values) - min(values)
    others = [(sum(v) / len(v), name) for name in snap.runs if name != best.name and (v := _values(snap, name))]
    if others:
        runner, name = min(others, key=lambda pair: snap.metric.sort_key(pair[0]))
        lead = abs(mean - runner)
        if spread > lead:
            return (f"more than its lead over the runner-up {name} ({lead:.6g}, "
                    f"{100 * lead / abs(mean) if mean else 0:.1f}%)")
    if mean and spread > DISAGREE * abs(mean):
        return f"more than {100 * DISAGREE:.0f}% of their mean"
    return None


def batch_note(snap: Snapshot) -> str | None:
    """How `autotune tune` kept the config's fixed train_batch_size, in one line: the sizes that keep it and those
    skipped because they cannot. None without a fixed batch."""
    if snap.meta.search is None:
        return None
    spec = SearchSpec.from_json(snap.meta.search)
    if not spec.fixed_batch or spec.global_batch is None:
        return None
    kept = keeping(spec.global_batch, spec.dp, spec.min_mbs, spec.max_mbs)
    skipped = spec.max_mbs - spec.min_mbs + 1 - len(kept)
    shown_kept = ", ".join(map(str, kept[:12])) + (", ..." if len(kept) > 12 else "")
    return (f"train_batch_size {spec.global_batch} kept by every candidate (micro-batch x accumulation x "
            f"{spec.dp} data-parallel GPU(s)): micro-batch sizes {shown_kept}; {skipped} size(s) from "
            f"{spec.min_mbs} to {spec.max_mbs} skipped, they cannot keep it")


def _profile_runs(snap: Snapshot) -> set[str]:
    """The names of a tune's profile runs (memory model facts, no metric)."""
    if snap.meta.search is None:
        return set()
    spec = SearchSpec.from_json(snap.meta.search)
    return {a.name for a in snap.attempts if spec.profile_of(a.name) is not None}


_PLACE = re.compile(r"(.*)_z([0-3])_mbs([0-9]+)(?:_gas[0-9]+)?")  # (layout tag), stage, size


def memory_note(snap: Snapshot) -> str | None:
    """What `autotune tune`'s memory model said, in one line: its facts and where they come from, each stage
    skipped (cannot fit) or bounded (the predicted largest micro-batch, and the largest that ran when runs went
    past it). None when it had no GPU memory to go by (CPU slots, a type of no stated size)."""
    if snap.meta.search is None:
        return None
    spec = SearchSpec.from_json(snap.meta.search)
    if spec.gpu_memory is None:
        return None
    facts = Facts.from_json(spec.facts) if spec.facts is not None else None
    if facts is None:
        profiles = [a for a in snap.attempts if spec.profile_of(a.name) is not None]
        profile = profiles[-1] if profiles else None  # the last: those before it ran out of memory
        if profile is None or not profile.state.terminal or profile.state == State.INTERRUPTED:
            return f"Memory model: waiting for the profile run {profile.name if profile else spec.profile_name()}"
        facts = profile_facts(spec, profile.metrics, profile.name) if profile.state == State.SUCCEEDED else None
        if facts is None:
            return (f"No memory model: the profile run {profile.name} {profile.state.value} "
                    "(no model info); the sizes that fit were found by running")
    ran: dict[int, int] = {}  # lane -> the largest size that ran
    tags = {spec.layout_tag(i): i for i in range(len(spec.layouts))}
    for a in snap.attempts:
        found = _PLACE.fullmatch(a.name[len(spec.prefix):]) if a.name.startswith(spec.prefix) else None
        if found and found[1] in tags and a.state == State.SUCCEEDED:
            stage, mbs = lane(tags[found[1]], int(found[2])), int(found[3])
            ran[stage] = max(mbs, ran.get(stage, 0))
    parts = []
    for stage, bound in spec.bounds(facts).items():
        label = spec.lane_label(stage)
        if bound.largest == 0 and bound.states >= budget(spec.gpu_memory):
            parts.append(f"{label} skipped, cannot fit (model states {memory(bound.states)})")
        elif bound.largest == 0:
            parts.append(f"{label} skipped, cannot fit micro-batch {spec.min_mbs} (model states "
                         f"{memory(bound.states)}, activations {memory((facts.activation or 0) * spec.min_mbs)})")
        elif bound.largest is None:
            parts.append(f"{label} fits (model states {memory(bound.states)}), no size predicted")
        else:
            raised = f", ran up to {ran[stage]}" if ran.get(stage, 0) > bound.largest else ""
            above = f" (above the largest allowed, {spec.max_mbs})" if bound.largest > spec.max_mbs else ""
            parts.append(f"{label} up to micro-batch {bound.largest}{above}{raised}")
    parts += _offload_parts(spec, facts, {a.name for a in snap.attempts})
    activation = f", {memory(facts.activation)} of activations per sample" if facts.activation else ""
    trained = f" ({facts.trainable} trainable)" if facts.frozen else ""
    return (f"Memory model ({facts.source}: {facts.num_params} parameters{trained}{activation}; GPUs of "
            f"{memory(spec.gpu_memory)}, {memory(budget(spec.gpu_memory))} usable): " + "; ".join(parts))


def _offload_parts(spec: SearchSpec, facts: Facts, names: set[str]) -> list[str]:
    """For each offload level the search went to (its tag in an experiment's name): each stage's bound there, and
    what the node's RAM holds of it."""
    parts = []
    for level in spec.levels()[1:]:
        tag = OFFLOAD_TAGS[level.offload]
        if not any(name.endswith(tag) or f"{tag}_" in name for name in names):
            continue
        said = []
        for stage, bound in level.bounds(facts).items():
            fits = "does not fit" if bound.largest == 0 else \
                "fits" if bound.largest is None else f"up to micro-batch {bound.largest}"
            said.append(f"{level.lane_label(stage)}{tag} {fits} (node RAM {memory(bound.host)}"
                        f"{' of ' + memory(spec.host_memory) if spec.host_memory else ', not bounded'})")
        parts.append("; ".join(said))
    return parts


def pipe_table(headers: Sequence[str], rows: Sequence[Sequence[str | int | float]]) -> str:
    """A markdown pipe table laid out as the `tabulate` package lays out its "pipe" format (which DeepSpeed's
    summary uses): each column as wide as its widest cell or its header plus 2, text left and numbers right
    (aligned on the decimal point), floats as `format(x, "g")`."""
    numeric = [all(isinstance(r[i], (int, float)) and not isinstance(r[i], bool) for r in rows)
               for i in range(len(headers))]
    cells = [[_cell(value) for value in row] for row in rows]
    for i, is_number in enumerate(numeric):
        if is_number:
            column = _decimal_aligned([row[i] for row in cells])
            for row, text in zip(cells, column, strict=True):
                row[i] = text
    widths = [max([len(h) + 2] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return "| " + " | ".join(v.rjust(w) if numeric[i] else v.ljust(w)
                                 for i, (v, w) in enumerate(zip(values, widths, strict=True))) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if numeric[i] else (":" + "-" * (w + 1))
                          for i, w in enumerate(widths)) + "|"
    return "\n".join([line(list(headers)), rule, *(line(row) for row in cells)])


def _cell(value: str | int | float) -> str:
    return format(value, "g") if isinstance(value, float) else str(value)


def _decimal_aligned(texts: list[str]) -> list[str]:
    """Numbers padded so that their decimal points line up (those without one, as if it followed them)."""
    whole = [t.split(".", 1)[0] if "." in t and "e" not in t else t for t in texts]
    fraction = [t[len(w):] for t, w in zip(texts, whole, strict=True)]
    left, right = max(map(len, whole)), max(map(len, fraction))
    return [w.rjust(left) + f.ljust(right) for w, f in zip(whole, fraction, strict=True)]
