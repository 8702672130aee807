"""End-to-end rig: the `autotune` CLI as a subprocess, stand-in launchers written as small sh scripts, and a
look at what a sweep left behind (its ledger, its launches, and any process still carrying its tag).

A stand-in launcher is started by the runner in place of DeepSpeed's launcher, with the runner's environment
plus AUTOTUNE_TAG and AUTOTUNE_METRICS_PATH. The stand-ins here append their tag to $LAUNCH_LOG, so a test can
count launches per attempt, and derive what they do from the experiment's name (the metrics file's directory).
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from autotuner.backends.tags import TAG_ENV
from autotuner.ledger.lock import holder_pid
from autotuner.ledger.store import Attempt, Ledger

ROOT = Path(__file__).resolve().parent.parent

# Preamble of every stand-in: log the launch, find the experiment's name and a number derived from it.
PREAMBLE = """\
#!/bin/sh
echo "$AUTOTUNE_TAG" >> "$LAUNCH_LOG"
name=$(basename "$(dirname "$AUTOTUNE_METRICS_PATH")")
ck=$(printf %s "$name" | cksum | cut -d' ' -f1)
"""
# Writes metrics: throughput is a pure function of the experiment's name.
WRITE_METRICS = """\
printf '{"throughput": %s, "latency": 1.0}\\n' "$((ck % 100000 + 1))" > "$AUTOTUNE_METRICS_PATH"
"""
# Sleeps $STANDIN_SECONDS, then succeeds.
SLEEP_THEN_SUCCEED = PREAMBLE + 'sleep "${STANDIN_SECONDS:-0.1}"\n' + WRITE_METRICS


def expected_throughput(name: str) -> float:
    """What the stand-ins write as throughput for `name` (POSIX cksum of the name)."""
    out = subprocess.run(["cksum"], input=name.encode(), capture_output=True, check=True).stdout
    return float(int(out.split()[0]) % 100000 + 1)


def write_launcher(directory: Path, body: str, name: str = "launcher.sh") -> str:
    """A stand-in launcher script; returns the --launcher value that runs it."""
    path = Path(directory) / name
    path.write_text(body)
    return f"sh {path}"


def write_sweep(directory: Path, values: Iterable[object], *, name: str = "s", extra: str = "",
                filename: str = "sweep.hjson") -> Path:
    """A sweep file of experiments NAME_x<value> (one per value); `extra` adds top-level keys."""
    directory = Path(directory)
    (directory / "train.py").touch()
    listed = ", ".join(str(v) for v in values)
    path = directory / filename
    path.write_text(f"""{{
  name: {name}
  script: train.py
  ds_config: {{train_micro_batch_size_per_gpu: 1}}
{extra}
  space: {{"x": [{listed}]}}
}}
""")
    return path


def env(**extra: object) -> dict[str, str]:
    """This environment for a CLI run, with this tree's package first on the path: a run whose cwd is not the
    repository (a test's tmp_path) would otherwise import the installed one, another checkout's code in a
    worktree."""
    base = {k: v for k, v in os.environ.items() if k != TAG_ENV}
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), base.get("PYTHONPATH")) if p)
    return base | {k: str(v) for k, v in extra.items()}


def quiet_env(**extra: object) -> dict[str, str]:
    """No Ray cluster named anywhere (RAY_ADDRESS unset), Ray kept on loopback."""
    base = {k: v for k, v in env().items() if k != "RAY_ADDRESS"}
    return base | {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"} | {k: str(v) for k, v in extra.items()}


def refused(done: subprocess.CompletedProcess, *says: str) -> str:
    """A refusal as the house rule has it: exit 2, one `autotune: error:` line holding each of `says`, no
    traceback, nothing on stdout; returns the line."""
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autotune: error: "), done.stderr
    assert "Traceback" not in done.stderr and not done.stdout.strip(), done.stdout
    for fragment in says:
        assert fragment in lines[0], lines[0]
    return lines[0]


def tree(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` (runner.lock, the ledger's -wal/-shm included), by its relative path, hashed:
    what a refusal must leave as it was."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).digest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def cli(*args: object) -> list[str]:
    return [sys.executable, "-m", "autotuner.cli", *map(str, args)]


def autotune(*args: object, environ: Mapping[str, str] | None = None, timeout: float = 120,
             cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the CLI to the end (the timeout only guards against a hang)."""
    return subprocess.run(cli(*args), env=dict(environ or env()), capture_output=True, text=True, timeout=timeout,
                          cwd=cwd or ROOT)


class Runners:
    """Background `autotune` processes of one test; whatever is left of them is killed at teardown."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.directories: list[Path] = []

    def start(self, *args: object, environ: Mapping[str, str] | None = None, directory: Path | None = None,
              cwd: Path | None = None) -> subprocess.Popen:
        proc = subprocess.Popen(cli(*args), env=dict(environ or env()), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=cwd or ROOT)
        self.procs.append(proc)
        if directory is not None and directory not in self.directories:
            self.directories.append(Path(directory))
        return proc

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
        for directory in self.directories:
            sid = sweep_id(directory)
            if sid:
                for pid in tagged_pids(sid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def wait_until(what: Callable[[], object], timeout: float = 30, message: str = "") -> object:
    """Poll `what` until it is truthy; the timeout only guards against a hang."""
    end = time.monotonic() + timeout
    while True:
        value = what()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"gave up waiting: {message or what}")
        time.sleep(0.02)


def kill_9_once(proc: subprocess.Popen, ready: Callable[[], bool], timeout: float = 60) -> None:
    """SIGKILL the runner `proc` as soon as `ready()` holds, which it must while the runner is alive (a crash
    test's moment of death), and reap it."""
    end = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < end and proc.poll() is None, "the runner ended, or the moment never came"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


# --- what a sweep left behind ------------------------------------------------------------------------------
def sweep_id(directory: Path) -> str | None:
    if not (Path(directory) / "ledger.sqlite").exists():
        return None
    ledger = Ledger.open(directory)
    try:
        return ledger.meta().sweep_id or None
    except Exception:  # a ledger a killed `run` never finished writing
        return None
    finally:
        ledger.close()


def attempts(directory: Path) -> list[Attempt]:
    with Ledger.open(directory) as ledger:
        return ledger.attempts()


def latest(directory: Path) -> dict[str, Attempt]:
    if not (Path(directory) / "ledger.sqlite").exists():
        return {}  # not recorded yet
    with Ledger.open(directory) as ledger:
        return {a.name: a for a in ledger.latest()}


def states(directory: Path) -> dict[str, str]:
    return {name: a.state for name, a in latest(directory).items()}


def launched(directory: Path, state: str = "running") -> list[str]:
    """Names whose latest attempt is in `state` and whose process exists (its launch is recorded)."""
    return [n for n, a in latest(directory).items() if a.state == state and a.launched_at is not None]


def tagged_pids(sweep: str) -> list[int]:
    """Live processes whose AUTOTUNE_TAG belongs to the sweep (zombies have no environment: they are gone)."""
    prefix = f"{TAG_ENV}={sweep}.".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if any(item.startswith(prefix) for item in environ.split(b"\0")):
            found.append(int(entry.name))
    return found


def launches(log: Path) -> list[tuple[str, int]]:
    """(experiment, attempt) per launch the stand-ins logged, in order."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text().split():
        name, attempt = line.split(".", 1)[1].rsplit(".", 1)  # the tag is SWEEP_ID.NAME.ATTEMPT
        out.append((name, int(attempt)))
    return out


def runner_alive(directory: Path) -> int | None:
    return holder_pid(Path(directory))


@contextmanager
def tmpfs(path: Path, *options: str) -> Iterator[Path]:
    """A tmpfs mounted at `path` for the test (read-only with "ro", tiny with "size=64k"), unmounted afterwards."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options or ("size=64k",)), "tmpfs", str(path)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        import pytest  # here: the benchmarks use this rig too, without pytest

        message = f"cannot mount a tmpfs here: {mounted.stderr.strip()}"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI runs as root and can: a skip there would hide these tests
        pytest.skip(message)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(path: Path) -> None:
    """Append zeros to `path` until its device is full (its last page included)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
    finally:
        os.close(fd)
