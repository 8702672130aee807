"""`autotune tune`'s inputs tried as a hostile or careless user would (issue 32): an NVMe path that the runs would
resolve elsewhere, or that only root's permission bits allow; model facts in a model info file checked as the same
facts inline; the batch keys that bound the micro-batch size named at their own line; whole numbers written as JSON
writes them (1e3); a learned GPU memory need that no GPU can hold, refused up front by `run` and `plan` alike; and
the node-RAM refusal saying that RAM, not the GPU, is short. Each refusal: exit 2, one located line, nothing made."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_gpu_sweeps import REPORTS_PEAK, run_env, setup

import autotuner
from autotuner import UserError
from autotuner.sweep.create import for_cluster

from cli_rig import autotune, env

GiB = 1 << 30


def write_config(directory: Path, autotuning: dict | None = None, zero: dict | None = None, top: dict | None = None,
                 text: str | None = None) -> Path:
    """A DeepSpeed config with an autotuning section; `text` replaces the whole file (numbers as JSON writes
    them: 1e3 is a float to json.loads)."""
    path = directory / "ds.json"
    ds = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, **(zero or {})},
          "autotuning": {"enabled": True, **(autotuning or {})}, **(top or {})}
    path.write_text(text if text is not None else json.dumps(ds, indent=1))
    return path


def line_of(path: Path, needle: str, after: int = 0) -> int:
    return next(n for n, text in enumerate(path.read_text().splitlines(), 1) if n > after and needle in text)


def script_in(directory: Path) -> Path:
    """The training script in a directory of its own, apart from the current one: the runs start there."""
    (directory / "sub").mkdir(exist_ok=True)
    script = directory / "sub" / "train.py"
    script.write_text("# stand-in: never run here\n")
    return script


def request(directory: Path, *extra: str, num_gpus: int | None = None) -> autotuner.TuneRequest:
    return autotuner.read_tune(str(script_in(directory)), ["--deepspeed_config", "ds.json", *extra], cwd=directory,
                               num_gpus=num_gpus)


def on_this_machine(req: autotuner.TuneRequest, hostfile: str = "localhost slots=2 gpu=X-80GB\n",
                    directory: Path | None = None) -> None:
    """The request checked against a cluster of this machine (nothing is run or written)."""
    if directory is None:
        for_cluster(req, autotuner.load_cluster(slots=1))
        return
    (directory / "hostfile").write_text(hostfile)
    for_cluster(req, autotuner.load_cluster(directory / "hostfile"))


def nvme(path: str) -> dict:
    return {"offload_optimizer": {"device": "nvme", "nvme_path": path}}


# --- nvme_path: where the runs resolve it, as the file system answers -------------------------------------------


def test_a_relative_nvme_path_is_checked_in_the_script_directory_where_the_runs_start(tmp_path, monkeypatch):
    """The runs start in the script's directory with the path unchanged: a directory only the current directory
    has would be missed by every run (accepted before), one only the script's directory has would be found by
    every run (refused before)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here_only").mkdir()
    script_in(tmp_path)
    (tmp_path / "sub" / "there_only").mkdir()
    config = write_config(tmp_path, zero=nvme("there_only"))
    on_this_machine(request(tmp_path))  # the runs find it: accepted
    assert os.listdir(tmp_path / "sub" / "there_only") == []  # the check left nothing behind
    config = write_config(tmp_path, zero=nvme("here_only"))
    with pytest.raises(UserError) as e:
        on_this_machine(request(tmp_path))
    assert (e.value.path, e.value.line) == (config, line_of(config, "nvme_path"))
    assert "does not exist" in e.value.message and str(tmp_path / "sub" / "here_only") in e.value.message
    assert "script's directory" in e.value.message


