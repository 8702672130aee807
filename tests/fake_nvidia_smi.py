"""A FAKE nvidia-smi, for test nodes that have no GPU: it answers `--query-gpu=FIELDS --format=csv,...` as the real
one does (one line per GPU, fields in the order asked, memory in MiB; `noheader`, `nounits`) and `-L` (the GPU
list, and under a GPU in MIG mode its MIG instances, indented, as the real one lists them), from a state file a
test writes, and fails as the real one does when its
driver cannot be reached (exit 9). Every call is appended to `calls.log` beside the state, so a test can count
the readings.

`install(bin_dir, gpus)` puts it into a test node's `bin` directory (tests/sshnodes.py: first on the PATH of
the node's sessions) as `nvidia-smi`; `set_gpus` changes what it reports (`failing=True`: its driver fails).
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

STATE = "fake_nvidia_smi.json"
CALLS = "calls.log"
DRIVER_FAILED = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that "
                 "the latest NVIDIA driver is installed and running.")


def install(bin_dir: Path, gpus: list[dict], *, failing: bool = False) -> Path:
    """Install the fake as `bin_dir/nvidia-smi`, reporting `gpus` ({name, total_mib, free_mib}, in index order)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    tool = bin_dir / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\nFAKE_NVIDIA_SMI_DIR={shlex.quote(str(bin_dir))} exec "
                    f"{shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).resolve()))} \"$@\"\n")
    tool.chmod(0o755)
    set_gpus(bin_dir, gpus, failing=failing)
    (bin_dir / CALLS).write_text("")
    return tool


def uninstall(bin_dir: Path) -> None:
    for name in ("nvidia-smi", STATE, CALLS):
        (bin_dir / name).unlink(missing_ok=True)


def set_gpus(bin_dir: Path, gpus: list[dict], *, failing: bool = False) -> None:
    path = bin_dir / STATE
    path.with_suffix(".tmp").write_text(json.dumps({"gpus": gpus, "failing": failing}))
    path.with_suffix(".tmp").replace(path)


def calls(bin_dir: Path) -> list[str]:
    path = bin_dir / CALLS
    return path.read_text().splitlines() if path.exists() else []


def gpu(name: str = "NVIDIA A100-SXM4-80GB", total_gib: float = 80, free_gib: float = 79,
        mig: list[tuple[str, str]] | None = None) -> dict:
    """One GPU; `mig`: it is in MIG mode, with these instances as (profile, UUID), e.g. ("3g.20gb", "MIG-...")."""
    return {"name": name, "total_mib": int(total_gib * 1024), "free_mib": int(free_gib * 1024),
            "mig": [list(m) for m in mig or []]}


def _field(index: int, gpu: dict, name: str, units: bool) -> str:
    mib = " MiB" if units else ""
    values = {"index": str(index), "name": gpu["name"], "memory.total": f"{gpu['total_mib']}{mib}",
              "memory.free": f"{gpu['free_mib']}{mib}", "memory.used": f"{gpu['total_mib'] - gpu['free_mib']}{mib}",
              "uuid": f"GPU-fake-{index:04d}"}
    if name not in values:
        raise KeyError(name)
    return values[name]


def main(argv: list[str]) -> int:
    directory = Path(os.environ["FAKE_NVIDIA_SMI_DIR"])
    with open(directory / CALLS, "a") as log:
        log.write(" ".join(argv) + "\n")
    state = json.loads((directory / STATE).read_text())
    if state.get("failing"):
        print(DRIVER_FAILED)
        return 9
    if argv == ["-L"]:  # the GPU list, as the real one prints it: a GPU in MIG mode with its instances under it
        for i, g in enumerate(state["gpus"]):
            print(f"GPU {i}: {g['name']} (UUID: GPU-fake-{i:04d})")
            for device, (profile, uuid) in enumerate(g.get("mig") or []):
                print(f"  MIG {profile:<11} Device {device:>2}: (UUID: {uuid})")
        return 0
    options = dict(a.split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    fields = options.get("--query-gpu", "").split(",")
    form = options.get("--format", "").split(",")
    if "csv" not in form or not fields[0]:
        print("the fake nvidia-smi answers --query-gpu=... --format=csv only", file=sys.stderr)
        return 2
    try:
        lines = [", ".join(_field(i, g, f, "nounits" not in form) for f in fields) for i, g in enumerate(state["gpus"])]
    except KeyError as e:
        print(f'Field "{e.args[0]}" is not a valid field to query.', file=sys.stderr)
        return 2
    if "noheader" not in form:
        print(", ".join(fields))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
