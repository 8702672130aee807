"""What runs on each node of an attempt, inside a Ray actor pinned to one bundle of the attempt's placement
group: DeepSpeed's per-node launcher, started in a session of its own, told its node rank and the GPUs Ray gave
this node (`CUDA_VISIBLE_DEVICES`), and ended on request (SIGTERM to its group, a grace period, SIGKILL).

Only the standard library: the class travels to the nodes by value (cloudpickle), so the nodes need DeepSpeed
and Ray, not autotuner.
"""
from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence

VISIBLE = "CUDA_VISIBLE_DEVICES"
NODE_ID = "AUTOTUNE_RAY_NODE_ID"  # in each launcher's environment: the node it runs on, as Ray names it
LOST = "ray_lost"  # a file in the run's directory: the host Ray lost while the attempt ran on it


def include_of(hosts: Sequence[str], gpus: int, rank: int, visible: str | None) -> str:
    """DeepSpeed's `--include` for node `rank`: its own GPUs as Ray gave them, the other nodes' as counts (all
    that the per-node launcher needs of them)."""
    default = ",".join(map(str, range(gpus)))
    own = visible if visible else default
    return "@".join(f"{host}:{own if i == rank else default}" for i, host in enumerate(hosts))


def node_argv(launcher_words: Sequence[str], rest: Sequence[str], hosts: Sequence[str], gpus: int, rank: int,
              visible: str | None) -> list[str]:
    """DeepSpeed's launcher for one node: no ssh, this node's rank, and the GPUs it may use."""
    return [*launcher_words, "--no_ssh", "--node_rank", str(rank), "--include",
            include_of(hosts, gpus, rank, visible), *rest]


def this_node() -> str:
    """Ray's id of the node this runs on (Ray is there: this runs in a Ray worker)."""
    import ray

    return str(ray.get_runtime_context().get_node_id())


class NodeLauncher:
    """One node's part of one attempt (a Ray actor; see the module docstring)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffers = ""
        self._lock = threading.Lock()

    def where(self) -> dict[str, object]:
        """The node and GPUs Ray gave this actor, and its process id (for tests and the record)."""
        return {"pid": os.getpid(), "visible": os.environ.get(VISIBLE, "")}

    def start(self, launcher_words: Sequence[str], rest: Sequence[str], hosts: Sequence[str], gpus: int, rank: int,
              env: Mapping[str, str], cwd: str, out: str, err: str, buffers: str = "") -> int:
        """Start this node's launcher (once), its output in `out` and `err`; returns its pid. `buffers`: the
        start of the names of DeepSpeed's /dev/shm buffers of the run (`{uid}` for this user's id), removed
        once it ends (DeepSpeed 0.19 never does: see local.executor.remove_comm_buffers)."""
        self._buffers = buffers.replace("{uid}", str(os.getuid())) if buffers else ""
        with self._lock:
            if self._proc is not None:
                return self._proc.pid
            argv = node_argv(launcher_words, rest, hosts, gpus, rank, os.environ.get(VISIBLE))
            environ = {**os.environ, **env, NODE_ID: this_node()}
            with open(out, "ab") as stdout, open(err, "ab") as stderr:
                self._proc = subprocess.Popen(argv, env=environ, cwd=cwd or None, stdin=subprocess.DEVNULL,
                                              stdout=stdout, stderr=stderr, start_new_session=True)
            return self._proc.pid

    def wait(self) -> int:
        """Its exit status once it ends (a signal as 128 + its number, as a shell reports it)."""
        proc = self._proc
        if proc is None:
            return 0
        code = proc.wait()
        self._remove_buffers()
        return 128 - code if code < 0 else code

    def stop(self, grace: float) -> None:
        """SIGTERM to the launcher's group, `grace` seconds to end, then SIGKILL to what is left of it."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    def _remove_buffers(self) -> None:
        if not self._buffers or "/" in self._buffers:
            return
        for path in glob.glob(f"/dev/shm/{glob.escape(self._buffers)}*"):
            with contextlib.suppress(OSError):
                os.unlink(path)


def sees(path: str) -> bool:
    """Whether this node sees `path` (a Ray task on each node: the results directory shared)."""
    return os.path.exists(path)
