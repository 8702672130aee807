"""DeepSpeed's hostfile and its `--include` / `--exclude` filters.

We read and write exactly what DeepSpeed's launcher reads (`name slots=N`), so the hostfile a user already has
works unchanged and the one we hand to `deepspeed --hostfile` is one it understands. Optional `key=value`
attributes after the slots field are ours (`gpu=A100-80GB`, the hosts' GPU type; `gpu_hour_cost=2.5`, what a
GPU-hour of that type costs; `accelerator=cpu`); DeepSpeed's
parser ignores trailing text, and the hostfile we hand it (`format_hostfile`) has none.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from .. import limits
from ..errors import UserError, read_user_file, shown
from ..gpu.types import size_problem, type_problem

# `slots = 4` with spaces is accepted because DeepSpeed accepts it.
_LINE = re.compile(r"(?P<name>\S+)\s+slots\s*=\s*(?P<slots>\S+)(?P<rest>.*)")
_ATTR_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
# Characters that would make a name ambiguous in the filter syntax (`host:0,1@host`) or in our own syntax.
_NAME_FORBIDDEN = set(":@,=#")
HOST_NAME_MAX = 253  # the longest DNS name
# What a host name may hold: letters, digits, `_` (ssh config aliases), `.` and `-`, never first. A name reaches
# ssh and pdsh as an argument and DeepSpeed's multi-node launcher as --master_addr inside the remote shell's
# command line: `-v` would be an option there, `n1;cmd` a second command.
_HOST_NAME = re.compile(r"[^\W][\w.-]*")
KNOWN_ATTRS = ("gpu", "gpu_hour_cost", "accelerator")  # the attributes this package reads
ACCELERATORS = ("cuda", "cpu")  # accelerator=cpu: DeepSpeed on CPU; cuda is what a host without one runs

HOSTFILE = "hostfile"  # a sweep's own hostfile, beside its ledger: what DeepSpeed's launcher is given


@dataclass(frozen=True)
class Host:
    """One node of the hostfile: its name, how many slots (GPUs) it offers, and free-form attributes."""

    name: str
    slots: int
    # Read-only view; excluded from the hash (a mapping proxy is unhashable) but still part of equality.
    attrs: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "attrs", MappingProxyType(dict(self.attrs)))


def _fail(message: str, path: str | Path, line: int | None = None) -> UserError:
    return UserError(message, str(path), line)


def parse_hostfile(text: str, path: str | Path = "<hostfile>") -> dict[str, Host]:
    """Hosts in file order. Every problem is a UserError naming `path` and the line, so nothing is guessed.

    Slots are bounded (limits.SLOTS_PER_HOST per host, limits.SLOTS in all) before any is built: a line such
    as `node slots=1000000000` must be refused, not turned into a billion slot ids.
    """
    hosts: dict[str, Host] = {}
    lowered: dict[str, str] = {}
    priced: dict[str, tuple[float, int]] = {}  # GPU type -> its price and the line that gave it
    total = 0
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE.fullmatch(line)
        if m is None:
            raise _fail(f"expected `hostname slots=N [key=value ...]`, got {shown(line)}", path, number)
        name, slots_text, rest = m["name"], m["slots"], m["rest"]
        if len(name) > HOST_NAME_MAX:
            raise _fail(f"host name {shown(name)} is longer than {HOST_NAME_MAX} characters", path, number)
        bad = sorted(_NAME_FORBIDDEN.intersection(name))
        if bad:
            raise _fail(f"host name {shown(name)} contains {''.join(bad)!r}, which the --include/--exclude "
                        "syntax cannot express", path, number)
        if _HOST_NAME.fullmatch(name) is None:
            raise _fail(f"host name {shown(name)}: a host name is letters, digits, '.', '-' and '_', not "
                        "starting with '.' or '-'", path, number)
        if not slots_text.isascii() or not slots_text.isdigit() or int(slots_text[:20]) < 1:
            raise _fail(f"slots for {name} must be a positive integer, got {shown(slots_text)}", path, number)
        if len(slots_text) > 20 or int(slots_text) > limits.SLOTS_PER_HOST:
            raise _fail(f"slots={shown(slots_text, 20)} for {name} is more than {limits.SLOTS_PER_HOST}, "
                        "the most slots one host may have", path, number)
        same = lowered.setdefault(name.lower(), name)  # DNS ignores case: N1 and n1 are one host
        if same != name or name in hosts:
            raise _fail(f"duplicate host {shown(name)}" + (f" (as {shown(same)})" if same != name else ""), path,
                        number)
        total += int(slots_text)
        if total > limits.SLOTS:
            raise _fail(f"the hosts up to this line have {total} slots, more than {limits.SLOTS}, the most a "
                        "cluster may have", path, number)
        attrs: dict[str, str] = {}
        for token in rest.split():
            key, eq, value = token.partition("=")
            if not eq or not _ATTR_KEY.fullmatch(key) or not value:
                raise _fail(f"malformed attribute {shown(token)} for {name}; expected key=value", path, number)
            if key == "slots" or key in attrs:
                raise _fail(f"attribute {shown(key)} given twice for {name}", path, number)
            attrs[key] = value
        problem = _attrs_problem(attrs) or _price_problem(attrs, priced)
        if problem:
            raise _fail(f"{name}: {problem}", path, number)
        hosts[name] = Host(name, int(slots_text), attrs)
        if "gpu_hour_cost" in attrs:
            priced.setdefault(attrs["gpu"], (float(attrs["gpu_hour_cost"]), number))
    if not hosts:
        raise _fail("hostfile lists no hosts", path)
    return hosts


def _attrs_problem(attrs: Mapping[str, str]) -> str | None:
    """Why the attributes we read (KNOWN_ATTRS) cannot be used; None when they can. Other keys are free-form
    notes, but a known key in another case (`GPU=`) is a typo that would silently lose the type."""
    for key in attrs:
        if key not in KNOWN_ATTRS and key.lower() in KNOWN_ATTRS:
            return f"attribute {shown(key)}: attributes are lower case ({key.lower()}=)"
    if "gpu" in attrs:
        problem = type_problem(attrs["gpu"]) or size_problem(attrs["gpu"])
        if problem:
            return problem
    accelerator = attrs.get("accelerator")
    if accelerator is not None and accelerator not in ACCELERATORS:
        return f"accelerator={shown(accelerator, quoted=False)}: one of {', '.join(ACCELERATORS)}"
    return None


def _price_problem(attrs: Mapping[str, str], priced: Mapping[str, tuple[float, int]]) -> str | None:
    """Why a host's `gpu_hour_cost=` cannot be used; None when it can (or there is none). A price is per GPU type
    (a training run is priced by the type it runs on), so it needs the host's `gpu=`, and hosts of one type agree."""
    text = attrs.get("gpu_hour_cost")
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= limits.PRICE:  # NaN fails it too
        return f"gpu_hour_cost={shown(text, quoted=False)}: a price from 0 to {limits.PRICE:,} a GPU-hour"
    if "gpu" not in attrs:
        return "gpu_hour_cost= prices a GPU type: give the host's gpu= too"
    before = priced.get(attrs["gpu"])
    if before is not None and before[0] != value:
        return (f"gpu_hour_cost={shown(text, quoted=False)} for GPU type {shown(attrs['gpu'])}, priced "
                f"{before[0]:g} on line {before[1]}: one price a type")
    return None


