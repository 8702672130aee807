"""What one training sample costs in floating-point operations, from the model's facts: the figure behind each
candidate's TFLOPs per GPU (the reports' `tflops_per_gpu`), as NVIDIA's NeMo and Megatron report it. Pure:
numbers in, numbers out.

Per token, a dense transformer of N parameters does 2N operations forward (a multiply and an add per weight) and
4N backward (the inputs' gradients, 2N, and the weights', 2N): the usual 6N (Kaplan et al. 2020). Frozen
parameters (LoRA, PEFT) have no weight gradient: 4N + 2T with T trainable. Attention adds what no weight counts:
per layer and token 4·seq·hidden forward (the scores, QKᵀ, and their weighted sum of the values), twice that
backward, 12·layers·hidden·seq in all (PaLM, Chowdhery et al. 2022, appendix B). Activation checkpointing runs the
forward pass again in the backward pass: 2N and 4·layers·hidden·seq more, so 8N with everything training (the
figure Megatron reports with recomputation, Narayanan et al. 2021): the operations the GPUs did, not only those
the model needs. A sample is a sequence of `seq_length` tokens (DeepSpeed's throughput counts samples).

Left out: the causal mask (attention counted whole, as PaLM and Megatron count it, where FlashAttention skips the
masked half), padding, the embedding lookup counted as a matrix product (every parameter is), the optimizer's
step, the norms', activations' and softmax's element-wise operations, and communication.
"""
from __future__ import annotations

from collections.abc import Mapping

FORWARD = 2.0  # operations per weight and token forward (backward: as much for the inputs, as much for the weights)
ATTENTION = 4.0  # per layer, token, sequence position and hidden unit, forward (QKᵀ and the weighted sum)


def flops_per_sample(num_params: int, trainable: int | None, shape: Mapping[str, int] | None,
                     checkpointed: bool) -> float | None:
    """Floating-point operations one sample (a sequence) costs a training step, forward and backward (and the
    forward again with checkpointing); None where the facts lack the layers, hidden size or sequence length."""
    shape = shape or {}
    layers, hidden, seq = (shape.get(k) for k in ("num_layers", "hidden_size", "seq_length"))
    if not (num_params > 0 and layers and hidden and seq):
        return None
    trains = num_params if trainable is None else min(trainable, num_params)
    forward = FORWARD * num_params + ATTENTION * layers * hidden * seq
    backward = 2 * forward - FORWARD * (num_params - trains)  # the inputs' and the weights' gradients
    return seq * ((2 if checkpointed else 1) * forward + backward)
