"""Each run's TFLOPs per GPU (`tflops_per_gpu`), beside its samples per second, so that candidates on different
layouts and GPU counts compare by the work each GPU did: the operations a sample costs (tune/flops.py, from the
model's facts a tune has: parameters as model_info states them or the profile run counted them, layers, hidden size
and sequence length as model_info states them) times the samples trained per second (`throughput`, per sample
under AutoTP: backends/exitstatus.py), over the run's GPUs. Worked out where the report and the dashboard read a
sweep, never recorded: absent wherever a fact or the throughput is missing, and a figure the script wrote itself
under that name is kept as written.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from ..jsonvalues import JSON
from ..ledger.store import Attempt
from ..states import State
from ..tune.flops import flops_per_sample
from ..tune.layout import arg_value, checkpointed, checkpointing
from ..tune.memory_loop import profile_facts
from ..tune.memory_model import Facts
from ..tune.space import SearchSpec

TFLOPS = "tflops_per_gpu"
THROUGHPUT = "throughput"  # samples per second, as DeepSpeed's engine writes it (per sample trained under AutoTP)
TERA = 1e12


def model_facts(spec: SearchSpec, attempt_of: Callable[[str], Attempt | None]) -> Facts | None:
    """The model's parameter counts: model_info's (or its file's), else a profile run's that succeeded; None while
    neither is known, or where the sequence, layers or hidden size the count needs are not stated."""
    if flops_per_sample(1, None, spec.shape, False) is None:  # the shape lacks what a count needs: none read
        return None
    if spec.facts is not None:
        return Facts.from_json(spec.facts)
    for stage in spec.stages:
        name = spec.profile_name(stage)
        found = attempt_of(name)
        if found is not None and found.state == State.SUCCEEDED:
            return profile_facts(spec, found.metrics, name)
    return None


def per_sample(spec: SearchSpec, facts: Facts, specs: Iterable[Mapping[str, JSON]]) -> dict[str, float]:
    """Experiment name -> the TFLOP one sample costs each of its GPUs (checkpointing on where a script knob turns it
    on as the memory model reads knobs, or the script's other arguments do: the forward pass is run twice)."""
    out: dict[str, float] = {}
    counts: dict[bool, float | None] = {}
    for found in specs:
        args = [str(a) for a in found.get("args") or []]
        on = checkpointing([(o, arg_value(args, o)) for o in spec.script_knobs]) or checkpointed(args)
        if on not in counts:
            counts[on] = flops_per_sample(facts.num_params, facts.trainable, spec.shape, on)
        flops = counts[on]
        gpus = _whole(found.get("num_gpus")) * _whole(found.get("num_nodes"))
        if flops is not None and gpus > 0:
            out[str(found.get("name"))] = flops / gpus / TERA
    return out


def _whole(value: JSON) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 1 if value is None else 0


def with_tflops(metrics: Mapping[str, float], tflop: float | None) -> Mapping[str, float]:
    """A run's metrics with its TFLOPs per GPU (`tflop`: of one sample, each GPU) beside its throughput; as they are
    where either is missing or the run wrote that figure itself."""
    samples = metrics.get(THROUGHPUT)
    if tflop is None or samples is None or TFLOPS in metrics:
        return metrics
    return {**metrics, TFLOPS: samples * tflop}
