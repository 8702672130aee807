"""An allocation autotune asks for, and gives back: a batch job whose script is its keeper (keeper.py), so that
it is given back however the process holding it ends; withdrawn when that process is interrupted while the
job waits in the queue."""
from __future__ import annotations

import contextlib
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from ..base import Withdrawn
from . import keeper, parse
from .allocation import Allocation, SlurmError, allocation_of, failure, job_state, sigterm_interrupts, slurm

# Job states in which a job asked for may still run: anything else ended it before it could be used.
WAITING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "RESIZING"})
MOST_BETWEEN_LOOKS = 5.0  # seconds between two looks at a queued job, at most (the first looks come faster)


class JobWithdrawn(Withdrawn):
    """An allocation request interrupted: its job (`job`) was cancelled before it could run."""

    def __init__(self, job: str):
        super().__init__(f"Slurm job {job}")
        self.job = job


def request(nodes: int, gpus_per_node: int, *, partition: str | None = None, time: str | None = None,
            account: str | None = None, extra: Sequence[str] = (), keep: int | None = None,
            log: Callable[[str], None] = lambda line: None) -> Allocation:
    """A new allocation of whole nodes (`--exclusive`: every CPU, so that steps do not wait for one), kept when
    one of its nodes fails (`--no-kill`: only that node's experiments are lost), never requeued, waited for;
    ours to give back (`release`). Its batch script is its keeper: it gives the allocation back `keep` seconds
    (default `keeper.keep_seconds()`) after this process stops signalling it, which it does from now on.
    Interrupted while it waits (Ctrl-C, or SIGTERM): the job is withdrawn, so that no allocation starts later
    that nobody gives back."""
    keep = keeper.keep_seconds() if keep is None else keep
    argv = ["sbatch", "--parsable", "--exclusive", "--no-kill", "--no-requeue", "--job-name", "autotune",
            "--nodes", str(nodes), "--gpus-per-node", str(gpus_per_node), "--output", "/dev/null", "--chdir", "/"]
    for option, value in (("--partition", partition), ("--time", time), ("--account", account)):
        if value:
            argv += [option, value]
    argv += list(extra)
    job: str | None = None
    try:
        with sigterm_interrupts():
            with _signals_held(), tempfile.NamedTemporaryFile("w", prefix="autotune-keeper-", suffix=".sh") as script:
                script.write(keeper.script(keep))
                script.flush()
                job = _submit([*argv, script.name])
            _wait_running(job, lambda: log(
                f"asked Slurm for {nodes} node(s) x {gpus_per_node} GPU(s): job {job} is queued, waiting for "
                "resources (Ctrl-C withdraws it)"))
            keeper.hold(job, keep)
            return allocation_of(job, owned=True, keep=keep)
    except BaseException as e:
        if job is None:
            raise
        keeper.let_go(job)
        with contextlib.suppress(SlurmError):
            slurm("scancel", job, check=False)
        if isinstance(e, KeyboardInterrupt) and not isinstance(e, JobWithdrawn):
            raise JobWithdrawn(job) from None
        raise


def _submit(argv: list[str]) -> str:
    """The job sbatch queued; a request Slurm refuses is its one line."""
    done = slurm(*argv, check=False)
    job = parse.submitted_job(done.stdout)
    if done.returncode != 0 or job is None:
        raise SlurmError(failure(argv, done.stderr or done.stdout, done.returncode))
    return job


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM held back while sbatch submits: one that came meanwhile is taken once the job's id is
    known, so the job can be withdrawn (interrupted mid-way, sbatch may have queued a job nobody knows of)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _wait_running(job: str, queued: Callable[[], None]) -> None:
    """Until Slurm runs the job (its keeper started), looking more seldom as the wait grows; the user told once
    that it waits, when Slurm gives a reason (a job not yet looked at by the scheduler has none)."""
    told, pause = False, 0.05
    while True:
        state = job_state(job)
        if state is not None and state.state == "RUNNING":
            return
        if state is None or state.state not in WAITING:
            raise SlurmError(f"Slurm job {job} ended ({state.state if state else 'gone'}) before it could be used"
                             f"{f': {state.reason}' if state and state.reason not in (None, 'None') else ''}")
        if not told and state.reason not in (None, "None"):
            queued()
            told = True
        time.sleep(pause)
        pause = min(MOST_BETWEEN_LOOKS, pause * 1.5)


def release(job: str) -> None:
    """Give an allocation back (everything still running in it ends); this process stops keeping it first, so
    that if Slurm does not answer now, its keeper gives it back within its bound."""
    keeper.let_go(job)
    slurm("scancel", job, check=False)

