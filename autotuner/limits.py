"""Bounds on what a user's input may make us read or build, each named in the message that refuses it.

A spec or a hostfile is read before anything in it can be checked, and a few bytes can ask for a lot: a billion
slots, a grid of 10^7 points, one large ds_config copied into every experiment. Each such amplifier is bounded
here, far above real use, so that memory and time stay bounded on every input.
"""
from __future__ import annotations

FILE_BYTES = 1 << 20  # one sweep file, experiment file, ds_config file or hostfile
SWEEP_BYTES = 128 << 20  # every file one sweep reads, plus the ds_configs its spaces build
EXPERIMENTS = 100_000  # experiments in one sweep (every file and directory of it together)
SPACE_KEYS = 100  # keys of one space
DEPTH = 64  # nesting of objects and lists in a spec or ds_config
SLOTS_PER_HOST = 1024  # `slots=N` of a hostfile line, `--slots N`, an experiment's num_gpus
SLOTS = 65_536  # slots of a whole cluster; also the most GPUs (num_gpus x num_nodes) of one experiment
SECONDS = 1_000_000  # a timeout, deadline or grace period (11.6 days); the OS's waits overflow near 24.8 days
ARGUMENT = 128 << 10  # Linux's MAX_ARG_STRLEN: the most bytes of one argument or environment string of a launch
COUNT = 10 ** 9  # a whole number of a tune's config: sizes, steps, trials, train_batch_size, accumulation
PRICE = 10 ** 6  # the most a GPU-hour may cost (--gpu-hour-cost, a hostfile's gpu_hour_cost=)
GPU_MEMORY = 16 << 40  # what one experiment may ask of each GPU (`gpu_memory`); GPUs have a few hundred GiB


MiB = 1 << 20
GiB = 1 << 30


def size(count: int) -> str:
    """A bound in bytes as people read it: `16 MiB`, `512 KiB`, `100 bytes`."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count >= 1 << shift:
            value = count / (1 << shift)
            return f"{value:.0f} {unit}" if value == int(value) or value >= 10 else f"{value:.1f} {unit}"
    return f"{count} bytes"

def memory(count: float) -> str:
    """GPU memory for a message or a table: GiB to a tenth ("27.9 GiB", "80 GiB"), MiB below one GiB, KiB below
    one MiB (a small model's activations per sample, 41 KiB on a real GPU, read "0 MiB" before)."""
    unit, name = (GiB, "GiB") if count >= GiB else (MiB, "MiB") if count >= MiB or not count else (1024, "KiB")
    return f"{count / unit:.1f}".removesuffix(".0") + f" {name}"


# Seconds an experiment may run when neither its spec nor --timeout says: a hung rank must not hold its slots
# forever. `--timeout none` lifts it.
DEFAULT_TIMEOUT = 3600.0
