"""The read model every view starts from: a sweep as its ledger shows it now, experiments ranked by the metric.

It reads the ledger and nothing else, so it is the same for a running sweep, a finished one and one that
crashed; the runner's outcome files (`results`) are written from it too.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from operator import itemgetter
from pathlib import Path

from ..errors import UserError
from ..gpu.types import UNKNOWN
from ..ledger.store import FILENAME, Attempt, Ledger, SweepMeta
from ..spec import Experiment
from ..spec.metrics import Metric, metric_named
from ..states import State
from ..tune.reruns import rerun_of


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
    def order(self) -> list[int]:
        """The ranking as positions in `attempts`: succeeded attempts best first (by `value`), then every other
        attempt in sweep order. A sweep that ran on several GPU types ranks each type apart (throughputs compare
        only on one GPU model): its types in `types` order, each best first. Views of a large sweep build their
        rows in the sweep's order (the order the ledger's rows were read, and their objects laid out in memory)
        and rank them last: built in ranked order, a report of 100,000 spent most of its time on cache misses."""
        attempts, value_of, done = self.attempts, (self.value if self.runs else None), State.SUCCEEDED
        scored, rest = [], []
        for i, a in enumerate(attempts):  # one pass: the scored, and the rest in sweep order
            value = (value_of(a) if value_of else a.metric) if a.state == done else None
            if value is None:
                rest.append(i)
            else:
                scored.append((value, i))
        if self.by_type:
            position: dict[str | None, int] = {t: i for i, t in enumerate(self.types)}
            scored.sort(key=lambda pair: (position.get(self.type_of(attempts[pair[1]]), len(position)),
                                          self.metric.sort_key(pair[0])))
        else:  # by value alone, best first; a stable sort keeps ties in sweep order, reversed or not
            scored.sort(key=itemgetter(0), reverse=not self.metric.minimize)
        return [i for _, i in scored] + rest

    @cached_property
    def ranked(self) -> list[Attempt]:
        """The attempts in `order`: succeeded best first, then the rest in sweep order (computed once)."""
        attempts = self.attempts
        return [attempts[i] for i in self.order]

    @cached_property
    def runs(self) -> dict[str, list[Attempt]]:
        """`autotune tune`'s configs run again to confirm them (search.py): the experiment's name -> its attempts,
        the first run, then its re-runs (`NAME_confirm1`), in sweep order. Empty for any other sweep."""
        if self.meta.search is None:
            return {}
        named = {a.name: a for a in self.attempts}
        groups: dict[str, list[Attempt]] = {}
        for a in self.attempts:
            first = rerun_of(a.name)
            if first is not None and first in named:
                groups.setdefault(first, [named[first]]).append(a)
        return groups

    @cached_property
    def _run_of(self) -> dict[str, str]:
        return {a.name: first for first, runs in self.runs.items() for a in runs}

    def value(self, attempt: Attempt) -> float | None:
        """What an attempt is ranked by: its metric; for a config that was run again, the mean of its runs that
        succeeded (its first run and each re-run then rank by the same value, the first run first)."""
        first = self._run_of.get(attempt.name)
        if first is None:
            return attempt.metric
        values = [a.metric for a in self.runs[first] if a.state == State.SUCCEEDED and a.metric is not None]
        return sum(values) / len(values) if values else None

    @property
    def best(self) -> Attempt | None:
        """The best attempt; of a sweep that ran on several GPU types, the best of the first type that has one."""
        order = self.order  # its first only: the ranked list of 100,000 was 2% of a report, 7% of a compare
        top = self.attempts[order[0]] if order else None
        return top if top is not None and top.state == State.SUCCEEDED and top.metric is not None else None

    @cached_property
    def host_types(self) -> dict[str, str]:
        """host -> GPU type, as the sweep recorded them (none for a ledger from before types)."""
        return dict(self.meta.gpu_types or {})

    @cached_property
    def slot_types(self) -> dict[str, dict[str, str]]:
        """host -> slot id (as the ledger's JSON has it) -> the GPU type of the slots that are devices of their
        own (MIG instances)."""
        return {h: {i: str(d.get("gpu_type")) for i, d in own.items()} for h, own in (self.meta.devices or {}).items()}

    def mig_of(self, attempt: Attempt) -> str | None:
        """The UUID of the MIG instance an attempt ran on; None when it ran on anything else."""
        if len(attempt.slots) != 1:
            return None
        ((host, ids),) = attempt.slots.items()
        device = (self.meta.devices or {}).get(host, {}).get(str(ids[0])) if len(ids) == 1 else None
        mig = device.get("mig") if device is not None else None
        return mig if isinstance(mig, str) else None

    def type_of(self, attempt: Attempt) -> str | None:
        """The GPU type an attempt ran on, from its recorded slots (a MIG instance's own type) or their hosts':
        `A+B` when it spanned types, `unknown` on hosts of no stated type; None when it never ran."""
        if not attempt.slots:
            return None
        found = set()
        for h, ids in attempt.slots.items():
            own = self.slot_types.get(h, {})
            found |= {own.get(str(i)) or self.host_types.get(h, UNKNOWN) for i in ids} if own \
                else {self.host_types.get(h, UNKNOWN)}
        return "+".join(sorted(found)) if len(found) > 1 else found.pop()

    @cached_property
    def types(self) -> list[str]:
        """The GPU types the sweep's attempts ran on: in hostfile order (a host's own type, then its devices'),
        then unknown, then spans of types."""
        if not self.host_types and not self.slot_types:  # no types recorded: one kind of GPU, as ever
            return [UNKNOWN] if any(a.slots for a in self.attempts) else []
        ran = {t for a in self.attempts if (t := self.type_of(a)) is not None}
        order = [t for h in self.meta.slots for t in (self.host_types.get(h), *self.slot_types.get(h, {}).values())]
        listed = [t for t in dict.fromkeys(order) if t is not None and t in ran]
        return listed + sorted(ran - set(listed), key=lambda t: ("+" in t, t))

    @property
    def by_type(self) -> bool:
        """Whether results are kept per GPU type: the sweep ran on more than one. Otherwise it reads as ever."""
        return len(self.types) > 1

    @cached_property
    def best_by_type(self) -> dict[str, Attempt]:
        """The best attempt of each GPU type that has one, in `types` order."""
        found: dict[str, Attempt] = {}
        attempts = self.attempts
        if not self.by_type:  # one type (or none): the first that qualifies, without asking each attempt's type
            for i in self.order:
                a = attempts[i]
                if a.state == State.SUCCEEDED and a.metric is not None and (kind := self.type_of(a)) is not None:
                    return {kind: a}
            return found
        for i in self.order:
            a = attempts[i]
            kind = self.type_of(a)
            if a.state == State.SUCCEEDED and a.metric is not None and kind is not None:
                found.setdefault(kind, a)
        return found

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
    """The sweep now. `every_experiment=False` reads only the best experiments' specs (the best of each GPU type:
    enough for status, the report and the optimal files): decoding 10,000 specs took most of `autotune status`'s
    time."""
    with Ledger.open(directory) as ledger:  # damage found mid-read ends as one line too
        meta = ledger.meta()
        name, metric, attempts = meta.name, metric_named(meta.metric), ledger.latest()
        experiments: dict[str, Experiment] = {}
        snap = Snapshot(Path(directory), name, metric, experiments, attempts, meta)
        if every_experiment:
            experiments.update((e.name, e) for e in ledger.experiments())
        else:  # filled in place once the bests are known: the ranking (a sort of every attempt) is done once
            bests = [a.name for a in snap.best_by_type.values()] + ([snap.best.name] if snap.best else [])
            experiments.update((e.name, e) for e in ledger.experiments(bests))
        return snap


def load(directory: Path, every_experiment: bool = True) -> Snapshot:
    """`snapshot` for a directory a person named: one line of bad input when it holds no sweep."""
    if not (Path(directory) / FILENAME).exists():
        raise UserError("no sweep here (no ledger.sqlite)", directory)
    return snapshot(Path(directory), every_experiment=every_experiment)


def format_slots(slots: Mapping[str, Iterable[int]] | Iterable[tuple[str, Iterable[int]]], sep: str = "@") -> str:
    """Where an attempt runs, as every view writes it: `node-a:0,1@node-b:2` (the plain event line uses " ")."""
    if isinstance(slots, (dict, Mapping)):  # a dict asked first: the ABC's check is slow
        if len(slots) == 1:  # most runs: one host (no generator per call)
            ((host, ids),) = slots.items()
            return f"{host}:{','.join(map(str, ids))}"
        pairs: Iterable[tuple[str, Iterable[int]]] = slots.items()
    else:
        pairs = slots
    return sep.join(f"{host}:{','.join(map(str, ids))}" for host, ids in pairs)
