"""How the throughput scales with the world size, for a tune that searched several (`tune --num_gpus 1,2,4
--num_nodes 1,2`): the best config at each size (GPUs and the nodes they were spread over: 4 GPUs on one node and on
two are two sizes, since crossing nodes costs), its throughput per GPU, the scaling efficiency (throughput per GPU
against the smallest size's) and where adding GPUs stops paying. Measured sizes only: each row is a config that ran
at that size; nothing is extrapolated past them.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..jsonvalues import JSONObject
from .cost import RATE, gpus_words, measured_configs
from .snapshot import Snapshot

# Adding GPUs stops paying where the next size's efficiency falls below this share of the smallest size's:
# each GPU added then brings less than half of what one GPU did alone.
PAYS = 0.5


@dataclass(frozen=True)
class Size:
    """The best config measured at one size: a GPU count over a number of nodes."""

    gpus: int
    nodes: int
    name: str
    rate: float  # samples per second: the mean of its runs
    runs: int
    configs: int  # configs measured at this size

    @property
    def per_gpu(self) -> float:
        return self.rate / self.gpus

    @property
    def label(self) -> str:
        return f"{self.gpus}" + (f" ({self.nodes} nodes)" if self.nodes > 1 else "")

    @property
    def where(self) -> str:
        return gpus_words(self.gpus, self.nodes)


@dataclass(frozen=True)
class Scaling:
    sizes: tuple[Size, ...]  # fewest GPUs first, then fewest nodes

    def efficiency(self, size: Size) -> float:
        """Throughput per GPU against the smallest size's."""
        return size.per_gpu / self.sizes[0].per_gpu

    @property
    def stops_paying(self) -> Size | None:
        """The first size at which adding GPUs stops paying: no faster than the best of fewer GPUs, or below PAYS
        efficiency; None when every measured size pays."""
        for size in self.sizes[1:]:
            before = self.before(size)
            if before is not None and (size.rate <= before.rate or self.efficiency(size) < PAYS):
                return size
        return None

    def before(self, size: Size) -> Size | None:
        """The fastest size of fewer GPUs than `size` (None: it has the fewest)."""
        return max((s for s in self.sizes if s.gpus < size.gpus), key=lambda s: s.rate, default=None)

    def verdict(self) -> str:
        stop = self.stops_paying
        if stop is None:
            last = self.sizes[-1]
            return (f"every measured size pays: {last.where} are {self.efficiency(last):.0%} efficient (not "
                    f"measured beyond {last.gpus})")
        before = self.before(stop)
        assert before is not None  # stops_paying: a size with one before it
        why = "no faster than" if stop.rate <= before.rate else f"{self.efficiency(stop):.0%} efficient against"
        return f"adding GPUs stops paying at {stop.where}: {stop.name} is {why} {before.where}"

    def basis(self) -> str:
        return (f"each size's best config by its measured {RATE} (the mean of its runs); efficiency: throughput "
                f"per GPU against {self.sizes[0].where}; measured sizes only")

    def cells(self) -> list[tuple[str, ...]]:
        return [(s.label, s.name, f"{s.rate:,.4g}", f"{s.per_gpu:,.4g}", f"{self.efficiency(s):.0%}",
                 str(s.configs), str(s.runs)) for s in self.sizes]

    HEADERS = ("GPUs", "best config", "samples/s", "per GPU", "efficiency", "configs", "runs")

    def to_json(self) -> JSONObject:
        stop = self.stops_paying
        return {"basis": self.basis(), "stops_paying_at": stop.gpus if stop else None,
                "stops_paying_nodes": stop.nodes if stop else None, "verdict": self.verdict(),
                "sizes": [{"gpus": s.gpus, "nodes": s.nodes, "best": s.name, "samples_per_s": s.rate,
                           "per_gpu": s.per_gpu, "efficiency": self.efficiency(s), "configs": s.configs, "runs": s.runs}
                          for s in self.sizes]}


def scaling(snap: Snapshot) -> Scaling | None:
    """The scaling of a sweep whose configs that succeeded ran at two sizes or more; None otherwise."""
    best: dict[tuple[int, int], Size] = {}
    configs: dict[tuple[int, int], int] = {}
    for m in measured_configs(snap):
        size = (m.gpus, m.nodes)
        configs[size] = configs.get(size, 0) + 1
        if size not in best or m.rate > best[size].rate:
            best[size] = Size(m.gpus, m.nodes, m.name, m.rate, len(m.rates), 0)
    if len(best) < 2:
        return None
    return Scaling(tuple(Size(g, n, s.name, s.rate, s.runs, configs[g, n]) for (g, n), s in sorted(best.items())))
