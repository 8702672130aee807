"""GPU types and GPU memory sizes, as people write them and as NVML names them.

A GPU type is a short name (`A100-80GB`): a hostfile states it (`gpu=A100-80GB`), or NVML's model name and memory
give one for this machine. Types name files (`ds_config_optimal.<type>.json`), so they are safe as a file name.
Sizes are read the way people write them: "30GB" (10^9 bytes), "30GiB" (2^30), "30000MB", or a number of bytes.
"""
from __future__ import annotations

import math
import re

from .. import limits
from ..errors import shown
from ..jsonvalues import JSON
from ..limits import GiB

TYPE_MAX = 64
TYPE_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{TYPE_MAX - 1}}}")
UNKNOWN = "unknown"  # what the views call the type of hosts that state none

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*")
# The memory a type's name states ("A100-80GB", "H100-80GB-HBM3"): a number right before GB or GiB.
_NAMED_SIZE = re.compile(r"(?<![0-9.])(?<![0-9][eE])(\d+(?:\.\d+)?)(GB|GiB)(?![A-Za-z])", re.IGNORECASE)
# A MIG instance's type ends in its profile ("A100-SXM4-40GB-MIG-3g.20gb"): its memory is the profile's, not the GPU's.
_MIG_SIZE = re.compile(r"-MIG-(?:\d+c\.)?\d+g\.(\d+(?:\.\d+)?)gb", re.IGNORECASE)  # 1c.3g.20gb: a compute instance


def type_problem(value: object) -> str | None:
    """Why `value` cannot be a GPU type, for the message that refuses it; None when it can."""
    if isinstance(value, str) and TYPE_NAME.fullmatch(value):
        return None
    return (f"GPU type {shown(value)} must be a name of letters, digits, . _ - (not starting with . _ -), "
            f"at most {TYPE_MAX} characters")


def size_problem(gpu_type: str) -> str | None:
    """Why the size a GPU type's name states cannot be a GPU's (none, or past limits.GPU_MEMORY: `A100-0GB`,
    `A100-99999999GB` are typos); None when it can or it states none."""
    m = _MIG_SIZE.search(gpu_type) or _NAMED_SIZE.search(gpu_type)
    if m is None:
        return None
    size = size_of_type(gpu_type)
    if size is None or size > limits.GPU_MEMORY:
        return (f"GPU type {shown(gpu_type)} states {m[0]}: a GPU has more than nothing and at most "
                f"{limits.size(limits.GPU_MEMORY)}")
    return None


def parse_size(value: JSON) -> int:
    """Bytes from "30GB", "30GiB", "30000MB", "1.5TB" or a whole number of bytes; ValueError saying why not."""
    example = 'a size such as "30GB", "30GiB", "30000MB" or a number of bytes'
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"must be {example}, not {shown(value)}")
    if isinstance(value, int):
        count = value
    else:
        m = _SIZE.fullmatch(value) if len(value) <= 40 else None
        unit = _UNITS.get(m[2].lower()) if m else None
        if m is None or unit is None:
            raise ValueError(f"must be {example}, not {shown(value)}")
        count = math.floor(float(m[1]) * unit)
    if count < 1:
        raise ValueError(f"must be a positive size, not {shown(value)}")
    if count > limits.GPU_MEMORY:
        raise ValueError(f"{shown(value)} is more than {limits.size(limits.GPU_MEMORY)}, the limit")
    return count


def type_of_gpu(name: str, total: int) -> str:
    """A readable type from NVML's model name and total memory: "NVIDIA A100-SXM4-80GB" -> "A100-SXM4-80GB",
    "NVIDIA H100 PCIe" with 80 GiB -> "H100-PCIe-80GB". The size is added when the name does not state one, so
    that two sizes of one model are two types."""
    words = name.split()
    if words and words[0].upper() == "NVIDIA":
        words = words[1:]
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", "-".join(words)).strip("-._")
    if not _NAMED_SIZE.search(text):
        text = f"{text}-{round(total / GiB)}GB" if text else f"{round(total / GiB)}GB"
    return text[:TYPE_MAX].rstrip("-._") or "GPU"


def size_of_type(gpu_type: str) -> int | None:
    """The memory per GPU a type's name states ("A100-80GB": 80 GB), None when it states none. GB is read as
    10^9 bytes, a little less than the GPU has (an "80GB" A100 has 80 GiB): never more than is there. A MIG
    instance's type states its profile's memory ("...-MIG-3g.20gb": 20 GB)."""
    m = _MIG_SIZE.search(gpu_type) or _NAMED_SIZE.search(gpu_type)
    if m is None:
        return None
    gib = m.re is _NAMED_SIZE and m[2].lower() == "gib"
    return math.floor(float(m[1]) * (GiB if gib else 10**9)) or None


def headroom(size: int) -> int:
    """What is kept free on a GPU of `size` bytes beyond an experiment's stated need (CUDA's own context,
    allocator slack, a need stated a little low): 5% of it, at least 1 GiB."""
    return max(GiB, size // 20)
