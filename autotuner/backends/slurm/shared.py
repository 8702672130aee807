"""Whether the allocation's nodes see the results directory. The first node of each run writes its metrics
there: a directory only this machine sees failed every run placed on another node, each with a word about
DeepSpeed's profile window rather than the cause. One short step on every node reads a token the runner
wrote; a node that reads something else (its own, unshared, directory of that name) does not share it."""
from __future__ import annotations

import logging
import secrets
import subprocess
from pathlib import Path

from .allocation import Allocation
from .executor import srun_environment

log = logging.getLogger(__name__)

SHARED_WITHIN = 30.0  # seconds for the step that reads the token on every node
# Each node prints its name and whether it read the token: a node that prints nothing could not be asked.
_READ = 'if [ "$(cat "$1" 2>/dev/null)" = "$2" ]; then echo "$SLURMD_NODENAME yes"; else echo "$SLURMD_NODENAME no"; fi'


def unshared_nodes(allocation: Allocation, directory: Path) -> list[str]:
    """The allocation's nodes that do not see `directory` as this machine does; none when that cannot be
    told (the step did not run: a warning, and the sweep goes on)."""
    token = secrets.token_hex(16)
    path = directory.resolve() / f".shared-{token[:8]}"
    nodes = allocation.nodes
    argv = ["srun", "--jobid", allocation.job, "--overlap", "--gres=none", "--nodes", str(len(nodes)), "--nodelist",
            ",".join(nodes), "--ntasks", str(len(nodes)), "--ntasks-per-node", "1", "--job-name", "autotune-shared",
            "--quiet", "sh", "-c", _READ, "sh", str(path), token]
    path.write_text(token)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SHARED_WITHIN, env=srun_environment(),
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("cannot tell whether the nodes share %s: %s", directory, e)
        return []
    finally:
        path.unlink(missing_ok=True)
    said = dict(line.split(None, 1) for line in done.stdout.splitlines() if len(line.split()) == 2)
    if not said:
        log.warning("cannot tell whether the nodes share %s: %s", directory,
                    (done.stderr or done.stdout).strip()[-300:] or f"srun exit status {done.returncode}")
    return [node for node in nodes if said.get(node) == "no"]
