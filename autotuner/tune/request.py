"""`autotune tune`'s request: the user's command (or tune file) and its config read into a search, with every
check that needs no cluster, so that a typo is one line before any cluster is asked for anything (a Slurm
allocation queued for, a host probed). Then `sweep.create.for_cluster` checks it against the cluster it got: the
experiments' shape, and the memory model, which refuses a tune that it already knows cannot fit any GPU at any
stage, even with offload (the node's RAM, read there for this machine, bounding what may be offloaded), and an
NVMe offload path that this machine cannot write to.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import limits
from ..errors import UserError, shown
from .goal import Goal
from .inputs import name_prefix, read_tuning, split_command
from .space import DEFAULT_PATIENCE, DEFAULT_TRIALS, MAX_MICRO_BATCH, SearchSpec
from .tunefile import is_tune_file, read_tune_file
from .untilsure import CONFIGS, Asked
from .worlds import sizes


@dataclass(frozen=True)
class TuneRequest:
    """A tune read and checked on its own: its search (the GPUs' memory not yet known) and the config it came
    from, with the line that states the model's facts (where a tune the model rules out is refused)."""

    spec: SearchSpec
    config: Path
    facts_line: int | None = None
    inputs: tuple[str, ...] = ()  # every file it read (tune file, config, model info) and the script
    nvme_lines: dict[str, int] = field(default_factory=dict)  # offload section -> its nvme_path's line in config


def read_tune(script: str, args: Sequence[str], *, num_gpus: int | Sequence[int] | None = None,
              num_nodes: int | Sequence[int] | None = None,
              cwd: Path | None = None, seed: int = 0, confirm: int | None = None,
              min_gain: float = 0.0, goal: Goal | None = None, until_sure: Asked = CONFIGS) -> TuneRequest:
    """The user's DeepSpeed command (`script` and its `args`, which name the config), or a tune file (`script` an
    .hjson file stating them: tune/inputs.py), read and checked; nothing is asked of a cluster. Each experiment
    runs on `num_nodes` x `num_gpus` slots (given here, else the tune file's, else 1). `seed`: of the random and
    model-based tuners; `confirm`: how many of the best configs are run again before the winner is named (None: 2
    when more than 2 succeeded; 0: none); `min_gain`: the fraction by which a run must beat the best so far to
    count as progress for early stopping (finite, 0 to 10); `goal`: the training run it is for, as options state
    it (over the config's autotuning section, key by key). Several `num_gpus` or `num_nodes` search each world
    size they make (worlds.py), every size checked here as one would be. `until_sure`: the options' tolerance and
    most measured steps, over the config's (untilsure.py)."""
    if not 0.0 <= min_gain <= 10.0:  # NaN fails both
        raise UserError(f"--min-improvement must be a percentage from 0 to 1000, not {shown(min_gain * 100)}")
    where = cwd or Path.cwd()
    gpus_asked, nodes_asked = _listed(num_gpus), _listed(num_nodes)
    num_gpus, num_nodes = gpus_asked[0] if gpus_asked else None, nodes_asked[0] if nodes_asked else None
    if is_tune_file(script):
        if args:
            raise UserError(f"a tune file takes no script arguments (its `args` holds them), not {shown(args[0])}; "
                            "autotune's own options go before it: autotune tune --slots 2 tune.hjson")
        told = read_tune_file(Path(script) if Path(script).is_absolute() else where / script)
        command, located, prefix, env = told.command, told.config, told.name, told.env
        gpus_asked, nodes_asked = gpus_asked or told.num_gpus, nodes_asked or told.num_nodes  # the options win
        num_gpus, num_nodes = (gpus_asked or (1,))[0], (nodes_asked or (1,))[0]
    else:
        command, located, prefix, env = split_command(script, args, where), None, None, {}
        num_gpus, num_nodes = num_gpus or 1, num_nodes or 1
    worlds = sizes(gpus_asked or (num_gpus,), nodes_asked or (num_nodes,))
    for gpus, nodes in worlds:  # each size as a tune of its own would be checked (mp_size, the batch, TP)
        _check_shape(gpus, nodes)
        if len(worlds) > 1:
            read_tuning(command.config_path, gpus * nodes, located, command.flag, gpus, until_sure)
    num_gpus, num_nodes = worlds[0]
    tuning = read_tuning(command.config_path, num_gpus * num_nodes, located, command.flag, num_gpus, until_sure)
    wanted = _goal(goal, tuning.goal, tuning.shape)
    template = {"script": command.script, "args": list(command.args), "num_gpus": num_gpus, "num_nodes": num_nodes,
                "source": str(command.config_path), "config_flag": command.flag, "arg_mappings": tuning.arg_mappings}
    if env:
        template["env"] = env
    spec = SearchSpec(prefix=prefix or name_prefix(command.script), template=template, base=tuning.base,
                      stages=tuning.stages, metric=tuning.metric, min_mbs=tuning.min_mbs,
                      max_mbs=tuning.max_mbs or MAX_MICRO_BATCH, measure=tuning.measure,
                      global_batch=tuning.global_batch, fixed_batch=tuning.fixed_batch, trials=tuning.trials,
                      patience=tuning.patience,
                      tuner=tuning.tuner, seed=seed, confirm=confirm, min_gain=min_gain,
                      knobs={str(stage): space for stage, space in tuning.knobs.items() if space},
                      facts=tuning.facts, mp=tuning.mp, tp=tuning.tp, script_knobs=tuning.script_knobs,
                      shape=tuning.shape, goal=wanted.to_json() if wanted.wanted else None,
                      worlds=worlds if len(worlds) > 1 else ())
    if tuning.tuner != "gridsearch":  # a sampling tuner stops by DeepSpeed's defaults when the config sets none
        spec = replace(spec, trials=spec.trials or DEFAULT_TRIALS, patience=spec.patience or DEFAULT_PATIENCE)
    try:  # a long script or tune name, with full mode's knob tags, would make names no directory takes
        spec = spec.fitted()
    except ValueError as e:
        raise UserError(f"{e}: list shorter knob values in zero_optimization", command.config_path) from None
    return TuneRequest(spec, command.config_path, tuning.facts_line, (*tuning.files, command.script),
                       tuning.nvme_lines)


def _check_shape(num_gpus: int, num_nodes: int) -> None:
    """num_gpus and num_nodes (--num_gpus, --num_nodes, or a tune file's) within the limits of any cluster, told
    before one is asked for (a Slurm allocation): past them no cluster could run an experiment."""
    if num_gpus > limits.SLOTS_PER_HOST:
        raise UserError(f"num_gpus {num_gpus:,} is more than {limits.SLOTS_PER_HOST:,}, the most slots one host may "
                        "have")
    if num_nodes * num_gpus > limits.SLOTS:
        raise UserError(f"num_nodes {num_nodes:,} x num_gpus {num_gpus:,} is more than {limits.SLOTS:,}, the most "
                        "GPUs of one experiment")


def _goal(options: Goal | None, section: Goal, shape: dict[str, int] | None) -> Goal:
    """The options' goal over the section's, checked as one: a token goal needs a sequence length (the
    options', the section's, or the model's)."""
    if options is None or options == Goal():
        return section  # checked at its lines as it was read
    goal = options.over(section)
    goal.check()
    goal.sequence((shape or {}).get("seq_length"))
    return goal


def _listed(value: int | Sequence[int] | None) -> tuple[int, ...]:
    """num_gpus / num_nodes as one count or several."""
    if value is None:
        return ()
    return (value,) if isinstance(value, int) else tuple(value)
