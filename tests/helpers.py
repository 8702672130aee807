"""Small builders shared by the unit tests."""
from __future__ import annotations

import re
from pathlib import Path

from autotuner.backends.ssh.probe import hostfile_check
from autotuner.core import MemoryRecord, Queued, Scheduler, SlotPool
from autotuner.ledger.store import SweepMeta
from autotuner.spec import Experiment
from autotuner.tune.outclass import MIN_STEPS
from autotuner.views.hosts import render_hosts_check
from autotuner.views.tables import PLAIN, Output


def experiment(name: str, *, num_gpus: int = 1, num_nodes: int = 1, script: str = "/bin/true",
               args: tuple[str, ...] = (), ds_config: dict | None = None, timeout: float | None = None,
               env: dict | None = None, estimate: float | None = None) -> Experiment:
    return Experiment(name=name, ds_config=ds_config or {"train_micro_batch_size_per_gpu": 1}, num_gpus=num_gpus,
                      num_nodes=num_nodes, script=script, args=tuple(args), timeout=timeout, env=env or {},
                      source="test", estimate=estimate)


# What a ledger's meta must hold for it to open (autotuner.prepare records this and more).
SWEEP_META = SweepMeta(name="s", metric="throughput", sweep_id="sid", slots={"localhost": (0,)},
                       launcher=("deepspeed",))


def core(exps: list[Experiment], slots: dict | None = None, **options: object) -> Scheduler:
    """A scheduler on a memory record with `exps` queued (one slot of host h unless `slots` says otherwise)."""
    scheduler = Scheduler(MemoryRecord(), SlotPool(slots or {"h": [0]}), "sid", Path("/results"), "throughput",
                          **options)
    scheduler.record.add_experiments(exps, 0.0)
    scheduler.submit(Queued(e, 1) for e in exps)
    return scheduler


def decided(detail: str) -> tuple[float, str, float]:
    """What a stop's detail says decided it: (the run's optimistic bound, the config it is behind, that one's
    pessimistic bound: a finished config's, or a first run's still running, by its steps so far). The interval
    recorded at the run's end counts the steps it made after that too."""
    found = re.fullmatch(r"outclassed after (\d+) measured steps: its throughput is at most ([\d,.]+) \(95% interval "
                         r"[\d,.]+ to [\d,.]+\), (\S+)'s at least ([\d,.]+)( \(still running\))?", detail)
    assert found is not None, detail
    assert int(found[1]) >= MIN_STEPS  # measured steps after warm-up (tune/outclass.py)
    return float(found[2].replace(",", "")), found[3], float(found[4].replace(",", ""))


def render_hosts(title, listed, reports, fmt: str = "table", output: Output = PLAIN) -> str:
    """`autotune hosts` of a hostfile's hosts probed over SSH: the SSH backend's HostsCheck, rendered."""
    return render_hosts_check(hostfile_check(title, listed, reports), fmt, output)
