"""Slurm's text, read: `scontrol show ... -o` records, host lists, step lists, `salloc`'s grant line. Pure
functions, unit-tested on output recorded from a real cluster (tests/data/slurm)."""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from ...errors import shown

# One `Key=Value` of a one-line record: the value runs up to the next ` Key=` (values hold `=`, `,`, `(`, and
# sometimes spaces, e.g. a node's Reason, but never ` Word=`).
_PAIR = re.compile(r"([A-Za-z][\w/:]*)=(.*?)(?= [A-Za-z][\w/:]*=|$)")
_SUBMITTED = re.compile(r"(\d+)(;\S*)?")  # `sbatch --parsable`: "JOB" or "JOB;CLUSTER"
_BRACKETS = re.compile(r"\[([^\]]*)\]")
# Node states in which a node runs nothing new, or may have lost what it ran: its slots are lost to the sweep.
LOST_STATES = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING",
                         "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN", "REBOOT_REQUESTED", "REBOOT_ISSUED"})


def pairs(line: str) -> list[tuple[str, str]]:
    """The `Key=Value` pairs of one `scontrol show -o` line, in order, repeats kept."""
    return [(m.group(1), m.group(2).strip()) for m in _PAIR.finditer(line.strip())]


def record(line: str) -> dict[str, str]:
    """One line's pairs as a mapping (a repeated key: its first value)."""
    found: dict[str, str] = {}
    for key, value in pairs(line):
        found.setdefault(key, value)
    return found


def expand_hosts(text: str) -> list[str]:
    """A Slurm host list (`n[1-3,7],gpu[01-02]`) as names, in order, as `scontrol show hostnames` prints them."""
    names: list[str] = []
    for part in _top_level(text.strip()):
        names.extend(_expand_one(part))
    return names


def _top_level(text: str) -> Iterator[str]:
    """`text` split at the commas outside brackets and parentheses."""
    depth, start = 0, 0
    for i, ch in enumerate(text):
        depth += ch in "[("
        depth -= ch in "])"
        if ch == "," and depth == 0:
            if text[start:i]:
                yield text[start:i]
            start = i + 1
    if text[start:]:
        yield text[start:]


def _expand_one(name: str) -> list[str]:
    match = _BRACKETS.search(name)
    if match is None:
        return [name]
    head, tail = name[:match.start()], name[match.end():]
    out = []
    for item in match.group(1).split(","):
        low, _, high = item.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"not a Slurm host list: {name}")
        width = len(low)
        for number in range(int(low), int(high or low) + 1):
            out.extend(_expand_one(f"{head}{number:0{width}d}{tail}"))
    return out


def count_ids(text: str) -> int:
    """How many ids a list like `0-3,6` names (CPU_IDs, a GPU IDX)."""
    return len(ids(text))


def ids(text: str) -> list[int]:
    """The ids a list like `0-3,6` names, in order."""
    out: list[int] = []
    for item in filter(None, text.split(",")):
        low, _, high = item.partition("-")
        out.extend(range(int(low), int(high or low) + 1))
    return out


@dataclass(frozen=True)
class Gpus:
    """The GPUs of one node of an allocation: how many, their indices, their type (as GRES names it)."""

    count: int
    indices: tuple[int, ...] = ()
    type: str | None = None


def gpus_of(gres: str) -> Gpus | None:
    """The `gpu` entries of a GRES string (`gpu:2(IDX:0-1)`, `gpu:a100:4(IDX:0-3)`, `gpu:2`, `gres/gpu=2`);
    None when it names no GPU."""
    count, indices, kind = 0, [], None
    for entry in _top_level(gres):
        entry = entry.strip()
        if entry.startswith("gres/gpu"):  # TRES form: gres/gpu=2 or gres/gpu:a100=2
            name, _, number = entry.partition("=")
            parts = name.split(":")
            if number.isdigit() and len(parts) <= 2:
                count += int(number)
                kind = kind or (parts[1] if len(parts) == 2 else None)
            continue
        body, _, extra = entry.partition("(")
        parts = body.split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        number = parts[-1]
        if not number.isdigit():
            continue
        count += int(number)
        if len(parts) == 3:
            kind = kind or parts[1]
        index = re.search(r"IDX:([\d,\-]+)", extra)
        if index:
            indices.extend(ids(index.group(1)))
    return Gpus(count, tuple(indices), kind) if count else None


@dataclass(frozen=True)
class NodeShare:
    """What an allocation holds on one node (from `scontrol show job -d`)."""

    cpus: int
    memory_mb: int  # 0: memory is not tracked
    gpus: Gpus | None


@dataclass(frozen=True)
class Job:
    """A job (an allocation) as `scontrol show job -d -o` describes it."""

    id: str
    state: str
    nodes: tuple[str, ...]
    shares: dict[str, NodeShare] = field(default_factory=dict)
    end_time: str | None = None  # as Slurm prints it (local time, ISO-like), or None: Unknown / none
    time_limit: str | None = None
    reason: str | None = None


