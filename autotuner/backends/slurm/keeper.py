"""The keeper of an allocation autotune asks for: the allocation's batch script, which gives the allocation back
once the process that holds it has gone quiet for `keep_seconds()`, however that process ended (kill -9, a lost
login node, an OOM kill). Slurm ends a job when its batch script ends, so nothing outside the allocation has to
stay alive for it to be given back: a keeper run as a job step would not do, as a step ends with its `srun`
client on the login node (checked: a step whose srun is killed -9 is cancelled).

The holder's heartbeat goes through Slurm, not a file: `scancel --signal=USR1 --batch J` every quarter of the
bound. The allocation exists before the sweep's results directory (its nodes are checked against it), so there
is no file to watch yet when the keeper starts; a signal needs no shared filesystem and no clocks compared
between machines, and any process that takes the allocation over (`resume`) keeps it by signalling the same job.
It costs slurmctld one request every `period` seconds, against two every 5 s for the allocation watcher.
"""
from __future__ import annotations

import logging
import math
import threading

from ...threads import Workers
from ..watch import env_seconds
from .allocation import SlurmError, slurm

log = logging.getLogger(__name__)

KEEP = 180.0  # seconds a held allocation outlives the last sign of its holder: a quick `resume` adopts its steps
KEEP_ENV = "AUTOTUNE_SLURM_KEEP"  # seconds, in place of KEEP
BEATS = 4  # signals per bound: three in a row may be lost (a slow slurmctld) before the keeper gives up
MOST_BETWEEN = 30.0  # seconds at most between two signals, whatever the bound

# POSIX sh, run by Slurm on the allocation's first node. A signal only sets a flag: the trap runs no command, so
# a signal that kills `date` mid-way (it goes to the shell's children too) leaves `now` empty, skipped.
_SCRIPT = """\
#!/bin/sh
# autotune's keeper: gives this allocation back {keep} s after the last heartbeat (SIGUSR1) of the autotune
# process that holds it. See autotuner/backends/slurm/keeper.py.
got=
trap 'got=1' USR1
beat=$(date +%s)
while :; do
    now=$(date +%s)
    case $now in ''|*[!0-9]*) continue ;; esac
    case $beat in ''|*[!0-9]*) beat=$now ;; esac
    if [ -n "$got" ]; then beat=$now; got=; fi
    if [ $((now - beat)) -ge {keep} ]; then
        echo "autotune: no heartbeat for {keep} s: giving Slurm job $SLURM_JOB_ID back" >&2
        scancel "$SLURM_JOB_ID"
        exit 0
    fi
    sleep {poll} & wait $!
done
"""


def keep_seconds() -> int:
    """Seconds an allocation autotune asked for outlives its holder (`AUTOTUNE_SLURM_KEEP`, else KEEP), whole
    and at least 2: the keeper's shell counts whole seconds."""
    return max(2, math.ceil(env_seconds(KEEP_ENV, KEEP)))


def script(keep: int) -> str:
    """The keeper's batch script for a bound of `keep` seconds; it looks every tenth of it (1 to 10 s)."""
    return _SCRIPT.format(keep=keep, poll=max(1, min(10, keep // 10)))


def period(keep: int) -> float:
    """Seconds between two heartbeats of a holder for a bound of `keep` seconds."""
    return min(MOST_BETWEEN, keep / BEATS)


class Heartbeat:
    """Signals the keeper of `job` every `every` seconds from a thread of its own, until `stop()`. A signal Slurm
    does not take (slurmctld restarting) is logged: the next one may pass, and the bound allows for a few."""

    def __init__(self, job: str, every: float):
        self.job, self.every = job, every
        self._stop = threading.Event()
        self._workers = Workers(f"slurm-keep-{job}")
        self._workers.start("beat", self._beat)

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            try:
                done = slurm("scancel", "--signal=USR1", "--batch", self.job, check=False)
            except SlurmError as e:
                log.info("heartbeat of Slurm job %s not sent: %s", self.job, e)
                continue
            if done.returncode != 0:
                log.info("heartbeat of Slurm job %s: %s", self.job, (done.stderr or done.stdout).strip()[-200:])

    def stop(self) -> None:
        self._stop.set()
        self._workers.close()


_lock = threading.Lock()
_held: dict[str, Heartbeat] = {}


def hold(job: str, keep: int | None = None) -> None:
    """This process holds `job`, an allocation autotune asked for: its keeper is signalled until `let_go(job)`
    (or until this process ends, after which the keeper gives it back). Holding it twice is holding it once."""
    with _lock:
        if job not in _held:
            _held[job] = Heartbeat(job, period(keep_seconds() if keep is None else keep))


def let_go(job: str) -> None:
    """No more heartbeats for `job` from this process (it is being given back, or left to its keeper)."""
    with _lock:
        beat = _held.pop(job, None)
    if beat is not None:
        beat.stop()
