"""Running attempts on a Ray cluster: each one a driver process here (driver.py) that reserves its GPUs with a
placement group and runs DeepSpeed's per-node launcher on each of its nodes from an actor. `RayDrivers` is the
`local.executor.Processes` a LocalExecutor runs, so timeouts, cancels and adoption after a crash of the runner are
the local executor's own (the driver is to an attempt what `srun` is to a Slurm step).

Ending an attempt: SIGTERM to the driver, which ends every node's launcher (SIGTERM, the grace period,
SIGKILL) and releases the placement group; then, whatever the driver managed, the attempt's actors and
placement group are ended from here (`release`), and the local executor ends the driver's group. A run that did
not succeed on a node Ray lost is interrupted and its host reported lost, to run again elsewhere.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.events import HostLost, Key, Post, Run
from ...core.outcome import Outcome
from ...spec.hostfile import format_hostfile
from ...spec.metrics import Metric
from ...states import Reason, State
from ..launch import Command, Launcher, comm_buffer_prefix, deepspeed_command, with_autotuning
from ..local.executor import Adopted, Child
from .connect import NAMESPACE
from .node import LOST

ATTEMPT_FILE = "ray_attempt.json"  # the driver's instructions, in the run's directory
DRIVER = "autotuner.backends.ray.driver"
DRIVER_MARGIN = 10.0  # seconds past the grace period for a driver to release what it holds once told to stop


@dataclass
class RayDrivers:
    """Attempts on the Ray cluster at `address` (see the module docstring): the Processes a LocalExecutor runs."""

    address: str
    metric: Metric
    launcher: Launcher = field(default_factory=Launcher)
    env: Mapping[str, str] = field(default_factory=dict)
    grace: float = 10.0
    nodes: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # host -> {id, ip} (meta.ray's nodes)
    capacity: Mapping[str, int] = field(default_factory=dict)  # host -> its GPUs, for DeepSpeed's hostfile
    # End what Ray holds of a tag: its nodes' launchers (within a grace period), actors, placement group (backend)
    release: Callable[[str, float], None] = lambda tag, grace: None
    on_lost: Callable[[str], None] = lambda host: None  # a host found lost here (the watcher follows it)
    waits_for_start: bool = False  # the driver's pid is recorded at once

    def __post_init__(self) -> None:
        self._plans: dict[Key, dict[str, Any]] = {}  # the driver's instructions, from `command` to `prepare`
        self._lock = threading.Lock()

    def command(self, run: Run, port: int) -> tuple[dict[str, Any], Command]:
        metrics_path = str(run.dir / "metrics.json")
        config = with_autotuning(run.experiment.config(), metrics_path, self.metric.name)
        hosts = run.reservation.hosts
        launcher = Launcher(self.launcher.executable, self.nodes[hosts[0]]["ip"], self.launcher.options)
        inner = deepspeed_command(
            run.experiment, run.reservation, config, hostfile=str(run.dir / "hostfile"), master_port=port,
            metric_path=metrics_path, tag=run.tag, cwd=str(Path(run.experiment.script).parent),
            launcher=launcher, env=self.env, placement=())
        words = len(launcher.executable)
        plan = {
            "address": self.address, "namespace": NAMESPACE, "tag": run.tag, "dir": str(run.dir),
            "nodes": [{"host": h, "id": self.nodes[h]["id"]} for h in hosts], "gpus": run.experiment.num_gpus,
            "launcher": list(inner.argv[:words]), "rest": list(inner.argv[words:]), "env": dict(inner.env),
            "cwd": inner.cwd, "grace": self.grace, "buffers": comm_buffer_prefix("{uid}", launcher.master_addr, port)}
        with self._lock:
            self._plans[run.key] = plan
        argv = (sys.executable, "-m", DRIVER, str(run.dir / ATTEMPT_FILE))
        return config, Command(argv, inner.env, inner.cwd)

    def environment(self, command: Command) -> dict[str, str]:
        """Ours (the driver reaches the cluster as we do) plus the attempt's, and the driver importable."""
        here = str(Path(__file__).resolve().parents[3])
        path = os.environ.get("PYTHONPATH")
        return {**os.environ, **command.env, "PYTHONPATH": f"{here}{os.pathsep}{path}" if path else here}

    def prepare(self, run: Run) -> None:
        """The driver's instructions and the hostfile DeepSpeed's launcher reads on each node."""
        with self._lock:
            plan = self._plans.pop(run.key)
        (run.dir / ATTEMPT_FILE).write_text(json.dumps(plan, indent=1))
        (run.dir / "hostfile").write_text(format_hostfile({h: self.capacity.get(h, run.experiment.num_gpus)
                                                           for h in run.reservation.hosts}))
        (run.dir / LOST).unlink(missing_ok=True)

    def await_start(self, run: Run, proc: Child) -> str | None:
        return None

    def ended(self, run: Run, outcome: Outcome, post: Post) -> Outcome:
        """Nothing of the attempt stays in Ray; a run that did not succeed on a node Ray lost is interrupted, to
        run again elsewhere, its host reported at once."""
        self.release(run.tag, self.grace)
        lost = run.dir / LOST
        if outcome.state == State.SUCCEEDED or not lost.exists():
            return outcome
        host = lost.read_text().strip()
        post(HostLost(host, "Ray reports the node dead"))
        self.on_lost(host)
        return Outcome(State.INTERRUPTED, Reason.LOST, f"node {host} lost: Ray reports it dead")

    def end(self, proc: Child | Adopted, tag: str, grace: float, killing: bool) -> None:
        """SIGTERM to the driver, which ends the nodes' launchers within the grace period and releases the
        placement group; a margin for that; then the actors and group ended from here."""
        if proc.pid is not None and not killing:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired, TimeoutError):
                proc.wait(timeout=grace + DRIVER_MARGIN)
        self.release(tag, 0 if killing else grace)

    def remove_buffers(self, run: Run, port: int) -> None:
        """Nothing from here: each node's actor removes DeepSpeed's /dev/shm buffers there (node.py)."""

    def kill_all(self, tags: list[str]) -> None:
        """After the drivers were killed here: each attempt's actors and placement group, at once."""
        for tag in tags:
            self.release(tag, 0)