@pytest.mark.parametrize(("path", "said"), [
    ("/proc", "cannot create files"),  # root's os.access says yes; no file can be made there
    ("/sys/kernel", "cannot create files"),
    ("~/nvme", "expands neither ~"),  # DeepSpeed takes it as it is: a directory named ~ under the script's
    ("train.py", "is not a directory"),  # relative: the script itself, in the script's directory
])
def test_an_nvme_path_no_run_could_write_to_is_one_located_line(tmp_path, monkeypatch, path, said):
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, zero=nvme(path))
    with pytest.raises(UserError) as e:
        on_this_machine(request(tmp_path))
    assert (e.value.path, e.value.line) == (config, line_of(config, "nvme_path")), str(e.value)
    assert said in e.value.message


@pytest.mark.parametrize("bad", ["a\x00b", "nvme\n", "nv\tme", "\x7f"])
def test_an_nvme_path_with_a_control_character_is_refused_at_its_line(tmp_path, bad):
    config = write_config(tmp_path, zero={"offload_param": {"device": "cpu"}, **nvme(bad)})
    with pytest.raises(UserError) as e:
        request(tmp_path)  # refused as the config is read: before any cluster is asked for anything
    assert (e.value.path, e.value.line) == (config, line_of(config, "nvme_path")), str(e.value)
    assert "control character" in e.value.message and "\n" not in str(e.value)


def test_the_cli_refuses_an_nvme_path_of_proc_in_one_line_and_makes_nothing(tmp_path):
    script_in(tmp_path)
    config = write_config(tmp_path, zero=nvme("/proc"))
    result = autotune("tune", "--slots", 1, "-o", tmp_path / "res", "sub/train.py", "--deepspeed_config", "ds.json",
                      cwd=tmp_path, environ=env(PYTHONPATH=Path(__file__).resolve().parent.parent))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        f"autotune: error: {config}:{line_of(config, 'nvme_path')}: zero_optimization.offload_optimizer.nvme_path "
        "'/proc' is a directory this user cannot create files in: offloading to NVMe needs a directory to write to"]
    assert not (tmp_path / "res").exists()


# --- model facts: one rule for model_info and the model info file -----------------------------------------------


FACTS = [
    ({"num_params": 10, "trainable_num_params": 20}, "trainable_num_params", "(20) is more than num_params (10)"),
    ({"num_params": 10, "hidden_size": 0}, "hidden_size", "must be a positive whole number, not 0"),
    ({"num_params": 10, "num_layers": "12"}, "num_layers", "must be a positive whole number, not '12'"),
    ({"num_params": 10, "trainable_num_params": 2.5}, "trainable_num_params",
     "must be a positive whole number, not 2.5"),
    ({"num_params": 10, "activation_mem_per_gpu": -1}, "activation_mem_per_gpu",
     "must be a non-negative number of bytes of at most 10^15, not -1"),
    ({"num_params": 10, "activation_mem_per_gpu": None}, "activation_mem_per_gpu",
     "must be a non-negative number of bytes, not null"),
]


@pytest.mark.parametrize(("facts", "key", "why"), FACTS)
def test_facts_in_a_model_info_file_are_checked_as_the_same_facts_inline(tmp_path, facts, key, why):
    config = write_config(tmp_path, {"model_info": facts})
    with pytest.raises(UserError) as inline:
        request(tmp_path)
    assert inline.value.message == f"model_info.{key} {why}"
    assert inline.value.line == line_of(config, f'"{key}"')

    info = tmp_path / "info.json"
    info.write_text(json.dumps({**facts, "rank": 0}, indent=1))  # `rank`: the engine's own, never refused
    config = write_config(tmp_path, {"model_info_path": "info.json"})
    with pytest.raises(UserError) as named:
        request(tmp_path)
    assert (named.value.path, named.value.line) == (config, line_of(config, "model_info_path"))
    assert named.value.message == f"model_info_path 'info.json' (line {line_of(info, key)}): {key} {why}"


