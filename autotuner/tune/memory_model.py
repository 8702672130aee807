"""The memory model of `autotune tune`: what one GPU must hold for a ZeRO stage and a micro-batch size, so that stages
that cannot fit are skipped and the search's micro-batch sizes are bounded before anything runs out of memory. Pure:
numbers in, numbers out (the search and the report call it; nothing here reads a file or a GPU).

Per GPU, a model of N parameters trained with mixed precision (fp16 or bf16) holds its 2-byte parameters and
gradients and, for the optimizer, a 4-byte fp32 copy of the parameters plus the optimizer's fp32 states (Adam: 2, 8
bytes; SGD with momentum, Adagrad, Lion: 1, 4 bytes); in fp32 the parameters and gradients are 4 bytes each and
there is no copy (the ZeRO paper's accounting). Frozen parameters (LoRA, PEFT: `trainable_num_params` below
`num_params`) have no gradient, copy or optimizer state: only the trainable ones are counted for those. ZeRO
partitions over the data-parallel GPUs: stage 1 the optimizer states (the fp32 copy included), stage 2 also the
gradients, stage 3 also the parameters. Offloading the optimizer (`offload_optimizer.device` cpu or nvme, stage 1
and up) takes its states off the GPU; offloading the parameters (`offload_param`, stage 3) takes them off too. Model
parallelism (`mp_size`) divides all of it. Tensor parallelism (AutoTP, `tp`) divides what it shards (every parameter
but the `whole` ones: the embedding, the norms) and leaves the rest whole on each rank; ZeRO then partitions over the
data-parallel group only (`dp` is world / TP: never counted twice, unlike DeepSpeed's own estimate, DeepSpeed issue
6796). Activations are a figure per sample (a profile run's, or the one `model_info` states, at TP 1 without
checkpointing) times the micro-batch, times the layout's share (layout.activation_share). What is kept free on
top (CUDA's context, the allocator's slack, ZeRO's
buckets) is the placement's headroom.

Offloaded states land in the node's RAM (`host_states`): per rank its partition of the optimizer states (the fp32
copy included) and the fp32 gradients its CPU optimizer steps with (pinned buffers), and with `offload_param` its
partition of the parameters; one such share per local rank (the GPUs of the node); offloaded to NVMe, none of
it (its staging buffers are not modelled). A config whose share exceeds
the node's memory less its headroom does not fit, as one that exceeds the GPU's; a node of unknown memory
constrains nothing.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .. import limits
from ..gpu.types import headroom
from ..jsonvalues import JSON, JSONObject

ONE_STATE = ("sgd", "adagrad", "lion", "fusedlion", "cpuadagrad", "onebitsgd")  # optimizers with one fp32 state
OFF_GPU = ("cpu", "nvme")


@dataclass(frozen=True)
class Facts:
    """What is known of the model: its parameter count, and its activation memory per sample of the micro-batch
    on one GPU (None: not known, so no micro-batch size is predicted); `source` says where they come from.
    `trainable`: the parameters that train (LoRA / PEFT freeze the rest), None when all do; only they have
    gradients and optimizer states."""

    num_params: int
    activation: float | None = None
    source: str = "model_info"
    trainable: int | None = None

    def to_json(self) -> JSONObject:
        return {"num_params": self.num_params, "activation": self.activation, "source": self.source,
                "trainable": self.trainable}

    @classmethod
    def from_json(cls, data: Mapping[str, JSON]) -> Facts:
        trainable = data.get("trainable")
        return cls(int(data["num_params"]), data.get("activation"), str(data.get("source", "model_info")),
                   int(trainable) if trainable is not None else None)

    @property
    def frozen(self) -> bool:
        """Some parameters do not train: the memory line says how many do."""
        return self.trainable is not None and self.trainable < self.num_params


@dataclass(frozen=True)
class Training:
    """What a DeepSpeed config says of the memory its training needs: precision, optimizer, offload."""

    half: bool = False  # fp16 or bf16: 2-byte parameters and gradients, an fp32 copy with the optimizer
    optimizer_states: int = 2  # fp32 values per parameter the optimizer keeps (Adam: 2)
    offload_optimizer: bool = False
    offload_params: bool = False
    on_nvme: bool = False  # what is offloaded goes to NVMe, not the node's RAM (its buffers aside)

    @classmethod
    def of(cls, config: Mapping[str, JSON]) -> Training:
        """From the config's fp16 / bf16 sections, its optimizer and zero_optimization's offload sections. A
        value "auto" (Hugging Face fills it in) counts as the smaller need: the model must not skip what fits."""
        half = any(_enabled(config.get(key)) for key in ("fp16", "bf16", "bfloat16"))
        optimizer = config.get("optimizer")
        kind = str(optimizer.get("type", "")).lower() if isinstance(optimizer, Mapping) else ""
        zero = config.get("zero_optimization")
        zero = zero if isinstance(zero, Mapping) else {}
        return cls(half=half, optimizer_states=1 if kind in ONE_STATE else 2,
                   offload_optimizer=_offloaded(zero.get("offload_optimizer")) or zero.get("cpu_offload") is True,
                   offload_params=_offloaded(zero.get("offload_param")),
                   on_nvme=_on_nvme(zero))


def _enabled(section: JSON) -> bool:
    return isinstance(section, Mapping) and section.get("enabled") in (True, "auto")


def _on_nvme(zero: Mapping[str, JSON]) -> bool:
    """Something is offloaded, all of it to NVMe (none to the CPU)."""
    devices = [section.get("device") for key in ("offload_optimizer", "offload_param")
               if isinstance(section := zero.get(key), Mapping)]
    return "nvme" in devices and "cpu" not in devices and zero.get("cpu_offload") is not True


def _offloaded(section: JSON) -> bool:
    return isinstance(section, Mapping) and section.get("device") in OFF_GPU


def _sharded(count: float, tp: int, whole: float) -> float:
    """A rank's share of `count` parameters under `tp`-way tensor parallelism, `whole` of them not split."""
    kept = min(whole, count)
    return kept + (count - kept) / tp


