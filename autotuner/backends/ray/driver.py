"""One attempt on a Ray cluster, as a process of its own on the runner's machine (what `srun` is to a Slurm
step): `python -m autotuner.backends.ray.driver ATTEMPT.json`.

It reserves the attempt's GPUs with a placement group (one bundle per node, STRICT_SPREAD, each bundle held to
the node the scheduler picked by Ray's `ray.io/node-id` label), starts a small detached actor on each bundle,
named `<tag>.<rank>`, that runs DeepSpeed's per-node launcher there (node.py), and waits for them. One node's
launcher failing ends the others; SIGTERM ends them all (SIGTERM, grace, SIGKILL on each node). Whatever way it
ends, the actors are killed and the placement group removed. Its exit status is the launchers' (the first that
failed, else 0); a node Ray loses on the way is written to `ray_lost` in the run's directory. The first node's
output is copied to this process's own at the end (the others' stay in `nodes/`).

The local executor runs it as it runs DeepSpeed's launcher (its own session, the exit-status wrapper, the tag),
so timeouts, cancels and adoption after a crash of the runner are the same as on this machine.
"""
from __future__ import annotations

import contextlib
import json
import logging
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from . import node
from .node import LOST, NodeLauncher

PLACED_WITHIN = 120.0  # seconds for Ray to reserve the GPUs (something outside the sweep may hold them)
NODE_LABEL = "ray.io/node-id"
LOST_WITHIN = 60.0  # seconds for Ray to report dead the node under an actor that died
WAKE = 0.1  # seconds between looks at a stop asked for by a signal, while waiting on the nodes


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    ray.init(address=spec["address"], namespace=spec["namespace"], log_to_driver=False,
             logging_level=logging.ERROR, configure_logging=False)
    stopping = threading.Event()  # after ray.init: it installs its own SIGTERM handler, which ends the process
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    ray.cloudpickle.register_pickle_by_value(node)  # the nodes need no autotuner
    return Attempt(spec, stopping).run()


class Attempt:
    """The placement group and actors of one attempt (see the module docstring)."""

    def __init__(self, spec: dict[str, Any], stopping: threading.Event):
        self.spec, self.stopping = spec, stopping
        self.tag: str = spec["tag"]
        self.nodes: list[dict[str, str]] = spec["nodes"]  # [{host, id}] in rank order
        self.grace = float(spec["grace"])
        self.dir = Path(spec["dir"])
        self.actors: list[Any] = []
        self.group: Any = None

    def run(self) -> int:
        try:
            return self._run()
        except Stopped:  # the nodes' launchers, if any started, end with their actors' stop
            self._stop_nodes()
            return 143
        finally:
            self._release()
            self._copy_first_node_output()

    def _run(self) -> int:
        gpus = int(self.spec["gpus"])
        self.group = placement_group([{"GPU": gpus}] * len(self.nodes), strategy="STRICT_SPREAD", name=self.tag,
                                     lifetime="detached",
                                     bundle_label_selector=[{NODE_LABEL: n["id"]} for n in self.nodes])
        try:
            self._get([self.group.ready()], within=PLACED_WITHIN)
        except TimeoutError:
            print(f"Ray did not reserve {gpus} GPU(s) on each of {', '.join(n['host'] for n in self.nodes)} within "
                  f"{PLACED_WITHIN:g} s: something outside this sweep holds them", file=sys.stderr)
            return 1
        launcher = ray.remote(NodeLauncher)
        logs = self.dir / "nodes"
        logs.mkdir(exist_ok=True)
        hosts = [n["host"] for n in self.nodes]
        for rank in range(len(self.nodes)):
            self.actors.append(launcher.options(
                name=f"{self.tag}.{rank}", lifetime="detached", num_cpus=0, num_gpus=gpus, max_concurrency=4,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=rank),
            ).remote())
        try:
            starts = [actor.start.remote(self.spec["launcher"], self.spec["rest"], hosts, gpus, rank,
                                         self.spec["env"], self.spec["cwd"], str(logs / f"{rank}.stdout.log"),
                                         str(logs / f"{rank}.stderr.log"), self.spec.get("buffers", ""))
                      for rank, actor in enumerate(self.actors)]
            for rank, pid in enumerate(self._get(starts)):
                print(f"node {rank}: {hosts[rank]} pid {pid}", flush=True)
            return self._wait()
        except ray.exceptions.RayActorError as e:
            return self._lost(e)

    def _get(self, refs: list[Any], within: float | None = None) -> list[Any]:
        """The values of `refs`, or a stop asked for meanwhile (`Stopped`), or a TimeoutError after `within`
        seconds."""
        end = None if within is None else time.monotonic() + within
        pending = list(refs)
        while pending:
            if self.stopping.is_set():
                raise Stopped
            if end is not None and time.monotonic() > end:
                raise TimeoutError
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=WAKE)
        return list(ray.get(refs))

    def _wait(self) -> int:
        """Each node's exit status as it ends; the first failure ends the others."""
        waits = {actor.wait.remote(): rank for rank, actor in enumerate(self.actors)}
        code = 0
        while waits:
            if self.stopping.is_set():
                self._stop_nodes()
                return 143
            done, _ = ray.wait(list(waits), num_returns=1, timeout=WAKE)
            for ref in done:
                rank = waits.pop(ref)
                status = ray.get(ref)
                if status != 0 and code == 0:
                    code = status
                    print(f"node {rank} ({self.nodes[rank]['host']}) ended with exit status {status}: ending the "
                          "others", file=sys.stderr, flush=True)
                    self._stop_nodes()
        return code

    def _stop_nodes(self) -> None:
        """Every node's launcher ended: SIGTERM, the grace period, SIGKILL (the nodes side by side)."""
        with contextlib.suppress(ray.exceptions.RayError):
            ray.wait([actor.stop.remote(self.grace) for actor in self.actors], num_returns=len(self.actors),
                     timeout=self.grace + 10)

    def _lost(self, error: Exception) -> int:
        """A node's actor died under the attempt: its node is taken as lost (Ray says which), the rest ended."""
        gone = self._gone()
        why = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        if gone:
            (self.dir / LOST).write_text(gone[0] + "\n")
            print(f"Ray lost node {gone[0]} under the attempt ({why})", file=sys.stderr, flush=True)
        else:
            print(f"an actor of the attempt died: {why}", file=sys.stderr, flush=True)
        self._stop_nodes()
        return 1

    def _gone(self) -> list[str]:
        """The attempt's hosts Ray reports dead, waited for a while (Ray marks a node dead only once its health
        checks have failed, seconds after its actors are gone)."""
        end = time.monotonic() + LOST_WITHIN
        while True:
            alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
            gone = [n["host"] for n in self.nodes if n["id"] not in alive]
            if gone or time.monotonic() > end or self.stopping.is_set():
                return gone
            time.sleep(0.5)

    def _release(self) -> None:
        """The actors killed and the placement group removed: nothing of the attempt stays reserved."""
        for actor in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        if self.group is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self.group)

    def _copy_first_node_output(self) -> None:
        for stream, out in (("stdout", sys.stdout), ("stderr", sys.stderr)):
            path = self.dir / "nodes" / f"0.{stream}.log"
            with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as f:
                out.flush()
                shutil.copyfileobj(f, out)
                out.flush()


class Stopped(Exception):
    """A stop was asked for (SIGTERM) while the nodes were being started."""


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