def job(line: str) -> Job:
    """One `scontrol show job -d -o` line."""
    fields = record(line)
    shares: dict[str, NodeShare] = {}
    current: dict[str, str] | None = None
    details: list[dict[str, str]] = []
    for key, value in pairs(line):
        if key == "Nodes":
            current = {"Nodes": value}
            details.append(current)
        elif current is not None and key in ("CPU_IDs", "Mem", "GRES"):
            current[key] = value
    for detail in details:
        share = NodeShare(count_ids(detail.get("CPU_IDs", "")), _int(detail.get("Mem", "0")),
                          gpus_of(detail.get("GRES", "")))
        for host in expand_hosts(detail["Nodes"]):
            shares[host] = share
    node_list = fields.get("NodeList", "")
    nodes = tuple(expand_hosts(node_list)) if node_list and node_list != "(null)" else ()
    if nodes and not shares:  # without -d: the same share on every node, from the per-node request
        per_node = gpus_of(fields.get("TresPerNode", "").replace("gres:", "", 1))
        share = NodeShare(_int(fields.get("NumCPUs", "0")) // len(nodes), _int(fields.get("MinMemoryNode", "0")),
                          per_node)
        shares = dict.fromkeys(nodes, share)
    end = fields.get("EndTime")
    return Job(fields.get("JobId", ""), fields.get("JobState", ""), nodes, shares,
               None if end in (None, "Unknown", "None") else end, fields.get("TimeLimit"), fields.get("Reason"))


def _int(text: str) -> int:
    digits = re.match(r"\d+", text)
    return int(digits.group()) if digits else 0


@dataclass(frozen=True)
class Node:
    """A node as `scontrol show node -o` describes it."""

    name: str
    address: str
    states: frozenset[str]
    reason: str | None
    gpus: Gpus | None

    @property
    def lost(self) -> bool:
        """Slurm runs nothing new there, or has lost touch with it (`*`)."""
        return bool(self.states & LOST_STATES)

    @property
    def why(self) -> str:
        """Its state in Slurm's words, with the reason an admin gave: `DRAIN+MIXED (failing fan)`."""
        return "+".join(sorted(self.states)) + (f" ({self.reason})" if self.reason else "")


def nodes(text: str) -> list[Node]:
    """Every line of `scontrol show node -o`."""
    found = []
    for line in text.splitlines():
        fields = record(line)
        if "NodeName" not in fields:
            continue
        state = fields.get("State", "")
        states = set(re.split(r"[+]", state.rstrip("*$~#!%@^-")))
        if state.endswith("*"):
            states.add("NOT_RESPONDING")
        reason = fields.get("Reason")
        found.append(Node(fields["NodeName"], fields.get("NodeAddr", fields["NodeName"]), frozenset(states - {""}),
                          None if reason in (None, "(null)") else reason, gpus_of(fields.get("Gres", ""))))
    return found


@dataclass(frozen=True)
class Step:
    """A running job step (`squeue -s`): its id (`J.S`), name and nodes."""

    id: str
    name: str
    nodes: tuple[str, ...]


STEP_FORMAT = "%i|%j|%N"  # squeue -s -o: the fields `steps` reads


def steps(text: str) -> list[Step]:
    """`squeue -h -s -o '%i|%j|%N'` lines."""
    found = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 3 and "." in parts[0]:
            found.append(Step(parts[0], parts[1], tuple(expand_hosts(parts[2])) if parts[2] else ()))
    return found


# srun's line for tasks that ended badly: "srun: error: NODE: task(s) IDS: Exited with exit code N", or the
# signal's name ("Terminated", "Killed", "Aborted") when one ended them. Not only at a line's start: srun writes
# it into the file the ranks write to, after whatever a rank left unended (a progress bar's "\r...", no newline);
# a "\r" before the newline is no part of it.
_TASK_END = re.compile(r"srun: error: \S+: tasks? [\d,\-]+: (?:Exited with exit code (\d+)|(.+?))\r?$", re.M)
_ENDED_BY_STEP = frozenset({"Terminated", "Killed"})  # what srun's kill of a step's other tasks does to them


def first_bad_exit(text: str) -> int | None:
    """The exit status of the task whose bad exit ended a `--kill-on-bad-exit` step, from srun's stderr; None
    unless that is the whole story (one such status, every other task reported ended by the step's kill).

    srun's own status is the highest of its tasks': a node launcher's 250 (a rank that aborted at exit) becomes
    143 once srun has sent the other nodes' launchers SIGTERM, and hides how the step really ended."""
    codes = []
    for match in _TASK_END.finditer(text):
        if match.group(1) is not None:
            if int(match.group(1)) == 0:  # srun never says it: a line of the script's that looks like srun's
                return None
            codes.append(int(match.group(1)))
        elif match.group(2).strip() not in _ENDED_BY_STEP:
            return None
    return codes[0] if len(codes) == 1 else None


def submitted_job(text: str) -> str | None:
    """The job id `sbatch --parsable` printed (its first line: "JOB" or "JOB;CLUSTER")."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    match = _SUBMITTED.fullmatch(line)
    return match.group(1) if match else None


# A time limit as salloc reads one: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds; or no limit.
_TIME_LIMIT = re.compile(r"\d{1,9}(:\d{1,9}){0,2}|\d{1,9}-\d{1,9}(:\d{1,9}){0,2}|UNLIMITED|INFINITE", re.I)
# A partition or account: Slurm's names (a comma-separated list of partitions), no spaces or control characters.
_SLURM_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,200}")
_SLURM_NAMES = re.compile(rf"{_SLURM_NAME.pattern}(,{_SLURM_NAME.pattern}){{0,63}}")


def value_problem(option: str, value: str | None) -> str | None:
    """Why salloc could not take `value` for `option` (--time, --partition, --account); None when it can. Told
    before an allocation is asked for, so a typo is one line at once, not one after a wait in the queue."""
    if value is None:
        return None
    pattern = {"--time": _TIME_LIMIT, "--partition": _SLURM_NAMES}.get(option, _SLURM_NAME)
    if pattern.fullmatch(value) is not None:
        return None
    wanted = {"--time": "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED",
              "--partition": "Slurm names: letters, digits, _ . -, comma-separated"}.get(
                  option, "a Slurm name: letters, digits, _ . -")
    return f"{option} {shown(value)}: not {'a time limit Slurm reads' if option == '--time' else 'a name'} ({wanted})"
