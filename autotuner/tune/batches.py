"""The micro-batch sizes that keep a fixed `train_batch_size`: the divisors of its share of one data-parallel GPU.
They are found from the square root up (a batch of 10^9 has at most 1,344 of them, in 31,623 tries), never by
trying every size below a bound: a batch of 10^15 over two GPUs made that a loop of hours."""
from __future__ import annotations

import bisect
import functools
import math


@functools.lru_cache(maxsize=16)
def divisors(number: int) -> tuple[int, ...]:
    """Every divisor of a positive `number`, smallest first."""
    small = [d for d in range(1, math.isqrt(number) + 1) if number % d == 0]
    return tuple(sorted({*small, *(number // d for d in small)}))


def largest_keeping(batch: int, dp: int, low: int, high: int) -> int | None:
    """The largest micro-batch size from `low` to `high` that times a whole accumulation times `dp` GPUs makes
    `batch`; None when none does."""
    found = keeping(batch, dp, low, high)
    return found[-1] if found else None


def keeping(batch: int, dp: int, low: int, high: int) -> list[int]:
    """Every micro-batch size from `low` to `high` that keeps `batch` over `dp` GPUs, smallest first."""
    if batch % dp or high < low:
        return []
    found = divisors(batch // dp)
    return list(found[bisect.bisect_left(found, low):bisect.bisect_right(found, high)])