def prices_of(hosts: Mapping[str, Host]) -> dict[str, float]:
    """GPU type -> the price of its GPU-hour, as the hosts' `gpu_hour_cost=` state it (checked when read)."""
    return {h.attrs["gpu"]: float(h.attrs["gpu_hour_cost"]) for h in hosts.values() if "gpu_hour_cost" in h.attrs}


def load_hostfile(path: str | Path) -> dict[str, Host]:
    """Read and parse; a file that cannot be read is the user's problem to fix, not a traceback."""
    return parse_hostfile(read_user_file(path, "hostfile"), path)


def parse_filter(spec: str, hosts: Mapping[str, Host], option: str) -> dict[str, set[int] | None]:
    """`h1:0,2@h2` -> {h1: {0, 2}, h2: None}; None means every slot of that host."""
    wanted: dict[str, set[int] | None] = {}
    for part in spec.split("@"):
        part = part.strip()
        if not part:
            raise UserError(f"{option} {shown(spec)}: empty entry between '@' separators")
        name, colon, ids_text = part.partition(":")
        name = name.strip()
        if name not in hosts:
            known = ", ".join(list(hosts)[:10]) + (f", ... ({len(hosts)} hosts)" if len(hosts) > 10 else "") or "none"
            raise UserError(f"{option} {shown(spec)}: unknown host {shown(name)} in {shown(part)} (hosts: {known})")
        if not colon:
            wanted[name] = None
            continue
        ids: set[int] = set()
        for item in ids_text.split(","):
            item = item.strip()
            if not (item.isascii() and item.isdigit() and len(item) <= 20):
                raise UserError(f"{option} {shown(spec)}: bad slot id {shown(item)} in {shown(part)}; "
                                "expected host:0,1,...")
            slot = int(item)
            if slot >= hosts[name].slots:
                raise UserError(f"{option} {shown(spec)}: slot {slot} in {shown(part)} is out of range; "
                                f"{name} has slots 0-{hosts[name].slots - 1}")
            ids.add(slot)
        if name in wanted and wanted[name] is None:
            continue  # already named without ids: all of its slots
        wanted[name] = (wanted.get(name) or set()) | ids
    return wanted


