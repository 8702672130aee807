"""What every tuner knows (`Knowledge`): the answers of the runs that ended, stage by stage (stage.py) and for
full mode's knob points, the points proposed, the best so far, the re-runs' measurements, and the experiment each
point is (its config, its name). A tuner asks it which points are still open (`open`) and marks the ones it
takes (`take`).

An OOM is an answer (that size and every larger one of the stage do not fit: none of them is ever launched),
never retried; so is a timeout. A stage whose runs fail for another reason is given up. Knob points are learnt
apart (`knob_*`): their answers say nothing of the stage's sizes.
"""
from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import replace

from ..jsonvalues import JSON
from ..spec import Experiment
from ..spec.metrics import Metric, metric_named
from ..spec.model import option_text, with_arg, with_mapped_args
from ..states import Reason, State
from .knobs import BY_KEY, tag_value
from .layout import LANE, arg_value, lane, layout_of, stage_of
from .memory_model import Training
from .reruns import Bounds, mean_of, rerun_name, rerun_of
from .space import OFFLOAD_TAGS, Point, SearchSpec, Setting
from .stage import Stage, ordered, ruled_out_above, vouched


class Knowledge:
    """What runs taught, the budget, and the experiments of the points (see the module docstring)."""

    def __init__(self, spec: SearchSpec):
        self.own = spec.own_offload()
        self.spec = replace(spec, offload=self.own)  # at the offload level searched: `escalate` moves it on
        self.levels = spec.levels()
        self.metric: Metric = metric_named(spec.metric)
        self.stages = {lane_: Stage() for lane_ in spec.lanes}  # by lane: one per stage with one layout
        self.proposed: set[str] = set()
        self.trials: list[tuple[int, int]] = []  # the search's points in the order proposed (the ledger's)
        self.best: float | None = None
        self.since_best = 0  # runs ended since the best got better
        self.configs: dict[str, Point] = {}  # each config that succeeded -> its point, in order
        self.first: dict[str, float] = {}  # each config that succeeded -> the metric of its first run
        # full mode: each stage's knob space, and what the knob points (those with a Setting) taught
        self.spaces = {lane(i, int(s)): {k: list(v) for k, v in space.items()} for s, space in spec.knobs.items()
                       for i in range(len(spec.layouts))}
        # each layout by what an experiment shows of it: its TP size, and its knobs' values as argument text
        self._layout_keys: dict[tuple[int | None, tuple[str | None, ...]], int] = {
            (size, tuple(option_text(v) for _, v in knobs)): i
                             for i, (size, knobs) in enumerate(spec.layouts)}
        self.top_keys = {s: [k for k in space if BY_KEY[k].top] for s, space in self.spaces.items()}
        self.knob_trials: list[Point] = []  # in the order proposed (the ledger's)
        self.knob_fits: dict[Point, float] = {}
        self.knob_oom: dict[tuple[int, Setting], int] = {}  # (stage, knobs) -> the smallest size out of memory
        self.knob_out: set[Point] = set()
        self.reruns: dict[str, float | None] = {}  # a config re-run -> the re-run's metric (None: out or failed)
        self.intervals: dict[str, Bounds] = {}  # a config -> its first run's interval (reruns.overlapping)
        self.running: dict[str, Bounds] = {}  # a first run still running -> its interval so far (outclass.py)
        self.rerun_out: set[str] = set()
        for known in self.stages.values():
            known.top = spec.max_mbs
        self.peaks: dict[tuple[int, int], float] = {}  # (stage, size) that fit -> the peak memory it held

    @property
    def busy(self) -> bool:
        """Some point of the search still runs (or waits to)."""
        return any(known.out for known in self.stages.values()) or bool(self.knob_out)

    def open(self, stage: int, mbs: int, knobs: Setting = ()) -> bool:
        """Worth proposing: never tried, and not known not to fit (with those knobs: an OOM without knobs says
        so for every setting; one with knobs, for those knobs)."""
        return self.open_below(stage, mbs, knobs, self.ruled_out_above(stage))

    def open_below(self, stage: int, mbs: int, knobs: Setting, above: int | None) -> bool:
        """`open`, with the stage's `ruled_out_above` worked out by the caller (once for many points)."""
        known = self.stages.get(stage)
        return known is not None and not known.given_up and not known.pruned(mbs) and \
            mbs < (above or mbs + 1) and \
            mbs < self.knob_oom.get((stage, knobs), mbs + 1) and \
            self.name_of(stage, mbs, knobs) not in self.proposed

    def open_points(self, sizes: Sequence[int]) -> list[Point]:
        """Every open point (`open`) of the grid of `sizes`, in the order stage, size, knobs: what each stage rules
        out worked out once, not once a point (the grid may hold thousands)."""
        found: list[Point] = []
        for stage in self.spec.lanes:
            known = self.stages.get(stage)
            if known is None or known.given_up:
                continue
            above, settings = self.ruled_out_above(stage), self.settings(stage)
            for mbs in sizes:
                if known.pruned(mbs) or mbs >= (above or mbs + 1):
                    continue
                found += [(stage, mbs, knobs) for knobs in settings if mbs < self.knob_oom.get((stage, knobs), mbs + 1)
                          and self.name_of(stage, mbs, knobs) not in self.proposed]
        return found

    def substitute(self, stage: int, mbs: int, knobs: Setting = ()) -> int | None:
        """For the sampling tuners: a point above the memory model's ceiling that no run ruled out stands for the
        ceiling itself (the predicted largest size, or the probe past it), when that is open; else None."""
        known = self.stages.get(stage)
        if known is None or known.predicted is None or any(mbs >= small for small in known.too_big):
            return None
        ceiling = known.ceiling()
        return ceiling if mbs > ceiling >= self.spec.min_mbs and self.open(stage, ceiling, knobs) else None

    def take(self, stage: int, mbs: int, knobs: Setting = ()) -> Experiment | None:
        """The experiment for a point, marked proposed; None when it was proposed before."""
        experiment = self.experiment(stage, mbs, knobs=knobs)
        if experiment.name in self.proposed:
            return None
        self.proposed.add(experiment.name)
        if knobs:
            self.knob_out.add((stage, mbs, knobs))
            self.knob_trials.append((stage, mbs, knobs))
        else:
            self.stages[stage].out.add(mbs)
            self.trials.append((stage, mbs))
        return experiment

    def settings(self, stage: int) -> list[Setting]:
        """Every combination of a stage's knobs (full mode), the one its micro-batches ran with first; [()] in
        fast mode."""
        space = self.spaces.get(stage, {})
        return [self.setting(stage, dict(zip(space, values, strict=True)))
                for values in itertools.product(*space.values())]

    def setting(self, stage: int, values: Mapping[str, JSON]) -> Setting:
        """Knob values as a point holds them: those that differ from the stage's first values, in its order."""
        space = self.spaces.get(stage, {})
        return tuple((k, values[k]) for k in space if k in values and values[k] != space[k][0])

    def best_size(self, stage: int) -> int:
        """The micro-batch size of a stage with the best metric (ties: the larger)."""
        fits = self.stages[stage].fits
        return min(fits, key=lambda mbs: (self.metric.sort_key(fits[mbs]), -mbs))


    # --- what the stages tell each other (stage.py) ------------------------------------------------------
    def ordered(self) -> bool:
        """Whether the runs agree that a lower stage needs at least the memory of a higher one (stage.ordered)."""
        return ordered(self.stages, self.spec.needs_at_least)

    def vouched(self, stage: int) -> int | None:
        """The largest size known to fit at `stage`: its own, or one that fits at a lower stage."""
        return vouched(self.stages, stage, self.spec.needs_at_least)

    def ruled_out_above(self, stage: int) -> int | None:
        """The smallest size known not to fit at `stage`: its own, or one where a higher stage ran out of memory."""
        return ruled_out_above(self.stages, stage, self.spec.needs_at_least)

    # --- learning -----------------------------------------------------------------------------------------
    def learn(self, experiment: Experiment, state: State, reason: str | None, value: float | None,
              peak: int | None = None) -> None:
        """One ended run (or, replaying, one recorded). Interrupted or cancelled ones teach nothing: they are
        run again (resume) or were not wanted. `peak`: the GPU memory it held at most (memory_loop.py)."""
        self._learn(experiment, state, reason, value, peak)

    def _learn(self, experiment: Experiment, state: State, reason: str | None, value: float | None,
               peak: int | None) -> None:
        rerun = rerun_of(experiment.name)
        if self.spec.profile_of(experiment.name) is not None:
            return
        if rerun is not None:
            self.rerun_out.discard(rerun)
            self.reruns[rerun] = value if state == State.SUCCEEDED else None
            return
        placed = self.place_of(experiment)
        if placed is None or placed[0] not in self.stages or self.level_of(experiment) != self.spec.offload:
            return
        stage, mbs = placed
        knobs = self.setting_of(experiment)
        if knobs:
            self._learn_knobs(experiment.name, (stage, mbs, knobs), state, reason, value)
            return
        known = self.stages[stage]
        known.out.discard(mbs)
        if state == State.SUCCEEDED and value is not None:
            known.fits[mbs] = value
            if peak:
                self.peaks[(stage, mbs)] = float(peak)
            self.configs[experiment.name] = (stage, mbs, ())
            self.first[experiment.name] = value
            if self._improves(value):
                self.since_best = 0
                return
        elif state == State.STOPPED and value is not None:  # it fits, and is at best `value`: worse than the best
            known.fits[mbs] = value
        elif state in (State.FAILED, State.TIMED_OUT) and (reason == Reason.OOM or state == State.TIMED_OUT):
            known.too_big.add(mbs)
            if reason == Reason.OOM:
                known.oom.add(mbs)
        elif state in (State.FAILED, State.SUCCEEDED):  # a crash, a refused config, no metric: not a size answer
            known.crashed.add(mbs)
            known.given_up = True
        else:
            return
        self.since_best += 1

    def _improves(self, value: float) -> bool:
        """Whether `value` improves on the best so far by the spec's margin (`min_gain`, a fraction of the best):
        what early stopping counts as progress. A better value becomes the best either way, so creeping gains
        below the margin do not keep a search alive."""
        best = self.best
        if best is not None and not self.metric.better(value, best):
            return False
        self.best = value
        return best is None or abs(value - best) >= self.spec.min_gain * abs(best)

    def _learn_knobs(self, name: str, point: Point, state: State, reason: str | None, value: float | None) -> None:
        """One ended run of a knob point: its metric, or that those knobs do not run at that size (out of memory
        or time: not at any larger size either; refused or no metric: that point only). The stage's micro-batch
        answers are not touched."""
        self.knob_out.discard(point)
        if state == State.SUCCEEDED and value is not None:
            self.knob_fits[point] = value
            self.configs[name], self.first[name] = point, value
            if self._improves(value):
                self.since_best = 0
                return
        elif state == State.STOPPED and value is not None:  # at best `value` (outclass.py): never a config
            self.knob_fits[point] = value
        elif state in (State.FAILED, State.TIMED_OUT, State.SUCCEEDED):  # no metric
            if state == State.TIMED_OUT or reason == Reason.OOM:
                stage, mbs, knobs = point
                self.knob_oom[(stage, knobs)] = min(mbs, self.knob_oom.get((stage, knobs), mbs))
        else:
            return
        self.since_best += 1


    # --- stopping -----------------------------------------------------------------------------------------
    def _stopped(self) -> bool:
        """Early stopping: `patience` runs ended without a better result."""
        return self.spec.patience is not None and self.since_best >= self.spec.patience

    def _spent(self) -> bool:
        """The trial budget is used up (confirming re-runs are not trials of the search)."""
        return self.spec.trials is not None and len(self.trials) + len(self.knob_trials) >= self.spec.trials



    def mean(self, name: str) -> float:
        """A config's metric over its runs that succeeded: the first, and its re-run."""
        return mean_of(self.first[name], self.reruns.get(name))

    # --- experiments --------------------------------------------------------------------------------------
    def experiment(self, stage: int, mbs: int, rerun: bool = False, knobs: Setting = ()) -> Experiment:
        """The experiment for one stage and micro-batch size (and, in full mode, ZeRO knobs): the user's config
        with them set, gradient accumulation derived to keep the global batch, and the script's arguments mapped.
        `rerun`: the confirming re-run of that config."""
        spec = self.spec
        config = copy.deepcopy(dict(spec.base))
        config.setdefault("zero_optimization", {})["stage"] = stage_of(stage)
        size, script_knobs = spec.layouts[layout_of(stage)]
        if size is not None:  # the user's section kept (its other keys), its size the layout's
            section = config.get("tensor_parallel")
            config["tensor_parallel"] = {**(section if isinstance(section, dict) else {}), "autotp_size": size}
        for key, value in knobs:  # a config key (gradient accumulation) or a zero_optimization one
            (config if BY_KEY[key].top else config["zero_optimization"])[key] = value
        config["train_micro_batch_size_per_gpu"] = mbs
        gas = self.accumulation_of(stage, mbs)
        if gas is not None:
            config["gradient_accumulation_steps"] = gas
            if spec.global_batch is not None:  # the global batch it keeps, written as DeepSpeed checks it
                config["train_batch_size"] = mbs * gas * spec.dp
        name = self.name_of(stage, mbs, knobs)
        template = dict(spec.template)
        args = with_mapped_args(template.pop("args", []), config, template.pop("arg_mappings", {}))
        for option, value in script_knobs:
            args = with_arg(args, option, option_text(value))
        return Experiment.from_json({**template, "name": rerun_name(name) if rerun else name, "ds_config": config,
                                     "args": args})

    def name_of(self, stage: int, mbs: int, knobs: Setting = ()) -> str:
        """The name of `experiment(stage, mbs, knobs=knobs)`, without building it: whether a point was proposed is
        asked of every point of the grid when a sampling tuner looks for the open ones."""
        spec = self.spec
        name = f"{spec.prefix}{spec.layout_tag(layout_of(stage))}_z{stage_of(stage)}_mbs{mbs}"
        gas = self.accumulation_of(stage, mbs)
        if gas is not None:
            name += f"_gas{gas}"
        name += OFFLOAD_TAGS[spec.offload] if spec.offload > self.own else ""
        return name + "".join(f"_{BY_KEY[key].tag}{tag_value(value)}" for key, value in knobs)

    def accumulation_of(self, stage: int, mbs: int) -> int | None:
        """The accumulation a point runs with where it is not the config's own (None): derived to keep a global
        batch (SearchSpec.accumulation), or, for a size gridsearch measured below its stage's largest, to keep
        that size's batch per GPU (SearchSpec.config_accumulation), fixed when proposed so that the point's name
        and its re-runs' never change."""
        gas = self.spec.accumulation(mbs)
        known = self.stages.get(stage)
        return known.accumulation.get(mbs) if gas is None and known is not None else gas

    def remember_accumulation(self, experiment: Experiment) -> None:
        """Replaying the ledger: a micro-batch trial that ran with a derived accumulation keeps it."""
        own, placed = self.spec.config_accumulation(), self.place_of(experiment)
        gas = experiment.ds_config.get("gradient_accumulation_steps")
        if own is not None and placed is not None and placed[0] in self.stages and isinstance(gas, int) \
                and gas != own and not self.setting_of(experiment):
            self.stages[placed[0]].accumulation[placed[1]] = gas

    def place_of(self, experiment: Experiment) -> tuple[int, int] | None:
        """(lane, micro-batch size) of one of the search's experiments, read from its config (the stage, the TP
        size) and its arguments (the script knobs' values); None for what is no point of the search."""
        config = experiment.ds_config
        stage = (config.get("zero_optimization") or {}).get("stage")
        mbs = config.get("train_micro_batch_size_per_gpu")
        if not (isinstance(stage, int) and isinstance(mbs, int) and 0 <= stage < LANE):
            return None
        section = config.get("tensor_parallel")
        size = section.get("autotp_size") if isinstance(section, dict) and self.spec.tp else None
        size = size if isinstance(size, int) else None
        texts = tuple(arg_value(experiment.args, option) for option in self.spec.script_knobs)
        index = self._layout_keys.get((size, texts))
        return (lane(index, stage), mbs) if index is not None else None

    def setting_of(self, experiment: Experiment) -> Setting:
        """The knobs of one of the search's experiments, read from its config (() for a micro-batch trial)."""
        config = experiment.ds_config
        zero = config.get("zero_optimization") or {}
        placed = self.place_of(experiment)
        if placed is None:
            return ()
        stage = placed[0]
        top = self.top_keys.get(stage)  # gradient accumulation given as a list: a key of the config itself
        return self.setting(stage, {**zero, **{k: config[k] for k in top if k in config}} if top else zero)



    def level_of(self, experiment: Experiment) -> int:
        """The offload level of one of the search's experiments, read from its config."""
        training = Training.of(experiment.ds_config)
        return 2 if training.offload_params else 1 if training.offload_optimizer else 0

