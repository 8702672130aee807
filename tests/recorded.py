"""Recorded sweeps for the view tests: made through the API (prepare, then ledger transitions), no processes."""
from __future__ import annotations

from pathlib import Path

from autotuner import prepare
from autotuner.backends.cluster import Cluster
from autotuner.ledger.store import Ledger
from autotuner.spec import Sweep
from autotuner.spec.metrics import metric_named
from autotuner.states import State

from helpers import experiment

T0 = 1_700_000_000.0


def grid_sweep(name: str = "zm", stages=(0, 1, 2), mbs=(4, 8, 16, 32), metric: str = "throughput",
               gas=(1,)) -> Sweep:
    exps = []
    for z in stages:
        for m in mbs:
            for g in gas:
                suffix = f"_gas{g}" if len(gas) > 1 else ""
                exps.append(experiment(f"{name}_z{z}_mbs{m}{suffix}", timeout=300, ds_config={
                    "train_micro_batch_size_per_gpu": m, "gradient_accumulation_steps": g,
                    "zero_optimization": {"stage": z}, "optimizer": {"type": "Adam", "params": {"lr": 0.001}}}))
    return Sweep(name, tuple(exps), metric_named(metric), "test")


def two_nodes() -> Cluster:
    return Cluster({"node-a": (0, 1), "node-b": (0, 1, 2, 3)}, {"node-a": 2, "node-b": 4}, "cpu")


def throughput(name: str) -> float:
    """A made-up but plausible throughput: grows with micro-batch size, falls with ZeRO stage."""
    z = int(name.split("_z")[1][0])
    m = int(name.split("_mbs")[1].split("_")[0])
    return round(100.0 * m ** 0.8 / (1 + 0.25 * z), 3)


def record(directory: Path, sweep: Sweep, cluster: Cluster, *, finished: int, running: int = 0,
           fail: tuple[str, ...] = (), duration: float = 10.0, value=throughput, extra=None) -> Path:
    """Prepare the sweep, then play a first-fit schedule on the cluster's slots in the ledger: the first
    `finished` experiments end (those in `fail` as OOM failures), the next `running` are left running.
    `extra(name, throughput)` adds to a run's metrics."""
    prepare(sweep, cluster, directory, launcher=["sh", "-c", "true"])
    ledger = Ledger.open(directory)
    free = {(h, i): T0 for h, ids in cluster.slots.items() for i in ids}  # slot -> when it is free
    try:
        for n, e in enumerate(sweep.experiments[:finished + running]):
            slot = min(free, key=lambda s: (free[s], s))
            start = free[slot]
            ledger.start(e.name, 1, slots={slot[0]: [slot[1]]}, tag=f"t.{e.name}", dir=str(directory / e.name),
                         at=start)
            ledger.launched(e.name, 1, pid=10_000 + n, port=29500 + n, at=start + 0.01)
            if n >= finished:
                free[slot] = float("inf")
                continue
            took = duration * (1 + (n % 3) * 0.3)
            if e.name in fail:
                ledger.finish(e.name, 1, State.FAILED, start + took / 2, reason="oom", exit_code=1,
                              detail="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
                free[slot] = start + took / 2 + 1.5
            else:
                got = value(e.name)
                metrics = {"throughput": got, "latency": round(1000.0 / got, 6)} | (extra(e.name, got) if extra else {})
                ledger.finish(e.name, 1, State.SUCCEEDED, start + took, exit_code=0, metric=metrics[sweep.metric.name],
                              metrics=metrics)
                free[slot] = start + took + 1.5
    finally:
        ledger.close()
    return directory
