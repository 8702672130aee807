"""The read model every view starts from: a sweep as its ledger shows it now, experiments ranked by the metric.

It reads the ledger and nothing else, so it is the same for a running sweep, a finished one and one that
crashed; the runner's outcome files (`results`) are written from it too.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from ..errors import UserError
from ..ledger import FILENAME, Attempt, Ledger, SweepMeta
from ..metrics import Metric, metric_named
from ..spec import Experiment
from ..states import State


@dataclass(frozen=True)
class Snapshot:
    """A sweep as its ledger shows it now."""

    directory: Path
    name: str
    metric: Metric
    experiments: Mapping[str, Experiment]
    attempts: Sequence[Attempt]  # latest attempt of each experiment, in sweep order
    meta: SweepMeta

    @cached_property
    def ranked(self) -> list[Attempt]:
        """Succeeded attempts best first, then every other attempt in sweep order (computed once)."""
        scored = [(value, a) for a in self.attempts if a.state == State.SUCCEEDED and (value := a.metric) is not None]
        scored.sort(key=lambda pair: self.metric.sort_key(pair[0]))
        chosen = {id(a) for _, a in scored}  # by id: `in` on a list compared dataclasses, O(n^2) on 10k
        return [a for _, a in scored] + [a for a in self.attempts if id(a) not in chosen]

    @property
    def best(self) -> Attempt | None:
        ranked = self.ranked
        top = ranked[0] if ranked else None
        return top if top is not None and top.state == State.SUCCEEDED and top.metric is not None else None

    def counts(self) -> dict[str, int]:
        """How many experiments stand in each state (their latest attempt)."""
        return count_states(a.state for a in self.attempts)

    @property
    def slots(self) -> dict[str, list[int]]:
        """host -> the slot ids the sweep may use, as recorded when it was prepared."""
        return {h: list(ids) for h, ids in self.meta.slots.items()}

    @property
    def env(self) -> dict[str, str]:
        """The environment the sweep's runs get (the optimal command repeats it)."""
        return {k: str(v) for k, v in self.meta.env.items()}


def count_states(states: Iterable[str]) -> dict[str, int]:
    """state -> how many, in the order the states first occur: the one count the report, status and live view
    all show."""
    return dict(Counter(states))


def snapshot(directory: Path, *, every_experiment: bool = True) -> Snapshot:
    """The sweep now. `every_experiment=False` reads only the best experiment's spec (enough for status,
    the report and the optimal files): decoding 10,000 specs took most of `autotune status`'s time."""
    with Ledger.open(directory) as ledger:  # damage found mid-read ends as one line too
        meta = ledger.meta()
        name, metric, attempts = meta.name, metric_named(meta.metric), ledger.latest()
        if every_experiment:
            experiments = {e.name: e for e in ledger.experiments()}
        else:
            best = Snapshot(Path(directory), name, metric, {}, attempts, meta).best
            experiments = {e.name: e for e in ledger.experiments([best.name] if best else [])}
        return Snapshot(Path(directory), name, metric, experiments, attempts, meta)


def load(directory: Path, every_experiment: bool = True) -> Snapshot:
    """`snapshot` for a directory a person named: one line of bad input when it holds no sweep."""
    if not (Path(directory) / FILENAME).exists():
        raise UserError("no sweep here (no ledger.sqlite)", directory)
    return snapshot(Path(directory), every_experiment=every_experiment)


def format_slots(slots: Mapping[str, Iterable[int]] | Iterable[tuple[str, Iterable[int]]], sep: str = "@") -> str:
    """Where an attempt runs, as every view writes it: `node-a:0,1@node-b:2` (the plain event line uses " ")."""
    pairs = slots.items() if isinstance(slots, Mapping) else slots
    return sep.join(f"{host}:{','.join(map(str, ids))}" for host, ids in pairs)
