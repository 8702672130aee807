"""`autotune tune`'s request: the user's command (or tune file) and its config read into a search, with every
check that needs no cluster, so that a typo is one line before any cluster is asked for anything (a Slurm
allocation queued for, a host probed). Then `for_cluster` checks it against the cluster it got: the experiments'
shape, and the memory model, which refuses a tune that it already knows cannot fit any GPU at any stage, even
with offload (the node's RAM, read here for this machine, bounding what may be offloaded), and an NVMe offload
path that this machine cannot write to.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from . import limits
from .errors import UserError, shown
from .hostfile import is_local
from .memory import Bound, Facts, budget, show

if TYPE_CHECKING:
    from .cluster import Cluster
    from .search import SearchSpec
    from .spec import Sweep

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TuneRequest:
    """A tune read and checked on its own: its search (the GPUs' memory not yet known) and the config it came
    from, with the line that states the model's facts (where a tune the model rules out is refused)."""

    spec: SearchSpec
    config: Path
    facts_line: int | None = None
    inputs: tuple[str, ...] = ()  # every file it read (tune file, config, model info) and the script


def read_tune(script: str, args: Sequence[str], *, num_gpus: int | None = None, num_nodes: int | None = None,
              cwd: Path | None = None, seed: int = 0, confirm: int | None = None,
              min_gain: float = 0.0) -> TuneRequest:
    """The user's DeepSpeed command (`script` and its `args`, which name the config), or a tune file (`script` an
    .hjson file stating them: spec/tuning.py), read and checked; nothing is asked of a cluster. Each experiment
    runs on `num_nodes` x `num_gpus` slots (given here, else the tune file's, else 1). `seed`: of the random and
    model-based tuners; `confirm`: how many of the best configs are run again before the winner is named (None: 2
    when more than 2 succeeded; 0: none); `min_gain`: the fraction by which a run must beat the best so far to
    count as progress for early stopping (finite, 0 to 10)."""
    from .search import DEFAULT_PATIENCE, DEFAULT_TRIALS, MAX_MICRO_BATCH, SearchSpec
    from .spec.tuning import is_tune_file, name_prefix, read_tune_file, read_tuning, split_command

    if not 0.0 <= min_gain <= 10.0:  # NaN fails both
        raise UserError(f"--min-improvement must be a percentage from 0 to 1000, not {shown(min_gain * 100)}")
    where = cwd or Path.cwd()
    if is_tune_file(script):
        if args:
            raise UserError(f"a tune file takes no script arguments (its `args` holds them), not {shown(args[0])}; "
                            "autotune's own options go before it: autotune tune --slots 2 tune.hjson")
        told = read_tune_file(Path(script) if Path(script).is_absolute() else where / script)
        command, located, prefix, env = told.command, told.config, told.name, told.env
        num_gpus, num_nodes = num_gpus or told.num_gpus or 1, num_nodes or told.num_nodes or 1
    else:
        command, located, prefix, env = split_command(script, args, where), None, None, {}
        num_gpus, num_nodes = num_gpus or 1, num_nodes or 1
    _check_shape(num_gpus, num_nodes)
    tuning = read_tuning(command.config_path, num_gpus * num_nodes, located, command.flag)
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
                      facts=tuning.facts, mp=tuning.mp)
    if tuning.tuner != "gridsearch":  # a sampling tuner stops by DeepSpeed's defaults when the config sets none
        spec = replace(spec, trials=spec.trials or DEFAULT_TRIALS, patience=spec.patience or DEFAULT_PATIENCE)
    try:  # a long script or tune name, with full mode's knob tags, would make names no directory takes
        spec = spec.fitted()
    except ValueError as e:
        raise UserError(f"{e}: list shorter knob values in zero_optimization", command.config_path) from None
    return TuneRequest(spec, command.config_path, tuning.facts_line, (*tuning.files, command.script))


def _check_shape(num_gpus: int, num_nodes: int) -> None:
    """num_gpus and num_nodes (--num_gpus, --num_nodes, or a tune file's) within the limits of any cluster, told
    before one is asked for (a Slurm allocation): past them no cluster could run an experiment."""
    if num_gpus > limits.SLOTS_PER_HOST:
        raise UserError(f"num_gpus {num_gpus:,} is more than {limits.SLOTS_PER_HOST:,}, the most slots one host may "
                        "have")
    if num_nodes * num_gpus > limits.SLOTS:
        raise UserError(f"num_nodes {num_nodes:,} x num_gpus {num_gpus:,} is more than {limits.SLOTS:,}, the most "
                        "GPUs of one experiment")


