"""The sweep's settings as `prepare` records them in the ledger's meta table: one JSON value per key, checked
when a ledger is opened."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import ClassVar

from .. import limits
from ..jsonvalues import JSON, JSONObject
from .schema import LEGACY_RECORDS


@dataclass(frozen=True)
class BackendRecord:
    """What the sweep's backend recorded of its cluster: its kind (the registry picks the backend by it) and
    data that backend alone reads back (how hosts are reached, the allocation or the cluster it ran in). Opaque
    to everything outside backends/, so that a new kind of cluster changes neither the ledger nor its readers."""

    kind: str
    data: Mapping[str, JSON] = field(default_factory=dict)

    @classmethod
    def from_json(cls, value: object) -> BackendRecord | None:
        """The record as the meta table holds it ({kind, data}); None when it is not one."""
        if not isinstance(value, dict) or not isinstance(value.get("kind"), str) \
                or not isinstance(value.get("data", {}), dict):
            return None
        return cls(str(value["kind"]), dict(value.get("data") or {}))

    def to_json(self) -> JSONObject:
        return {"kind": self.kind, "data": dict(self.data)}


@dataclass(frozen=True)
class SweepMeta:
    """The sweep's settings, as `prepare` recorded them in the meta table (one JSON value per key).

    The first five are what every command relies on; the rest have defaults, for ledgers written before them.
    Keys this version does not know are kept in `extra`, never an error: a newer autotuner may add some.
    """

    name: str
    metric: str  # as `metric_named` reads it: "throughput", or "loss:min"
    sweep_id: str  # the first part of every attempt's tag
    slots: Mapping[str, tuple[int, ...]]  # the slot ids of each host the sweep may use, in hostfile order
    launcher: tuple[str, ...]  # DeepSpeed's launcher, as an argv prefix
    source: str = ""  # the sweep file(s) it was read from
    created: float | None = None  # seconds since the epoch
    capacity: Mapping[str, int] = field(default_factory=dict)  # every slot of each host (the hostfile's)
    accelerator: str = "cuda"
    env: Mapping[str, str] = field(default_factory=dict)  # what every experiment's environment gets
    reload: Mapping[str, JSON] = field(default_factory=dict)  # how `resume` reads the sweep's spec again
    backend: BackendRecord | None = None  # what the sweep's backend recorded of its cluster, once one did
    search: Mapping[str, JSON] | None = None  # `autotune tune`: the search that proposes the experiments
    # host -> GPU type, and host -> bytes per GPU, of the hosts where known; None (a ledger from before types, or
    # a cluster that states none): no types, every host as any other.
    gpu_types: Mapping[str, str] | None = None
    gpu_memory: Mapping[str, int] | None = None
    # host -> slot id (a string) -> {gpu_type, memory, mig}: this machine's MIG instances (core.slots.Device)
    devices: Mapping[str, Mapping[str, Mapping[str, JSON]]] | None = None
    placement: str | None = None  # the placement a runner was last told to use (None: the default)
    # experiment -> bytes per GPU it is taken to need, learned from an earlier sweep's peaks (learned.py)
    learned_memory: Mapping[str, int] | None = None
    # GPU type -> price of a GPU-hour, as the hostfile's gpu_hour_cost= states it: what a report prices a training
    # run with where neither its options nor the tune name a price for that type
    gpu_prices: Mapping[str, float] | None = None
    extra: Mapping[str, JSON] = field(default_factory=dict)

    # The JSON type of each key in the table; the first five must be there.
    _TYPES: ClassVar[dict[str, type | tuple[type, ...]]] = {
        "name": str, "metric": str, "sweep_id": str, "slots": dict, "launcher": list, "source": str,
        "created": (int, float), "capacity": dict, "accelerator": str, "env": dict, "reload": dict,
        "backend": dict, "search": (dict, type(None)), "gpu_types": dict, "gpu_memory": dict,
        "devices": dict, "placement": str, "learned_memory": dict, "gpu_prices": dict}
    _REQUIRED: ClassVar[tuple[str, ...]] = ("name", "metric", "sweep_id", "slots", "launcher")

    @classmethod
    def problem(cls, data: Mapping[str, JSON]) -> str | None:
        """What makes the table's values unusable, in words; None when they are fine."""
        for key, kind in cls._TYPES.items():
            if key not in data:
                if key in cls._REQUIRED:
                    return f"meta {key!r} is missing"
            elif not isinstance(data[key], kind) or isinstance(data[key], bool):
                return f"meta {key!r} is not a {'number' if key == 'created' else _json_kind(kind)}"
        if not all(isinstance(v, str) for v in dict(data.get("gpu_types") or {}).values()):
            return "meta 'gpu_types' holds a type that is not a string"
        for key in ("gpu_memory", "learned_memory"):
            if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                       for v in dict(data.get(key) or {}).values()):
                return f"meta {key!r} holds a size that is not a positive integer"
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= limits.PRICE
                   for v in dict(data.get("gpu_prices") or {}).values()):
            return "meta 'gpu_prices' holds a price that is not a number from 0 to 1,000,000"
        if "backend" in data and BackendRecord.from_json(data["backend"]) is None:
            return "meta 'backend' is not {kind, data}"
        devices = dict(data.get("devices") or {}).values()
        if not all(isinstance(own, dict) and all(str(i).isdigit() and isinstance(d, dict)
                                                 and isinstance(d.get("gpu_type"), str) for i, d in own.items())
                   for own in devices):
            return "meta 'devices' holds a slot that is not {gpu_type, memory, mig}"
        return None

    @classmethod
    def from_json(cls, data: Mapping[str, JSON]) -> SweepMeta:
        """The settings from the table's decoded values (checked first with `problem`). A ledger from before
        schema 8, read as it is, has its backend's record under that kind's own key (`LEGACY_RECORDS`)."""
        known = {f.name for f in fields(cls)} - {"extra", "backend"}
        legacy = {key for key, _ in LEGACY_RECORDS} if "backend" not in data else set()
        values = {k: v for k, v in data.items() if k in known}
        values["slots"] = {str(h): tuple(ids) for h, ids in dict(values["slots"]).items()}
        values["launcher"] = tuple(values["launcher"])
        for key in ("env", "capacity", "gpu_types", "gpu_memory", "learned_memory", "gpu_prices"):
            if key in values:
                values[key] = {str(k): v if key in ("capacity", "gpu_memory", "learned_memory") else
                               float(v) if key == "gpu_prices" else str(v) for k, v in values[key].items()}
        return cls(**values, backend=_backend(data),
                   extra={k: v for k, v in data.items() if k not in known | legacy | {"backend"}})

    def to_json(self) -> JSONObject:
        """The table's values: the same keys and JSON a ledger has always held (`slots` as lists)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        data["slots"] = {h: list(ids) for h, ids in self.slots.items()}
        data["launcher"] = list(self.launcher)
        for key in ("capacity", "env", "reload", "search", "gpu_types", "gpu_memory", "devices", "learned_memory",
                    "gpu_prices"):
            data[key] = None if data[key] is None else dict(data[key])
        data["backend"] = None if self.backend is None else self.backend.to_json()
        # Unset: left out, as ledgers always had it (the backend's record is written by the first runner).
        return {k: v for k, v in data.items() if v is not None} | dict(self.extra)


def _backend(data: Mapping[str, JSON]) -> BackendRecord | None:
    """The backend's record; before schema 8, the last of the legacy keys the table has (the order in which the
    registry asked the kinds: a Ray record over a Slurm one over the SSH settings)."""
    if "backend" in data:
        return BackendRecord.from_json(data["backend"])
    return next((BackendRecord(kind, dict(value)) for key, kind in reversed(LEGACY_RECORDS)
                 if isinstance(value := data.get(key), dict)), None)


def _json_kind(kind: type | tuple[type, ...]) -> str:
    return (kind if isinstance(kind, type) else kind[0]).__name__
