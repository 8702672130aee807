"""The DeepSpeed command for one experiment: its config, argv and environment. Pure functions, no I/O (but
`launcher_for_this_python`, which looks for DeepSpeed's launcher beside this Python).

The ds_config travels urlsafe-base64 as the value of `--deepspeed_config` (DeepSpeed's engine accepts a path,
a dict or that encoding), so no config file has to exist on the node that runs it. The `autotuning` section
is injected so that DeepSpeed's engine measures the profile steps, writes metrics.json and ends the run.

A MIG instance is named by its UUID, and DeepSpeed's runner (`deepspeed`) takes only whole numbers as GPU ids
(`--include host:N`, its hostfile's `slots=N`; a UUID in CUDA_VISIBLE_DEVICES makes it fail). Its per-node
launcher (`python -m deepspeed.launcher.launch`, what the runner itself starts for one node) takes the ids from
`--world_info`, JSON, and writes them into the rank's CUDA_VISIBLE_DEVICES as they are; so a run on a MIG slot
is started through that per-node launcher, its world naming the MIG UUID.
"""
from __future__ import annotations

import base64
import copy
import functools
import json
import os
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..jsonvalues import JSON, JSONObject
from ..spec import Experiment
from ..spec.hostfile import format_include
from ..spec.metrics import METRICS_PATH_ENV
from ..spec.model import CONFIG_FLAG, with_arg
from ..spec.progress import PROGRESS_FILE, PROGRESS_PATH_ENV
from ..spec.sure import most_of, tolerance_of
from .tags import TAG_ENV

if TYPE_CHECKING:  # types only: the views that write a best run's command do not import the scheduling core
    from ..core.slots import Devices, Reservation

# Master ports are drawn below Linux's default ephemeral range (32768-60999): between the moment a port is
# chosen and the moment DeepSpeed's rank 0 binds it (seconds later), no outgoing connection can take it.
MASTER_PORTS = (20000, 32767)
DEFAULT_MASTER_PORT = 29500  # DeepSpeed's own default, for a command a person runs
START_PROFILE_STEP = 3
END_PROFILE_STEP = 5
MODEL_INFO = "model_info.json"  # what DeepSpeed's engine writes on a profile run (autotuning.model_info.profile)


@dataclass(frozen=True)
class Command:
    """What to execute for one attempt: argv (never a shell string), extra environment, working directory."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str

    def shell(self) -> str:
        """A copy-pasteable rendering, for cmd.txt and humans; never executed by us."""
        return (f"cd {shlex.quote(self.cwd)} && " if self.cwd else "") + shell_line(self.argv, self.env)


def comm_buffer_prefix(uid: int | str, master_addr: str, port: int) -> str:
    """The start of the names of the /dev/shm buffers DeepSpeed's CPU allreduce makes for a run (one per rank),
    which DeepSpeed 0.19 never unlinks (see executor.remove_comm_buffers)."""
    return f"deepspeed_allreduce_buffer_{uid}_{master_addr}_{port}_"


def shell_line(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """`K=V ... argv` quoted for a POSIX shell."""
    exports = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    return " ".join([*exports, shlex.join(argv)])


def with_autotuning(ds_config: Mapping[str, JSON], metric_path: str, metric: str) -> JSONObject:
    """The experiment's config plus the section that makes DeepSpeed write `metric_path` itself."""
    config = copy.deepcopy(dict(ds_config))
    section = dict(config.get("autotuning") or {})
    section.update(enabled=True, metric_path=metric_path, metric=metric)
    section.setdefault("start_profile_step", START_PROFILE_STEP)
    first = section["start_profile_step"]
    if tolerance_of(config) is not None and "end_profile_step" not in section and isinstance(first, int):
        section["end_profile_step"] = first + most_of(config)  # measured until sure: at most this many (spec/sure.py)
    section.setdefault("end_profile_step", END_PROFILE_STEP)
    model_info = section.get("model_info")
    if isinstance(model_info, Mapping) and model_info.get("profile"):  # a profile run: its model info file beside
        section["model_info_path"] = str(Path(metric_path).with_name(MODEL_INFO))  # the metrics file's place
    config["autotuning"] = section
    # DeepSpeed's throughput line every step, the run's progress (spec/progress.py): an INFO line of its logger,
    # whose level is WARNING unless the config's `log_level` says otherwise.
    config["steps_per_print"] = 1
    if str(config.get("log_level")).lower() not in ("debug", "info"):
        config["log_level"] = "info"
    return config