def for_cluster(request: TuneRequest, cluster: Cluster) -> tuple[Sweep, SearchSpec]:
    """The request on `cluster`: its search bounded by the GPUs' memory, and the (empty) sweep it fills. Refused
    when its experiments cannot fit the cluster's slots, or when the memory model says that no stage tuned fits
    any of its GPUs: nothing would run, and the user learns it now rather than from "no best configuration"."""
    from .cluster import check_fits
    from .metrics import metric_named
    from .search import search_for
    from .spec import Sweep

    spec = replace(request.spec, gpu_memory=_gpu_memory(cluster), host_memory=_host_memory(cluster))
    first = search_for(spec).experiment(spec.stages[0], spec.min_mbs)
    sweep = Sweep(spec.prefix, (first,), metric_named(spec.metric), str(request.config))
    check_fits(sweep, cluster)  # every experiment of the search has the first one's shape
    _check_nvme(request, spec, cluster)
    if len(spec.levels()) > 1 and spec.host_memory is None:
        log.warning("the RAM of %s is not known: offload, if the search comes to it, is not bounded by it",
                    ", ".join(h for h in cluster.slots if not is_local(h)) or "the nodes")
    if spec.facts is not None and spec.gpu_memory is not None:
        facts = Facts.from_json(spec.facts)
        if not any(b.fits for level in spec.levels() for b in level.bounds(facts).values()):
            _check_some_stage_fits(request, spec.bounds(facts), spec)
    return Sweep(spec.prefix, (), sweep.metric, sweep.source), spec


def _check_nvme(request: TuneRequest, spec: SearchSpec, cluster: Cluster) -> None:
    """An NVMe offload path the config names must be a directory this machine can write to when it runs
    experiments here (one located line otherwise); on other nodes the run itself finds out, said once."""
    zero = spec.base.get("zero_optimization")
    for key in ("offload_optimizer", "offload_param"):
        section = zero.get(key) if isinstance(zero, Mapping) else None
        path = section.get("nvme_path") if isinstance(section, Mapping) and section.get("device") == "nvme" else None
        if not isinstance(path, str):
            continue
        if any(is_local(h) for h in cluster.slots) and not (os.path.isdir(path) and os.access(path, os.W_OK)):
            problem = "does not exist" if not os.path.exists(path) else "is not a directory this user can write to"
            raise UserError(f"zero_optimization.{key}.nvme_path {shown(path)} {problem}: offloading to NVMe needs "
                            "a directory to write to", request.config, _line_naming(request.config, path))
        if any(not is_local(h) for h in cluster.slots):
            log.warning("zero_optimization.%s.nvme_path %s is checked by each run on the other nodes", key, path)


def _line_naming(config: Path, value: str) -> int | None:
    """The first line of `config` that holds `value` (a path it names), for the line an error points at."""
    try:
        lines = config.read_text(errors="replace").splitlines()
    except OSError:
        return None
    return next((number for number, line in enumerate(lines, 1) if "nvme_path" in line and value in line), None)


def _check_some_stage_fits(request: TuneRequest, bounds: dict[int, Bound], spec: SearchSpec) -> None:
    """`run` refuses an experiment no GPU could hold; a tune whose every stage the model rules out, at every
    offload level too, is refused the same way, at the config's line that states the model's facts."""
    if not bounds or any(b.fits for b in bounds.values()):
        return
    short = [b for level in spec.levels() for b in level.bounds(Facts.from_json(spec.facts or {})).values()
             if b.host_short]
    node = (f"; offloaded, it needs at least {show(min(b.host for b in short))} of a node's RAM of "
            f"{show(spec.host_memory or 0)}") if short else ""
    least = min(bounds.values(), key=lambda b: b.states)
    room = budget(spec.gpu_memory or 0)
    facts = Facts.from_json(spec.facts or {})
    why = (f"stage {least.stage} needs {show(least.states)} for its model states alone" if least.states >= room
           else f"stage {least.stage} leaves {show(room - least.states)} for activations, less than "
                f"micro-batch size {spec.min_mbs} needs ({show((facts.activation or 0) * spec.min_mbs)})")
    stages = ", ".join(str(s) for s in spec.stages)
    offload = ", even with offload" if len(spec.levels()) > 1 else ""
    raise UserError(f"the memory model says this model ({facts.num_params:,} parameters) fits no GPU of the "
                    f"cluster at any ZeRO stage tuned ({stages}){offload}: a GPU of {show(spec.gpu_memory or 0)} "
                    f"leaves {show(room)} beside the headroom, and {why}{node}; tune on larger GPUs, or more of them "
                    "per experiment (--num_gpus)",
                    request.config, request.facts_line)


def _host_memory(cluster: Cluster) -> int | None:
    """The RAM of a node the experiments run on, which bounds what they offload: this machine's (its physical
    memory) when every host is this one; None when a host is another (a hostfile states no RAM): then offload
    is not bounded by it."""
    if not cluster.slots or not all(is_local(h) for h in cluster.slots):
        return None
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _gpu_memory(cluster: Cluster) -> int | None:
    """The memory of one GPU the memory model bounds a tune's experiments by: of the largest GPUs of the cluster
    (an experiment may land on them; smaller ones teach by running out of memory), None when a host's is not
    known (CPU slots, a type that states no size): then the model skips nothing."""
    known = [cluster.memory[host] for host in cluster.slots if host in cluster.memory]
    return max(known) if known and len(known) == len(cluster.slots) else None
