"""Asking hosts over SSH before GPU hours are spent: whether each answers, and what it offers.

`unanswering` is the runner's check before it launches: which hosts do not answer a trivial command, and why.
`probe_hosts` is what `autotune hosts` shows: one shell script per host, over the host's pooled connection, all
hosts at once (see fanout): reachable or why not, GPUs with model and free/total memory (nvidia-smi; none on a
CPU host; a GPU in MIG mode as its MIG instances, from `nvidia-smi -L`, each with its profile's memory), python
and DeepSpeed versions (read from the package metadata: importing deepspeed takes seconds),
and the load average.

The versions are those of the `python3` that a non-interactive SSH command finds on the host's PATH, which is
what remote experiments will run with: if it is not the intended environment, this is where it shows.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...gpu.nvml import Gpu
from ...gpu.nvml import gpu_type as type_of_gpus
from ...gpu.types import size_of_type
from ...limits import GiB
from ...spec.hostfile import Host, is_local, load_hostfile
from ..base import HostsCheck
from .errors import HostDown
from .fanout import each, run_many
from .pool import SSHPool

MIB = 1024 * 1024
_MARK = "==autotune-probe"


@dataclass
class HostReport:
    """One host as the probe found it. Memory in bytes, as in `inventory.Gpu`."""

    host: str
    reachable: bool
    reason: str | None = None  # why not reachable
    gpus: list[Gpu] = field(default_factory=list)
    gpu_error: str | None = None  # nvidia-smi is there but failed (driver trouble): not the same as no GPU
    python: str | None = None
    deepspeed: str | None = None  # None: not importable by that python (see `notes`)
    loadavg: tuple[float, float, float] | None = None
    cpus: int | None = None
    seconds: float = 0.0  # how long the probe took
    notes: list[str] = field(default_factory=list)
    ssh_error: str | None = None  # this machine, probed without SSH: why SSH to it failed (pdsh needs it)

    def to_json(self) -> dict[str, object]:
        return {
            "host": self.host, "reachable": self.reachable, "reason": self.reason,
            "gpus": [{"index": g.index, "name": g.name, "memory_total": g.memory_total,
                      "memory_free": g.memory_free, "uuid": g.uuid, "mig": g.mig} for g in self.gpus],
            "gpu_error": self.gpu_error, "python": self.python, "deepspeed": self.deepspeed,
            "loadavg": list(self.loadavg) if self.loadavg is not None else None, "cpus": self.cpus,
            "seconds": round(self.seconds, 3), "notes": list(self.notes), "ssh_error": self.ssh_error,
        }


def probe_script(python: str = "python3") -> str:
    """The POSIX shell script the probe runs: one marked section per fact, each followed by its exit code."""
    py = shlex.quote(python)
    sections = {
        "loadavg": "cat /proc/loadavg",
        "cpus": "nproc 2>/dev/null || getconf _NPROCESSORS_ONLN",
        "python": f"{py} -c 'import platform; print(platform.python_version())'",
        "deepspeed": f"{py} -c 'import importlib.metadata as m; print(m.version(\"deepspeed\"))'",
        "gpus": ("if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi "
                 "--query-gpu=index,name,memory.free,memory.total,uuid --format=csv,noheader,nounits; "
                 "else echo none; fi"),
        "mig": "if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L; else echo none; fi",
    }
    return "\n".join(f"echo '{_MARK} {name}'; {{ {command}\n}} 2>&1; echo \"{_MARK}-rc $?\""
                     for name, command in sections.items())


def _sections(text: str) -> dict[str, tuple[list[str], int]]:
    found: dict[str, tuple[list[str], int]] = {}
    name: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith(_MARK + "-rc "):
            if name is not None:
                found[name] = (lines, int(line.split()[-1]))
            name, lines = None, []
        elif line.startswith(_MARK + " "):
            name, lines = line.split(" ", 1)[1], []
        elif name is not None:
            lines.append(line)
    return found


def parse_nvidia_smi(lines: Sequence[str]) -> list[Gpu]:
    """GPUs from `nvidia-smi --query-gpu=index,name,memory.free,memory.total,uuid --format=csv,noheader,nounits`
    (memory in MiB there, bytes here). Raises ValueError on anything else."""
    gpus = []
    for line in lines:
        if not line.strip():
            continue
        parts = [p.strip() for p in line.rsplit(",", 3)]  # the model name may hold commas; the rest cannot
        head, free, total, uuid = parts if len(parts) == 4 else (None, None, None, None)
        index, _, name = (head or "").partition(",")
        if not (index.strip().isdigit() and free and total and free.isdigit() and total.isdigit()):
            raise ValueError(f"unexpected nvidia-smi line: {line!r}")
        gpus.append(Gpu(int(index), name.strip(), int(total) * MIB, int(free) * MIB, uuid or ""))
    return gpus


_GPU_LINE = re.compile(r"GPU (\d+): .*\(UUID: [^)]+\)")
_MIG_LINE = re.compile(r"\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: ([^)]+)\)")


def parse_mig_list(lines: Sequence[str]) -> dict[int, list[tuple[int, str, str]]]:
    """The MIG instances `nvidia-smi -L` lists under each GPU: GPU index -> [(MIG device index, profile, UUID)];
    GPUs not in MIG mode are absent. Lines of any other shape are skipped."""
    found: dict[int, list[tuple[int, str, str]]] = {}
    gpu: int | None = None
    for line in lines:
        if m := _GPU_LINE.match(line):
            gpu = int(m[1])
        elif (m := _MIG_LINE.match(line)) and gpu is not None:
            found.setdefault(gpu, []).append((int(m[2]), m[1], m[3].strip()))
    return found


def with_mig(gpus: Sequence[Gpu], mig: dict[int, list[tuple[int, str, str]]]) -> list[Gpu]:
    """The GPUs with each one in MIG mode replaced by its MIG instances: named as NVML names them ("NVIDIA
    A100-SXM4-40GB MIG 3g.20gb"), the memory their profile states, free memory not known (nvidia-smi's query
    does not give it)."""
    out: list[Gpu] = []
    for g in gpus:
        if g.index not in mig:
            out.append(g)
            continue
        for device, profile, uuid in mig[g.index]:
            size = size_of_type(f"-MIG-{profile}") or 0
            out.append(Gpu(g.index, f"{g.name} MIG {profile}", size, None, uuid, mig=device))
    return out


def _last(lines: list[str]) -> str:
    return lines[-1].strip() if lines else "no output"


def parse_probe(host: str, text: str, seconds: float = 0.0) -> HostReport:
    """A HostReport from the output of `probe_script` on a host that answered."""
    report = HostReport(host, reachable=True, seconds=seconds)
    sections = _sections(text)
    lines, rc = sections.get("loadavg", ([], 1))
    try:
        load = lines[0].split()[:3] if rc == 0 and lines else []
        report.loadavg = (float(load[0]), float(load[1]), float(load[2]))
    except (ValueError, IndexError):
        report.notes.append(f"load average: {_last(lines)}")
    lines, rc = sections.get("cpus", ([], 1))
    if rc == 0 and lines and lines[0].strip().isdigit():
        report.cpus = int(lines[0])
    lines, rc = sections.get("python", ([], 1))
    if rc == 0 and lines:
        report.python = lines[-1].strip()
    else:
        report.notes.append(f"python: {_last(lines)}")
    lines, rc = sections.get("deepspeed", ([], 1))
    if rc == 0 and lines:
        report.deepspeed = lines[-1].strip()
    elif report.python is not None:
        report.notes.append("deepspeed: not installed for this python" if any(
            "PackageNotFoundError" in line for line in lines) else f"deepspeed: {_last(lines)}")
    lines, rc = sections.get("gpus", ([], 1))
    if rc == 0 and [line.strip() for line in lines] == ["none"]:
        pass  # no nvidia-smi: a CPU host
    elif rc != 0:
        report.gpu_error = f"nvidia-smi failed (exit {rc}): {_last(lines)}"
    else:
        try:
            report.gpus = parse_nvidia_smi(lines)
        except ValueError as e:
            report.gpu_error = str(e)
    lines, rc = sections.get("mig", ([], 1))
    if rc == 0 and report.gpus:
        report.gpus = with_mig(report.gpus, parse_mig_list(lines))
    return report


def unanswering(pool: SSHPool, hosts: Sequence[str], timeout: float = 10.0) -> dict[str, str]:
    """The hosts that do not answer a trivial command within `timeout` seconds, each with why, asked at once."""
    trouble = {}
    for host, result in run_many(pool, hosts, "true", timeout).items():
        if isinstance(result, HostDown):
            trouble[host] = str(result)
        elif not result.ok:
            trouble[host] = f"host {host}: `true` failed"
    return trouble


def probe_host(host: str, pool: SSHPool, timeout: float = 30.0, python: str = "python3") -> HostReport:
    """Probe one host; never raises for a host that is down (the report says why). This machine is probed
    here, as its single-node runs start here without SSH; SSH to it is tried too (multi-node runs reach it
    through pdsh), and where it fails the report says so."""
    started = time.monotonic()
    if is_local(host):
        return _probe_here(host, pool, timeout, python, started)
    try:
        result = pool.run(host, probe_script(python), timeout=timeout)
    except HostDown as e:
        return HostReport(host, reachable=False, reason=e.reason, seconds=time.monotonic() - started)
    return parse_probe(host, result.stdout, time.monotonic() - started)


def _probe_here(host: str, pool: SSHPool, timeout: float, python: str, started: float) -> HostReport:
    try:
        done = subprocess.run(["sh", "-c", probe_script(python)], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return HostReport(host, reachable=False, reason=f"the probe on this machine failed: {e}",
                          seconds=time.monotonic() - started)
    report = parse_probe(host, done.stdout, time.monotonic() - started)
    try:
        result = pool.run(host, "true", timeout=timeout)
        report.ssh_error = None if result.ok else "`true` failed"
    except HostDown as e:
        report.ssh_error = e.reason
    return report


def probe_hosts(hosts: Sequence[str], pool: SSHPool, timeout: float = 30.0,
                python: str = "python3") -> list[HostReport]:
    """Probe every host at once over the pooled connections; reports in the order of `hosts`."""
    reports = each(hosts, lambda host: probe_host(host, pool, timeout, python))
    return [reports[host] for host in hosts]


def mig_hosts(hosts: Sequence[str], ssh_config: str | None, accept_new_hosts: bool = False,
              timeout: float = 10.0) -> dict[str, list[Gpu]]:
    """Of `hosts`, probed at once, those that answer with GPUs in MIG mode, each with its GPUs as `with_mig`
    lists them: what a sweep's slots on such a host are (cluster.with_hosts_mig). A host that does not answer
    is left as the hostfile says; the runner finds it down and leaves it out until it answers."""
    with SSHPool(ssh_config, accept_new_hosts=accept_new_hosts) as pool:
        reports = probe_hosts(hosts, pool, timeout)
    return {r.host: r.gpus for r in reports if any(g.mig is not None for g in r.gpus)}


def check_hostfile(hostfile: str | Path, ssh_config: str | None = None,
                   accept_new_hosts: bool = False) -> tuple[dict[str, Host], list[HostReport]]:
    """The hosts of a hostfile and, probed in parallel over fresh pooled connections, a report on each."""
    listed = load_hostfile(hostfile)
    with SSHPool(ssh_config, accept_new_hosts=accept_new_hosts) as pool:
        return listed, probe_hosts(list(listed), pool)


def hostfile_check(title: str, listed: Mapping[str, Host], reports: Sequence[HostReport]) -> HostsCheck:
    """`autotune hosts` of a hostfile: one row per host (reachable or why not, slots, GPUs with free memory,
    versions, load), and its GPU type where one is known: the hostfile's `gpu=`, with the type its GPUs have if
    that differs. The cluster can run when every host answers."""
    types = {r.host: (listed[r.host].attrs.get("gpu"), type_of_gpus(r.gpus)) for r in reports}
    typed = any(stated or found for stated, found in types.values())
    names = ("host", "slots", *(["type"] if typed else []), "state", "GPUs", "python", "deepspeed", "load")
    cells = tuple(_host_cells(r, listed[r.host].slots, _type_cell(*types[r.host]) if typed else None)
                  for r in reports)
    data = [dict(r.to_json(), slots=listed[r.host].slots, gpu_type=types[r.host][0] or types[r.host][1],
                 gpu_type_found=types[r.host][1]) for r in reports]
    return HostsCheck(title, names, cells, tuple(r.reachable for r in reports), "state", data,
                      all(r.reachable for r in reports))


def _type_cell(stated: str | None, found: str | None) -> str:
    if stated and found and stated != found:
        return f"{stated} (found {found})"
    return stated or found or ""


def _host_cells(r: HostReport, slots: int, kind: str | None = None) -> tuple[str, ...]:
    gpus = ", ".join(f"{g.name} {g.memory_total / GiB:.0f} GiB" if g.memory_free is None else
                     f"{g.name} {g.memory_free / GiB:.0f}/{g.memory_total / GiB:.0f} GiB free"
                     for g in r.gpus) or ("error: " + r.gpu_error if r.gpu_error else "none")
    load = " ".join(f"{x:.2f}" for x in r.loadavg) if r.loadavg else ""
    return (r.host, str(slots), *([kind] if kind is not None else []),
            _state(r), gpus if r.reachable else "",
            r.python or "", r.deepspeed or "", load)


def _state(r: HostReport) -> str:
    if not r.reachable:
        return f"down: {r.reason}"
    if r.ssh_error:
        return f"up (here; over SSH: {r.ssh_error}: single-node runs only)"
    return "up"
