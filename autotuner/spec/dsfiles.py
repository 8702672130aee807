"""DeepSpeed's own experiment files, as its autotuner writes them into exps_dir (or the exp.json of a result).

`{"name": .., "ds_config": {..} or "path.json", "num_gpus": N, "num_nodes": N}`, optionally `user_script`
(relative to the current directory, as DeepSpeed's launcher got it) and `user_args`, which win over --script /
--args, and `hostfile` (relative to the current directory), which the CLI uses when it is given none
(cluster.spec_hostfile). The other bookkeeping keys DeepSpeed's scheduler adds (DS_IGNORED) are ignored: the
runner decides those itself.
"""
from __future__ import annotations

from ..errors import UserError, shown
from ..jsonvalues import JSONObject
from .grid import SWEEP_KEYS
from .model import Experiment, Origin, is_safe_name, name_problem
from .reading import (
    Defaults,
    Loaded,
    Source,
    abspath,
    check_batch,
    ds_config_of,
    positive_count,
    script_path,
    stem_name,
    string_list,
)

DS_KEYS = ("name", "ds_config", "num_gpus", "num_nodes", "user_script", "user_args")
DS_IGNORED = ("exp_id", "result_dir", "master_port", "launcher_args", "hostfile", "user", "job_id",
              "ds_config_path", "ds_config_base64", "results")


def load_ds_exp(src: Source, data: JSONObject, defaults: Defaults) -> Loaded:
    """The one experiment of a DeepSpeed experiment file."""
    for key in data:
        if key not in DS_KEYS and key not in DS_IGNORED:
            raise src.error(f"unknown key {shown(key)} (a DeepSpeed experiment file has {', '.join(DS_KEYS)}; "
                            f"a sweep file has {', '.join(SWEEP_KEYS)})", key)
    name = data.get("name", stem_name(src.path))
    if not is_safe_name(name):
        raise src.error(name_problem(name) + ("" if "name" in data else " (from the file name); give `name`"),
                        "name" if "name" in data else None)
    src.budget.expand(1, 0, src, None)
    if "ds_config" not in data:
        raise UserError("a DeepSpeed experiment file needs ds_config", src.path)
    config = ds_config_of(src, data["ds_config"])
    num_gpus = positive_count(src, "num_gpus", data.get("num_gpus", 1))
    num_nodes = positive_count(src, "num_nodes", data.get("num_nodes", 1))
    script = defaults.script
    if data.get("user_script") is not None:
        script = script_path(src, "user_script", data["user_script"], None)
    args = defaults.args
    if data.get("user_args") is not None:
        args = string_list(src, "user_args", data["user_args"])
    if script is None:
        raise src.error(f"experiment {name}: no script to run: give --script (or user_script here)", "name")
    hostfile = data.get("hostfile")
    if hostfile is not None and (not isinstance(hostfile, str) or not hostfile.strip() or "\0" in hostfile):
        raise src.error("hostfile must be a path (a string)", "hostfile")
    experiment = Experiment(name=name, ds_config=config, num_gpus=num_gpus, num_nodes=num_nodes, script=script,
                            args=args, timeout=defaults.timeout, env={}, source=str(src.path),
                            gpu_type=defaults.gpu_type, gpu_mixed=defaults.gpu_mixed)
    check_batch(src, experiment)
    line = src.line("name")
    origin = Origin(str(src.path), line, src.line("num_gpus"), src.line("num_nodes"))
    where = f"{src.path}:{src.line('hostfile')}" if hostfile else ""
    return Loaded([(experiment, line)], stem_name(src.path), origin=origin,
                   hostfile=(abspath(hostfile), where) if hostfile else None)
