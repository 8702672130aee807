"""Per-experiment launch overhead over SSH: a pooled connection vs a new connection each time.

One round = start a trivial remote process (`true`) the way experiments are started (SSHPool.start: own session,
env exported, output to files) and wait for its exit status. Measured three ways, interleaved round by round so
that load on the machine falls on all of them alike:

  pooled   one SSHPool for all rounds: one connection, a new channel per launch
  new      a new SSHPool per round: connect, authenticate, check the host key, launch, close
  ssh-cli  `ssh -F CONFIG HOST true` per round, as pdsh / DeepSpeed's launcher do (for reference)

By default the target is one real sshd started on 127.0.0.2 by the test rig (tests/sshnodes.py; needs root and
openssh-server); --host/--ssh-config point it at a real host instead.

  python benchmarks/ssh_launch.py --rounds 30
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from autotuner.backends.ssh import SSHPool  # noqa: E402


def launch(pool: SSHPool, host: str) -> None:
    proc = pool.start(host, ["true"], {"AUTOTUNE_TAG": "bench-ssh-launch"}, "/", "/dev/null", "/dev/null")
    code = proc.wait(timeout=60)
    if code != 0:
        raise RuntimeError(f"remote `true` exited {code}")


def measure(host: str, config: str | None, rounds: int) -> dict[str, list[float]]:
    import fabric  # noqa: F401  (import cost is paid once per process, not per launch: keep it out)

    times: dict[str, list[float]] = {"pooled": [], "new": [], "ssh-cli": []}
    ssh = ["ssh"] + (["-F", config] if config else []) + ["-o", "BatchMode=yes", host, "true"]
    with SSHPool(config) as pooled:
        launch(pooled, host)  # warm-up: opens the pooled connection
        with SSHPool(config) as warm:
            launch(warm, host)
        for _ in range(rounds):
            t = time.perf_counter()
            launch(pooled, host)
            times["pooled"].append(time.perf_counter() - t)

            t = time.perf_counter()
            with SSHPool(config) as fresh:
                launch(fresh, host)
            times["new"].append(time.perf_counter() - t)

            t = time.perf_counter()
            subprocess.run(ssh, check=True, stdin=subprocess.DEVNULL)
            times["ssh-cli"].append(time.perf_counter() - t)
        assert pooled.connect_count(host) == 1
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--host", help="a real host (default: a test sshd on 127.0.0.2)")
    parser.add_argument("--ssh-config", help="ssh config file for --host (default: ~/.ssh/config)")
    args = parser.parse_args()

    nodes = None
    if args.host:
        host, config = args.host, args.ssh_config
    else:
        import sshnodes

        reason = sshnodes.unavailable_reason()
        if reason:
            sys.exit(f"cannot start a test sshd: {reason}")
        nodes = sshnodes.start_nodes(1, Path(tempfile.mkdtemp(prefix="ssh-launch-")))
        host, config = "node-1", str(nodes.config_path)
    try:
        times = measure(host, config, args.rounds)
    finally:
        if nodes is not None:
            nodes.close()

    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    print(f"launch + wait of a remote `true`, {args.rounds} rounds each, host {host}")
    for k, v in times.items():
        ms = sorted(x * 1000 for x in v)
        print(f"  {k:8s} median {med[k]:7.1f} ms   min {ms[0]:7.1f}   max {ms[-1]:7.1f}")
    print(f"  new / pooled     = {med['new'] / med['pooled']:.2f}x")
    print(f"  ssh-cli / pooled = {med['ssh-cli'] / med['pooled']:.2f}x")


if __name__ == "__main__":
    main()