def select_slots(hosts: Mapping[str, Host], include: str = "", exclude: str = "", source: str = "--include",
                 exclude_source: str = "--exclude") -> dict[str, tuple[int, ...]]:
    """Slot ids per host after DeepSpeed's filters: hostfile order, sorted ids, empty hosts dropped.

    `source` / `exclude_source` name the options in messages (the CLI flags, or a file that carried them).
    """
    include, exclude = include.strip(), exclude.strip()
    if include and exclude:
        raise UserError(f"{source} and {exclude_source} cannot be used together")
    every = {name: set(range(h.slots)) for name, h in hosts.items()}
    if include:
        wanted = parse_filter(include, hosts, source)
        chosen = {n: every[n] if ids is None else ids for n, ids in wanted.items()}
    elif exclude:
        unwanted = parse_filter(exclude, hosts, exclude_source)
        chosen = {}
        for n, ids in every.items():
            drop = unwanted.get(n, set())
            chosen[n] = set() if drop is None else ids - drop
    else:
        chosen = every
    result = {n: tuple(sorted(chosen[n])) for n in hosts if chosen.get(n)}
    if not result and hosts:
        option, spec = (source, include) if include else (exclude_source, exclude)
        raise UserError(f"{option} {shown(spec)} leaves no slots to run on")
    return result


def format_include(selection: Mapping[str, Sequence[int]]) -> str:
    """The `--include` string for exactly these slots. Always explicit ids: a bare host means "all of it"."""
    parts = []
    for name, ids in selection.items():
        if _NAME_FORBIDDEN.intersection(name):
            raise ValueError(f"host name {name!r} cannot be written in --include syntax")
        if ids:
            parts.append(f"{name}:{','.join(str(i) for i in sorted(set(ids)))}")
    if not parts:
        # An empty string would mean "no filter", i.e. every slot: the opposite of what was asked.
        raise ValueError("cannot format an empty slot selection as --include")
    return "@".join(parts)


def format_hostfile(hosts: Mapping[str, int]) -> str:
    """A hostfile DeepSpeed's launcher reads: one `name slots=N` line per host."""
    lines = []
    for name, slots in hosts.items():
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots for {name!r} must be a positive integer, got {slots!r}")
        lines.append(f"{name} slots={slots}\n")
    return "".join(lines)


LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def is_local(host: str) -> bool:
    """Whether a host is this machine: reached without SSH, its processes started and ended directly."""
    return host in LOCAL_NAMES


def localhost_hosts(slots: int) -> dict[str, Host]:
    """This machine as a one-host cluster; `localhost` is the name DeepSpeed's launcher uses with no hostfile."""
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise UserError(f"the number of slots must be a positive integer, got {shown(slots)}")
    if slots > limits.SLOTS_PER_HOST:
        raise UserError(f"{shown(slots)} slots is more than {limits.SLOTS_PER_HOST}, the most one host may have")
    return {"localhost": Host("localhost", slots)}