def test_whole_numbers_written_as_json_writes_them_are_the_numbers_they_are(tmp_path):
    """1e3 is a float to JSON's readers; DeepSpeed's docs write sizes so. It was refused as "must be a positive
    whole number, not 1000": now every whole number of the tune's config is taken, handed on as a whole number."""
    text = ('{"train_batch_size": 1.6e1, "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1},\n'
            ' "autotuning": {"enabled": true, "max_train_micro_batch_size_per_gpu": 1e3, "mp_size": 1e0,\n'
            '   "tuner_num_trials": 5e1, "model_info": {"num_params": 1.3e9, "trainable_num_params": 1e9,\n'
            '   "hidden_size": 2.048e3}}}\n')
    write_config(tmp_path, text=text)
    spec = request(tmp_path).spec
    assert spec.base["train_batch_size"] == 16 and type(spec.base["train_batch_size"]) is int
    assert spec.global_batch == 16 and spec.fixed_batch  # kept exactly, as an int train_batch_size is
    assert spec.max_mbs == 16 and spec.trials == 50
    assert spec.facts is not None and (spec.facts["num_params"], spec.facts["trainable"]) == (1_300_000_000, 10**9)
    assert type(spec.facts["num_params"]) is int
    write_config(tmp_path, top={"gradient_accumulation_steps": [1.0, 2e0]})
    assert request(tmp_path).spec.knobs["3"]["gradient_accumulation_steps"] == [1, 2]
    for value, said in (("1.5", "not 1.5"), ("1e300", "(at most 1,000,000,000), not 1e+300")):
        write_config(tmp_path, text=text.replace("1e3", value))
        with pytest.raises(UserError) as e:
            request(tmp_path)
        assert e.value.message.startswith("max_train_micro_batch_size_per_gpu must be a positive whole number")
        assert said in e.value.message


def test_a_tune_file_takes_its_gpu_count_written_as_a_float(tmp_path):
    script_in(tmp_path)
    (tmp_path / "tune.json").write_text(json.dumps({"script": "sub/train.py", "num_gpus": 2.0, "ds_config": {
        "train_micro_batch_size_per_gpu": 1, "autotuning": {"enabled": True}}}))
    req = autotuner.read_tune(str(tmp_path / "tune.json"), [])
    assert req.spec.template["num_gpus"] == 2 and type(req.spec.template["num_gpus"]) is int


# --- the keys that bound the micro-batch size, named at their own line ---------------------------------------------


@pytest.mark.parametrize(("autotuning", "top", "num_gpus", "key", "fragment"), [
    ({"min_train_micro_batch_size_per_gpu": 2, "max_train_batch_size": 1}, {}, None, "max_train_batch_size",
     "max_train_batch_size 1 over 1 data-parallel GPU(s) allows micro-batch sizes up to 1, below "
     "min_train_micro_batch_size_per_gpu 2"),
    ({"min_train_micro_batch_size_per_gpu": 4, "max_train_micro_batch_size_per_gpu": 2}, {}, None,
     "max_train_micro_batch_size_per_gpu", "max_train_micro_batch_size_per_gpu 2 is below "
     "min_train_micro_batch_size_per_gpu 4"),
    ({"max_train_batch_size": 2}, {}, 4, "max_train_batch_size",  # micro-batch 1 on 4 GPUs already makes 4
     "max_train_batch_size 2 is below the 4 data-parallel GPU(s) of each experiment"),
    ({"max_train_batch_size": 16}, {"train_batch_size": 32}, None, "max_train_batch_size",
     "max_train_batch_size 16 is below the config's train_batch_size 32"),
])
def test_a_bound_on_the_micro_batch_size_is_named_at_its_own_line(tmp_path, autotuning, top, num_gpus, key,
                                                                   fragment):
    config = write_config(tmp_path, autotuning, top=top)
    with pytest.raises(UserError) as e:
        request(tmp_path, num_gpus=num_gpus)
    assert e.value.line == line_of(config, f'"{key}"') and e.value.line != line_of(config, '"autotuning"')
    assert e.value.message.startswith(fragment), e.value.message


