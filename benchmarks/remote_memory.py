"""GPU memory of SSH hosts for `--placement memory` (autotuner/backends/ssh/free_memory.py): what a reading
costs, and that placing by it costs dispatch nothing.

1. A reading: `nvidia-smi --query-gpu=...` run over the host's pooled connection and parsed (`nvidia_smi(pool)`),
   against a pooled `true` (the round trip alone), interleaved round by round; and what the placement pays to
   look a host's values up (`RemoteMemory.free`).
2. Dispatch with memory placement on SSH hosts: the same sweep of short stand-in experiments that each need
   30 GiB, on two sshd nodes x 2 slots, run with `--placement pack` and `--placement memory`, rounds interleaved.
   Per slot, from a run's end (recorded) to the next run on that slot placed (`started_at`: the decision) and
   launched (`launched_at`: its remote process exists, an SSH start later).

The nodes are real sshd test nodes on loopback (tests/sshnodes.py; needs root and openssh-server) with the
tests' FAKE nvidia-smi (tests/fake_nvidia_smi.py: a Python script, so its own start-up, ~20-40 ms, stands in for
the real tool's time; nvidia-smi on a GPU host takes tens of ms too, more without persistence mode).

  python benchmarks/remote_memory.py --rounds 30 --experiments 40 --sweeps 2
"""
from __future__ import annotations

import argparse
import itertools
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
from autotuner.backends.ssh.free_memory import RemoteMemory, nvidia_smi  # noqa: E402
from autotuner.ledger.store import Ledger  # noqa: E402

STANDIN = ROOT / "benchmarks" / "standin.sh"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def reading_cost(config: str, host: str, rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"pooled true": [], "reading": []}
    with SSHPool(config) as pool:
        read = nvidia_smi(pool)
        pool.run(host, "true")
        if read(host) is None:
            raise RuntimeError(f"the fake nvidia-smi on {host} did not answer")
        for _ in range(rounds):
            t = time.perf_counter()
            pool.run(host, "true")
            times["pooled true"].append(time.perf_counter() - t)
            t = time.perf_counter()
            read(host)
            times["reading"].append(time.perf_counter() - t)
        assert pool.connect_count(host) == 1
    return times


def lookup_cost(config: str, host: str, count: int = 100_000) -> float:
    """Seconds per `RemoteMemory.free(host)` (the placement's look-up) on 8 GPUs, values read once."""
    with SSHPool(config) as pool:
        memory = RemoteMemory(nvidia_smi(pool), {host: range(8)}, {host: 80 * 10**9})
        memory.read_now()
        t = time.perf_counter()
        for _ in range(count):
            memory.free(host)
        return (time.perf_counter() - t) / count


def sweep_gaps(tmp: Path, config: str, placement: str, n: int) -> dict[str, list[float]]:
    spec = tmp / "sweep.hjson"
    spec.write_text(f"""{{
  name: s
  script: {STANDIN}
  gpu_memory: "30GiB"
  ds_config: {{train_micro_batch_size_per_gpu: 1}}
  space: {{gradient_accumulation_steps: {list(range(1, n + 1))}}}
}}""")
    hosts = tmp / "hostfile"
    hosts.write_text("node-1 slots=2 accelerator=cpu gpu=A100-80GB\nnode-2 slots=2 accelerator=cpu gpu=A100-80GB\n")
    results = tmp / f"r-{placement}-{time.monotonic_ns()}"
    out = subprocess.run([sys.executable, "-m", "autotuner.cli", "run", str(spec), "-H", str(hosts), "--ssh-config",
                          config, "--launcher", f"sh {STANDIN}", "--placement", placement, "-o", str(results), "-q"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stdout + out.stderr)
    with Ledger.open(results) as ledger:
        attempts = [a for a in ledger.latest() if a.state == "succeeded"]
    assert len(attempts) == n
    by_slot: dict[tuple, list] = {}
    for a in attempts:
        by_slot.setdefault(tuple((h, tuple(ids)) for h, ids in a.slots.items()), []).append(a)
    gaps: dict[str, list[float]] = {"placed": [], "launched": []}
    for runs in by_slot.values():
        runs.sort(key=lambda a: a.started_at)
        for a, b in itertools.pairwise(runs):
            gaps["placed"].append((b.started_at - a.finished_at) * 1000)
            gaps["launched"].append((b.launched_at - a.finished_at) * 1000)
    return gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30, help="readings (and pooled `true`s) timed")
    parser.add_argument("--experiments", type=int, default=40, help="experiments per sweep")
    parser.add_argument("--sweeps", type=int, default=2, help="sweeps per placement, interleaved")
    args = parser.parse_args()

    import fake_nvidia_smi as smi
    import sshnodes

    reason = sshnodes.unavailable_reason()
    if reason:
        sys.exit(f"cannot start the test sshd nodes: {reason}")
    tmp = Path(tempfile.mkdtemp(prefix="remote-memory-"))
    nodes = sshnodes.start_nodes(2, tmp / "nodes")
    config = str(nodes.config_path)
    try:
        for node in nodes:
            smi.install(node.bin, [smi.gpu(free_gib=79), smi.gpu(free_gib=79)])
        times = reading_cost(config, "node-1", args.rounds)
        lookup = lookup_cost(config, "node-1")
        gaps: dict[str, dict[str, list[float]]] = {"pack": {"placed": [], "launched": []},
                                                   "memory": {"placed": [], "launched": []}}
        for _ in range(args.sweeps):
            for placement in ("pack", "memory"):
                for key, values in sweep_gaps(tmp, config, placement, args.experiments).items():
                    gaps[placement][key] += values
        readings = {node.name: len(smi.calls(node.bin)) for node in nodes}
    finally:
        nodes.close()

    print(f"one reading of node-1's GPUs, {args.rounds} rounds, pooled connection")
    for key, values in times.items():
        ms = sorted(v * 1000 for v in values)
        print(f"  {key:12s} median {statistics.median(ms):6.1f} ms   min {ms[0]:6.1f}   max {ms[-1]:6.1f}")
    print(f"  the placement's look-up (RemoteMemory.free, 8 GPUs): {lookup * 1e6:.2f} us")
    print(f"dispatch on 2 SSH nodes x 2 slots, {args.sweeps} sweep(s) of {args.experiments} x 0.2 s per placement "
          "(ms from a run's end to the next on its slot)")
    for placement, kinds in gaps.items():
        line = "  ".join(f"{kind} median {statistics.median(v):6.1f} p99 {percentile(v, 0.99):6.1f}"
                         for kind, v in kinds.items())
        print(f"  {placement:7s} {line}")
    print(f"  nvidia-smi calls over all of it (readings of the sweeps and part 1): {readings}")


if __name__ == "__main__":
    main()