def model_states(num_params: int, stage: int, training: Training, dp: int, mp: int = 1,
                 trainable: int | None = None, tp: int = 1, whole: float = 0.0) -> float:
    """Bytes one GPU holds for parameters, gradients and optimizer states at a ZeRO stage, `dp` data-parallel
    GPUs, `mp`-way model parallelism and `tp`-way tensor parallelism (`whole` parameters not split by it;
    activations not included). Of `trainable` parameters only (all when None) are there gradients, an fp32 copy
    and optimizer states: frozen ones are only held."""
    width = 2.0 if training.half else 4.0
    trained = _sharded(num_params if trainable is None else min(trainable, num_params), tp, whole)
    params, grads = _sharded(num_params, tp, whole) * width, trained * width
    optimizer = trained * 4.0 * (training.optimizer_states + (1 if training.half else 0))
    if stage >= 1:
        optimizer = 0.0 if training.offload_optimizer else optimizer / dp
    if stage >= 2:
        grads /= dp
    if stage >= 3:
        params = 0.0 if training.offload_params else params / dp
    return (params + grads + optimizer) / mp


def host_states(num_params: int, stage: int, training: Training, dp: int, local: int, mp: int = 1,
                trainable: int | None = None, tp: int = 1, whole: float = 0.0) -> float:
    """Bytes one node's RAM holds for what a config offloads, `local` ranks on the node: each rank's partition of
    the optimizer states with the fp32 gradients they step with (offload_optimizer, stage 1 and up), and of the
    half or full parameters (offload_param, stage 3). 0 when nothing is offloaded to the CPU."""
    if training.on_nvme:
        return 0.0
    width = 2.0 if training.half else 4.0
    trained = _sharded(num_params if trainable is None else min(trainable, num_params), tp, whole)
    held = _sharded(num_params, tp, whole)
    share = 0.0
    if stage >= 1 and training.offload_optimizer:
        share += trained * 4.0 * (training.optimizer_states + (1 if training.half else 0) + 1) / dp
    if stage >= 3 and training.offload_params:
        share += held * width / dp
    return share * local / mp


@dataclass(frozen=True)
class Bound:
    """The model's answer for one stage: the bytes of model states, and the largest micro-batch size that
    fits (0: none, the stage cannot fit; None: the states fit, and with no activation figure no size is
    predicted). `host`: the bytes a node's RAM holds for what the config offloads; `host_short`: more than the
    node has (so largest is 0)."""

    stage: int
    states: float
    largest: int | None
    host: float = 0.0
    host_short: bool = False

    @property
    def fits(self) -> bool:
        return self.largest != 0


def budget(gpu_memory: int) -> int:
    """What an experiment may use of a GPU: all of it but the headroom (5%, at least 1 GiB)."""
    return gpu_memory - headroom(gpu_memory)


def bound(facts: Facts, training: Training, stage: int, gpu_memory: int | None, dp: int, mp: int = 1,
          min_mbs: int = 1, host_memory: int | None = None, local: int = 1, tp: int = 1, whole: float = 0.0,
          activation: float | None = None) -> Bound:
    """The largest micro-batch size of `stage` that the model says fits on a GPU of `gpu_memory` bytes (None: not
    known, no size predicted) beside what it offloads to a node of `host_memory` bytes with `local` ranks (None:
    not known, no constraint); 0 when not even `min_mbs` does. `tp`, `whole`: tensor parallelism (model_states);
    `activation`: the bytes a sample needs on a rank of this layout (default: the facts' figure)."""
    states = model_states(facts.num_params, stage, training, dp, mp, facts.trainable, tp, whole)
    host = host_states(facts.num_params, stage, training, dp, local, mp, facts.trainable, tp, whole)
    per_sample = facts.activation if activation is None else activation
    if host_memory is not None and host > 0 and host > budget(host_memory):
        return Bound(stage, states, 0, host, True)
    if gpu_memory is None:
        return Bound(stage, states, None, host)
    room = budget(gpu_memory) - states
    if room <= 0:
        return Bound(stage, states, 0, host)
    if not per_sample:
        return Bound(stage, states, None, host)
    # A sub-byte figure (stated, or measured by the loop) made the quotient infinite: no size past COUNT is meant.
    largest = int(room // per_sample) if room / per_sample < limits.COUNT else limits.COUNT
    return Bound(stage, states, largest if largest >= min_mbs else 0, host)


