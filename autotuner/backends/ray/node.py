"""What runs on each node of an attempt, inside a Ray actor pinned to one bundle of a placement group: DeepSpeed's
per-node launcher, started in a session of its own, told its node rank and the GPUs Ray gave this node
(`CUDA_VISIBLE_DEVICES`), and ended on request (SIGTERM to its group, a grace period, SIGKILL).

The actor lives as long as its placement group (a lease, leases.py) and runs one attempt after another on it:
starting a Ray worker costs half a second or more, a method call milliseconds. It remembers the attempt it runs
(or ran last) by its tag, so that a runner that takes over after a crash finds which attempt each lease runs.
When a launcher ends, the actor writes its exit status into the run's directory (`nodes/RANK.exit_status`) and,
once every node of the attempt has, the attempt's own `exit_status` (the first failure by rank, else 0), so that
an attempt that ended while no runner was alive is judged as it ended.

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
from pathlib import Path

VISIBLE = "CUDA_VISIBLE_DEVICES"
NODE_ID = "AUTOTUNE_RAY_NODE_ID"  # in each launcher's environment: the node it runs on, as Ray names it
STATUS = "exit_status"  # as backends/exitstatus.FILENAME: the attempt's, in its directory


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


def write_status(directory: str, rank: int, nodes: int, code: int) -> None:
    """This node's exit status, then the attempt's once every node has written its own (see the docstring).
    Each written whole (a temporary file renamed), as the exit-status wrapper's reader expects."""
    where = Path(directory) / "nodes"
    with contextlib.suppress(OSError):
        _write(where / f"{rank}.{STATUS}", code)
        codes = [_read(where / f"{r}.{STATUS}") for r in range(nodes)]
        if all(c is not None for c in codes):
            _write(Path(directory) / STATUS, next((c for c in codes if c), 0))


def _write(path: Path, code: int) -> None:
    part = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    part.write_text(f"{code}\n")
    os.replace(part, path)


def _read(path: Path) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    return int(text.strip()) if text.endswith("\n") and text.strip().isdigit() else None


class NodeLauncher:
    """One node's part of one attempt after another (a Ray actor; see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tag: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._code: int | None = None
        self._ended = threading.Event()

    def where(self) -> dict[str, object]:
        """The actor's process id and the GPUs Ray gave it (for tests and the record)."""
        return {"pid": os.getpid(), "visible": os.environ.get(VISIBLE, "")}

    def current(self) -> str | None:
        """The tag of the attempt this actor runs, or ran last (None: none yet)."""
        return self._tag

    def start(self, tag: str, launcher_words: Sequence[str], rest: Sequence[str], hosts: Sequence[str], gpus: int,
              rank: int, env: Mapping[str, str], cwd: str, out: str, err: str, directory: str,
              buffers: str = "") -> int:
        """Start attempt `tag`'s launcher on this node (once per tag), its output in `out` and `err`; returns its
        pid. `buffers`: the start of the names of DeepSpeed's /dev/shm buffers of the run (`{uid}` for this
        user's id), removed once it ends (DeepSpeed 0.19 never does: see local.executor.remove_comm_buffers)."""
        with self._lock:
            if self._tag == tag and self._proc is not None:
                return self._proc.pid
            if self._proc is not None and self._proc.poll() is None:
                raise RuntimeError(f"the launcher of {self._tag} still runs on this node")
            argv = node_argv(launcher_words, rest, hosts, gpus, rank, os.environ.get(VISIBLE))
            environ = {**os.environ, **env, NODE_ID: this_node()}
            with open(out, "ab") as stdout, open(err, "ab") as stderr:
                proc = subprocess.Popen(argv, env=environ, cwd=cwd or None, stdin=subprocess.DEVNULL,
                                        stdout=stdout, stderr=stderr, start_new_session=True)
            self._tag, self._proc, self._code, self._ended = tag, proc, None, threading.Event()
        prefix = buffers.replace("{uid}", str(os.getuid())) if buffers else ""
        threading.Thread(target=self._follow, args=(proc, self._ended, prefix, directory, rank, len(hosts)),
                         daemon=True).start()
        return proc.pid

    def _follow(self, proc: subprocess.Popen[bytes], ended: threading.Event, buffers: str, directory: str,
                rank: int, nodes: int) -> None:
        code = proc.wait()
        code = 128 - code if code < 0 else code  # a signal as 128 + its number, as a shell reports it
        _remove_buffers(buffers)
        write_status(directory, rank, nodes, code)
        with self._lock:
            if self._proc is proc:
                self._code = code
        ended.set()

    def wait(self, tag: str) -> int | None:
        """Attempt `tag`'s exit status once its launcher here ends; None when this actor does not run it."""
        with self._lock:
            if self._tag != tag:
                return None
            ended = self._ended
        ended.wait()
        with self._lock:
            return self._code if self._tag == tag else None

    def stop(self, tag: str | None, grace: float) -> None:
        """SIGTERM to the launcher's group (of attempt `tag`; None: whichever), `grace` seconds to end, then
        SIGKILL to what is left of it."""
        with self._lock:
            proc = self._proc if tag is None or tag == self._tag else None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _remove_buffers(prefix: str) -> None:
    if not prefix or "/" in prefix:
        return
    for path in glob.glob(f"/dev/shm/{glob.escape(prefix)}*"):
        with contextlib.suppress(OSError):
            os.unlink(path)


def sees(path: str) -> bool:
    """Whether this node sees `path` (a Ray task on each node: the results directory shared)."""
    return os.path.exists(path)
