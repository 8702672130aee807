"""`autotune tune`'s search: the fastest (ZeRO stage, micro-batch size) without a hand-written grid.

A `Searcher` for the scheduler (core/roles.py): whenever slots are free and nothing waits, it is asked for the
next experiments, it learns from every run that ends, and at each reading of a running run's steps it says
whether that run can still win (outclass.py). Three tuners (DeepSpeed's `tuner_type`) share what
is learnt (`Search`: knowledge.py, the memory model's loop in memory_loop.py) and differ only in which point
they try next (`choose`):

- gridsearch (gridsearch.py): the structured walk of each stage's sizes, the stages sharing what they learn.
- random (random_tuner.py): the grid's points (space.sizes) in an order drawn from the spec's seed.
- model_based (model_based.py): Optuna's TPE through ask/tell, on the same points.

Full mode (`fast: false`) adds each stage's ZeRO knobs (spec/knobs.py): a point is then (stage, size, knobs),
the knobs those that differ from the values its micro-batch search ran with (`Setting`, in the experiment's name
and config). gridsearch sweeps them knob by knob at a stage's best size once its micro-batch search is over; the
sampling tuners draw them with the rest.

A profile run comes first where the GPUs' memory is known and the model's facts are not (memory_loop.py). When no
configuration without offload fits (the model skips every stage, or every stage's runs ran out of memory), the
search starts over at the next offload level (space.py), least offload first, each level searched as the stages
were, the fastest config of the first level where one fits named best. When the search is over, the best configs
are run once more and ranked by the mean of their runs (reruns.py). On resume the search is rebuilt by replaying
the ledger (replay.py).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..core import Queued, Run
from ..core.outcome import Outcome
from ..spec import Experiment
from ..spec.interval import StepReading
from ..spec.metrics import reported_peak
from ..states import State
from .memory_loop import MemoryLoop
from .outclass import bounded, outclassed, recorded_optimistic
from .replay import Latest, replay
from .reruns import confirm_count, interval_of, rerun_of, to_rerun


class Search(MemoryLoop):
    """What every tuner shares (see the module docstring): the Searcher protocol, the confirming re-runs, replay.
    A subclass says which points to try next (`choose`)."""

    # --- the Searcher protocol ------------------------------------------------------------------------------
    def propose(self, free_slots: int, now: float) -> list[Experiment]:
        """The next experiments; none while every point worth trying waits for a run, or the budget is spent.
        Once the search is over and nothing runs, the confirming re-runs."""
        room = max(1, free_slots // self.spec.world)  # at least one: the queue holds what does not fit yet
        if self.profile in ("wanted", "out"):  # nothing else until the model is known
            return self._profile_run()
        chosen = [] if self._stopped() else self.choose(room)
        while not chosen and not self.busy and not self.configs and not self._spent() and self._ended_on_memory() \
                and self.escalate():
            chosen = self.choose(room)  # nothing fits without (more) offload
        if chosen or self.busy:
            return chosen
        return self._confirmations()

    def _ended_on_memory(self) -> bool:
        """Whether the level searched ended on memory: a run out of memory (or time), or a stage the model ruled
        out. Runs that only crashed (a script that fails, a config refused) say nothing more offload changes:
        going on at the next level ran each stage again, offloaded, to fail the same way."""
        return any(known.too_big or (known.given_up and not known.crashed) for known in self.stages.values())

    def observe(self, run: Run | Queued, outcome: Outcome) -> None:
        self.running.pop(run.experiment.name, None)
        self._keep_interval(run.experiment.name, outcome.metrics)
        profiled = self.spec.profile_of(run.experiment.name)
        if profiled is not None:
            self.learn_profile(profiled, outcome.state, outcome.reason, outcome.metrics, outcome.detail)
            return
        value = recorded_optimistic(outcome.metrics, self.metric) if outcome.state == State.STOPPED else \
            outcome.metrics.get(self.metric.name) if outcome.metrics else None
        self.learn(run.experiment, outcome.state, outcome.reason, value, reported_peak(outcome.metrics))

    def outclassed(self, run: Run, reading: StepReading) -> str | None:
        """Why a running first run cannot be the best by its steps so far (outclass.py): worse than a config that
        finished or than another first run by its steps so far (kept here, reading by reading, until it ends);
        never a profile run or a confirming re-run."""
        name = run.experiment.name
        if self.spec.profile_of(name) is not None or rerun_of(name) is not None:
            return None
        others = {other: bounds for other, bounds in self.running.items() if other != name}
        why = outclassed(reading, self.intervals, self.configs, self.metric, others)
        so_far = bounded(reading)
        if why is None and so_far is not None:
            self.running[name] = so_far
        return why

    def choose(self, room: int) -> list[Experiment]:
        """At most `room` new experiments (`take`), none of a point known not to fit, within the budget."""
        raise NotImplementedError

    def replay(self, experiments: Sequence[Experiment], latest: Latest,
               metrics: Mapping[str, Mapping[str, float]] | None = None) -> None:
        """Rebuild from the ledger (replay.py), the first runs' intervals with it."""
        replay(self, experiments, latest, metrics)
        for name, recorded in (metrics or {}).items():
            self._keep_interval(name, recorded)

    def _keep_interval(self, name: str, metrics: Mapping[str, float] | None) -> None:
        """A first run's interval, for the re-runs' choice (reruns.overlapping)."""
        bounds = interval_of(metrics, self.metric.name)
        if bounds is not None and rerun_of(name) is None:
            self.intervals[name] = bounds

    # --- confirming the best (reruns.py) ------------------------------------------------------------------
    def confirm_count(self) -> int:
        """How many of the best configs are re-run (reruns.confirm_count)."""
        return confirm_count(self.spec.confirm, len(self.configs))

    def _confirmations(self) -> list[Experiment]:
        """Re-runs of the best configs by the mean of their runs until the top `confirm_count` have all been
        re-run: a config that a re-run brought down makes room for the next, which is re-run in turn."""
        if self.rerun_out:
            return []
        proposed = []
        for name in to_rerun(self.configs, self.confirm_count(), self.mean, self.metric.sort_key, self.reruns,
                             self.intervals):
            stage, mbs, knobs = self.configs[name]
            experiment = self.experiment(stage, mbs, rerun=True, knobs=knobs)
            if experiment.name in self.proposed:  # proposed, then cancelled: not wanted
                continue
            self.proposed.add(experiment.name)
            self.rerun_out.add(name)
            proposed.append(experiment)
        return proposed