# --- the node's RAM, said as such ------------------------------------------------------------------------------------


def test_a_tune_whose_node_ram_is_short_says_so_and_not_that_the_gpu_is(tmp_path):
    """10^13 parameters, 10^6 of them trained, everything offloaded: a GPU holds the trained parameters' gradients,
    a node would need 18 TiB of RAM for the parameters. The refusal said micro-batch 1 "needs (0 MiB)" and advised
    larger GPUs."""
    config = write_config(tmp_path, {"model_info": {"num_params": 10**13, "trainable_num_params": 10**6}},
                          zero={"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
                          top={"fp16": {"enabled": True}})
    with pytest.raises(UserError) as e:
        on_this_machine(request(tmp_path, num_gpus=2), directory=tmp_path)
    said = e.value.message
    assert e.value.line == line_of(config, '"num_params"')
    assert "node's RAM" in said and "NVMe" in said and "more RAM" in said, said
    assert "(0 MiB)" not in said and "larger GPUs" not in said and "activations" not in said, said


# --- learned GPU memory needs, placed as stated ones: refused up front -------------------------------------------


@pytest.fixture(scope="module")
def learned(tmp_path_factory):
    """A sweep whose s_x1 held 30 GiB at its peak (the script's own figure), and a hostfile of 24 GB GPUs."""
    base = tmp_path_factory.mktemp("learned")
    spec, _, _ = setup(base, count=3)
    from cli_rig import write_launcher

    launcher = write_launcher(base, REPORTS_PEAK, "reports.sh")
    first = base / "first"
    assert autotune("run", spec, "--slots", "2", "--launcher", launcher, "-o", first, "-q",
                    environ=run_env(base)).returncode == 0
    small = base / "small"
    small.write_text("localhost slots=2 accelerator=cpu gpu=RTX-24GB\n")
    return base, spec, launcher, first, small


@pytest.mark.parametrize("command", ["run", "plan"])
def test_a_learned_need_no_gpu_holds_is_refused_up_front_by_run_and_plan(learned, command):
    """`run` made the results directory, failed s_x1 [placement] and exited 1; `plan` drew a schedule without
    it and exited 0. The same need stated as gpu_memory was refused with exit 2: so is the learned one."""
    base, spec, launcher, first, small = learned
    results = base / f"refused-{command}"
    more = ["--launcher", launcher, "-o", results] if command == "run" else []
    out = autotune(command, spec, "-H", small, "--from", first, *more, environ=run_env(base))
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip().splitlines() == [
        f"autotune: error: {first}: --from: experiment s_x1 needs 30 GiB on each GPU, learned from what its config "
        "held there; the GPUs it may use have 22.4 GiB, 1.1 GiB of it kept free: run it on larger GPUs, or leave it "
        "out"]
    assert out.stdout == "" and not results.exists()


def test_the_api_refuses_a_learned_need_before_it_makes_the_directory(learned):
    base, spec, _, first, small = learned
    sweep, cluster = autotuner.load_sweep([spec]), autotuner.load_cluster(small)
    with pytest.raises(UserError, match="--from: experiment s_x1 needs 30 GiB"):
        autotuner.prepare(sweep, cluster, base / "api", memory_from=autotuner.measured_peaks(first))
    assert not (base / "api").exists()
    with pytest.raises(UserError, match="--from: experiment s_x1"):
        autotuner.plan_sweep(sweep.experiments, cluster.slots, past=first, types=cluster.host_types,
                             sizes=cluster.memory)
    fits = autotuner.load_sweep([spec]).experiments[1:]  # the others held 2 GiB: planned as ever
    assert autotuner.plan_sweep(fits, cluster.slots, past=first, types=cluster.host_types,
                                sizes=cluster.memory).learned_memory == 2
