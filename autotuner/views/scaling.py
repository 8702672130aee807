"""How the throughput scales with the world size, for a tune that searched several (`tune --num_gpus 1,2,4`):
the best config at each GPU count, its throughput per GPU, the scaling efficiency (throughput per GPU against the
smallest size's) and where adding GPUs stops paying. Measured sizes only: each row is a config that ran at that
size; nothing is extrapolated past them.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..jsonvalues import JSONObject
from .cost import RATE, measured
from .snapshot import Snapshot

# Adding GPUs stops paying where the next size's efficiency falls below this share of the smallest size's:
# each GPU added then brings less than half of what one GPU did alone.
PAYS = 0.5


@dataclass(frozen=True)
class Size:
    """The best config measured at one GPU count."""

    gpus: int
    name: str
    rate: float  # samples per second: the mean of its runs
    runs: int
    configs: int  # configs measured at this size

    @property
    def per_gpu(self) -> float:
        return self.rate / self.gpus


@dataclass(frozen=True)
class Scaling:
    sizes: tuple[Size, ...]  # smallest first

    def efficiency(self, size: Size) -> float:
        """Throughput per GPU against the smallest size's."""
        return size.per_gpu / self.sizes[0].per_gpu

    @property
    def stops_paying(self) -> Size | None:
        """The first size at which adding GPUs stops paying: no faster than the size before it, or below PAYS
        efficiency; None when every measured size pays."""
        for before, size in zip(self.sizes, self.sizes[1:], strict=False):
            if size.rate <= before.rate or self.efficiency(size) < PAYS:
                return size
        return None

    def verdict(self) -> str:
        stop = self.stops_paying
        if stop is None:
            return (f"every measured size pays: {self.sizes[-1].gpus} GPUs are {self.efficiency(self.sizes[-1]):.0%} "
                    f"efficient (not measured beyond {self.sizes[-1].gpus})")
        before = self.sizes[self.sizes.index(stop) - 1]
        why = "no faster than" if stop.rate <= before.rate else f"{self.efficiency(stop):.0%} efficient against"
        return f"adding GPUs stops paying at {stop.gpus}: {stop.name} is {why} {before.gpus} GPU(s)"

    def basis(self) -> str:
        return (f"each size's best config by its measured {RATE} (the mean of its runs); efficiency: throughput "
                f"per GPU against {self.sizes[0].gpus} GPU(s); measured sizes only")

    def cells(self) -> list[tuple[str, ...]]:
        return [(str(s.gpus), s.name, f"{s.rate:,.4g}", f"{s.per_gpu:,.4g}", f"{self.efficiency(s):.0%}",
                 str(s.configs), str(s.runs)) for s in self.sizes]

    HEADERS = ("GPUs", "best config", "samples/s", "per GPU", "efficiency", "configs", "runs")

    def to_json(self) -> JSONObject:
        stop = self.stops_paying
        return {"basis": self.basis(), "stops_paying_at": stop.gpus if stop else None, "verdict": self.verdict(),
                "sizes": [{"gpus": s.gpus, "best": s.name, "samples_per_s": s.rate, "per_gpu": s.per_gpu,
                           "efficiency": self.efficiency(s), "configs": s.configs, "runs": s.runs}
                          for s in self.sizes]}


def scaling(snap: Snapshot) -> Scaling | None:
    """The scaling of a sweep whose configs that succeeded ran at two GPU counts or more; None otherwise."""
    best: dict[int, Size] = {}
    configs: dict[int, int] = {}
    for name, gpus, _, rates in measured(snap):
        rate = sum(rates) / len(rates)
        configs[gpus] = configs.get(gpus, 0) + 1
        if gpus not in best or rate > best[gpus].rate:
            best[gpus] = Size(gpus, name, rate, len(rates), 0)
    if len(best) < 2:
        return None
    return Scaling(tuple(Size(g, s.name, s.rate, s.runs, configs[g]) for g, s in sorted(best.items())))