def run_paths(metric_path: str) -> dict[str, str]:
    """Where a run writes what it measured: its metrics file, and its progress file beside (spec/progress.py)."""
    return {METRICS_PATH_ENV: metric_path, PROGRESS_PATH_ENV: str(Path(metric_path).with_name(PROGRESS_FILE))}


def end_profile_step(ds_config: Mapping) -> int | None:
    """After how many optimizer steps DeepSpeed's engine writes the metrics (None: its autotuning is off)."""
    section = ds_config.get("autotuning")
    if not isinstance(section, Mapping) or not section.get("enabled"):
        return None
    step = section.get("end_profile_step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def window_steps(config: Mapping) -> int:
    """The optimizer steps a run of `config` (its autotuning section on: `with_autotuning`) makes before DeepSpeed's
    engine ends it: its profile window's end, then the step that writes the metrics."""
    end = end_profile_step(config)
    return (end if end is not None else END_PROFILE_STEP) + 1


def without_autotuning(ds_config: Mapping[str, JSON]) -> JSONObject:
    """The config a normal training run uses: the autotuning section removed."""
    config = copy.deepcopy(dict(ds_config))
    config.pop("autotuning", None)
    return config


def encode_config(ds_config: Mapping) -> str:
    return base64.urlsafe_b64encode(json.dumps(ds_config, sort_keys=True).encode()).decode()


def with_config_arg(args: Sequence[str], value: str, flag: str = CONFIG_FLAG) -> list[str]:
    """The user's args (a fresh list) with the config option (`--deepspeed_config`, or the sweep's
    `config_flag`) set to `value`, replaced where present."""
    return with_arg(args, flag, value)


@dataclass(frozen=True)
class Launcher:
    """How DeepSpeed's launcher is reached and told where the master is."""

    executable: tuple[str, ...] = ("deepspeed",)
    master_addr: str = "127.0.0.1"
    options: tuple[str, ...] = ()  # e.g. ("--launcher", "pdsh", "--ssh_port", "2222")


def deepspeed_command(
    experiment: Experiment,
    reservation: Reservation,
    ds_config: Mapping,
    *,
    hostfile: str,
    master_port: int,
    metric_path: str,
    tag: str,
    cwd: str,
    launcher: Launcher = Launcher(),
    env: Mapping[str, str] | None = None,
    placement: Sequence[str] | None = None,
    mig: str | None = None,
) -> Command:
    """The full launch for one attempt on exactly the reserved slots, running `ds_config`. `placement`: the
    launcher's options that pick the slots, if not `--include` of the reservation (a Slurm step adds its own
    on each node). `mig`: the UUID of the MIG instance the reservation's one slot is (see the module's doc)."""
    if mig is not None:
        return _mig_command(experiment, reservation, ds_config, master_port=master_port, metric_path=metric_path,
                            tag=tag, cwd=cwd, launcher=launcher, env=env, mig=mig)
    if placement is None:
        placement = ("--include", format_include(reservation.as_dict()), "--no_ssh_check")
    argv = [
        *launcher.executable,
        "--hostfile", hostfile,
        *placement,
        "--master_addr", launcher.master_addr,
        "--master_port", str(master_port),
        *launcher.options,
        experiment.script,
        *with_config_arg(experiment.args, encode_config(ds_config), experiment.config_flag),
    ]
    full_env = {**(env or {}), **experiment.env, TAG_ENV: tag, **run_paths(metric_path)}
    return Command(tuple(argv), full_env, cwd)


def mig_of(reservation: Reservation, devices: Devices) -> str | None:
    """The MIG UUID of a reservation's one slot, None when it is not a MIG instance."""
    if len(reservation.slots) != 1 or len(reservation.slots[0][1]) != 1:
        return None
    host, (slot,) = reservation.slots[0]
    device = devices.get(host, {}).get(slot)
    return device.mig if device is not None else None


def _mig_command(experiment: Experiment, reservation: Reservation, ds_config: Mapping, *, master_port: int,
                 metric_path: str, tag: str, cwd: str, launcher: Launcher, env: Mapping[str, str] | None,
                 mig: str) -> Command:
    """One rank on one MIG instance, through DeepSpeed's per-node launcher: its world is this host with the MIG
    UUID as its one GPU id, which it sets as the rank's CUDA_VISIBLE_DEVICES (and LOCAL_RANK 0, WORLD_SIZE 1,
    `--local_rank=0`, as for any one-GPU run). The launcher's own environment names the instance too."""
    argv = per_node_argv(launcher, reservation.hosts[0], mig, master_port, experiment.script,
                         with_config_arg(experiment.args, encode_config(ds_config), experiment.config_flag))
    full_env = {**(env or {}), **experiment.env, VISIBLE_DEVICES: mig, TAG_ENV: tag,
                **run_paths(metric_path)}
    return Command(tuple(argv), full_env, cwd)


def per_node_argv(launcher: Launcher, host: str, mig: str, master_port: int, script: str,
                  args: Sequence[str]) -> list[str]:
    """DeepSpeed's per-node launcher running `script` as one rank on the MIG instance `mig` of `host`."""
    world = base64.urlsafe_b64encode(json.dumps({host: [mig]}).encode()).decode()
    return [launcher_python(launcher.executable), "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world}",
            f"--master_addr={launcher.master_addr}", f"--master_port={master_port}", script, *args]


VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


@functools.lru_cache(maxsize=16)
def launcher_python(executable: tuple[str, ...]) -> str:
    """The Python that DeepSpeed's launcher `executable` runs under, for its per-node launcher: the interpreter
    its script's `#!` line names (pip's `deepspeed` script names its environment's), or the command itself when
    it is a Python; else this Python."""
    first = executable[0] if executable else ""
    if len(executable) > 1:
        return first if "python" in os.path.basename(first) else sys.executable
    path = shutil.which(first) or first
    if not os.path.isfile(path):  # a pipe (which may pass as executable) would be waited on for ever
        return sys.executable
    try:
        with open(path, "rb") as script:
            line = script.readline(400)
    except OSError:
        return sys.executable
    words = line[2:].decode("utf-8", "replace").split() if line.startswith(b"#!") else []
    if words and os.path.basename(words[0]) == "env":
        words = words[1:]
    if words and "python" in os.path.basename(words[0]):
        return shutil.which(words[0]) or words[0]
    return sys.executable


def optimal_command(experiment: Experiment, config_path: str, launcher: Launcher = Launcher(),
                    env: Mapping[str, str] | None = None, mig: str | None = None) -> str:
    """A runnable training command for the winner: its config file, any slots of the right shape. A winner of a
    MIG instance (`mig`, its UUID) runs as it did, through DeepSpeed's per-node launcher on that instance: the
    `deepspeed` runner cannot name one (another instance of the type: its UUID in place of this one's)."""
    if mig is not None:
        args = with_config_arg(experiment.args, config_path, experiment.config_flag)
        argv = per_node_argv(launcher, "localhost", mig, DEFAULT_MASTER_PORT, experiment.script, args)
        return shell_line(argv, {**(env or {}), **experiment.env, VISIBLE_DEVICES: mig})
    argv = [*launcher.executable]
    if experiment.num_nodes > 1:
        argv += ["--num_nodes", str(experiment.num_nodes)]
    argv += ["--num_gpus", str(experiment.num_gpus), experiment.script,
             *with_config_arg(experiment.args, config_path, experiment.config_flag)]
    return shell_line(argv, {**(env or {}), **experiment.env})


def launcher_for_this_python() -> Launcher:
    """DeepSpeed's launcher installed beside this Python if there is one, else `deepspeed` from PATH."""
    beside = Path(sys.executable).parent / "deepspeed"
    return Launcher(executable=(str(beside),) if beside.exists() else (shutil.which("deepspeed") or "deepspeed",))
