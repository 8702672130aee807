"""Offload in `autotune tune`'s memory model and search (memory.py, search.py): what a config offloads lands in the
node's RAM, and a model that fits no stage on the GPU is tuned with ZeRO-Offload, least offload first, on a fake GPU
(named as such) whose need is DeepSpeed's accounting, with a fake node RAM: nothing the model rules out for GPU or
host memory is launched."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import autotuner
from autotuner.core.outcome import Outcome
from autotuner.planning.simulate import simulate
from autotuner.states import Reason, State
from autotuner.tune.gridsearch import MicroBatchSearch
from autotuner.tune.memory_model import Facts, Training, bound, host_states, model_states
from autotuner.tune.space import SearchSpec
from autotuner.tune.tuners import search_for

from cli_rig import autotune, env

G = 10**9
GiB = 1 << 30
HALF = Training(half=True)
OO = Training(half=True, offload_optimizer=True)
OP = Training(half=True, offload_optimizer=True, offload_params=True)


@pytest.mark.parametrize(("stage", "training", "expected"), [
    (0, OO, 0.0),  # stage 0 has no partitioned optimizer to offload
    (1, OO, 64 * G), (2, OO, 64 * G), (3, OO, 64 * G),  # 4e9 x (4 copy + 8 Adam + 4 fp32 grads) / 2 ranks x 2
    (3, OP, 72 * G),  # and the fp16 parameters: 4e9 x 2 / 2 x 2
    (2, HALF, 0.0),
])
def test_host_states_per_node_match_the_hand_computed_figures(stage, training, expected):
    assert host_states(4 * G, stage, training, dp=2, local=2) == pytest.approx(expected)


def test_offload_takes_the_states_off_the_gpu_and_counts_frozen_parameters_apart():
    assert model_states(4 * G, 2, OO, dp=2) == pytest.approx(8 * G + 4 * G)  # fp16 parameters, half the gradients
    assert model_states(4 * G, 3, OP, dp=2) == pytest.approx(4 * G)  # the gradients' partition alone
    assert host_states(4 * G, 1, OO, dp=2, local=2, trainable=G) == pytest.approx(16 * G)  # only trained ones


def test_a_config_that_would_exhaust_the_nodes_ram_does_not_fit():
    facts = Facts(4 * G, 1e9)
    fits = bound(facts, OO, 3, 80 * G, dp=2, host_memory=128 * GiB, local=2)
    assert fits.largest == 68 and not fits.host_short  # (76e9 - 4e9 fp16 parameters - 4e9 gradients) / 1e9
    short = bound(facts, OO, 3, 80 * G, dp=2, host_memory=64 * G, local=2)  # 64e9 less headroom < 64e9
    assert short.largest == 0 and short.host_short and short.host == pytest.approx(64 * G)
    assert bound(facts, OO, 3, None, dp=2, host_memory=None, local=2).largest is None  # nothing known


# --- the search, on a fake GPU and a fake node -----------------------------------------------------------------
GPU = 80 * G  # the fake GPU
CONTEXT = 1.5 * G  # what the fake runtime keeps for itself
PARAMS, PER_SAMPLE = 10 * G, 1e9  # 10e9 parameters on 2 GPUs: no stage fits without offload (z3 holds 80e9)
HOST = [256 * GiB]  # the fake node's RAM


def fake_need(config):
    """(GPU bytes, node bytes) of a config: fp16 Adam, 2 ranks on one node, DeepSpeed's accounting."""
    zero = config["zero_optimization"]
    stage, mbs = zero["stage"], config["train_micro_batch_size_per_gpu"]
    oo = (zero.get("offload_optimizer") or {}).get("device") == "cpu"
    op = (zero.get("offload_param") or {}).get("device") == "cpu"
    params, grads, optimizer = 2 * PARAMS, 2 * PARAMS, 12 * PARAMS
    params, grads = (params / 2 if stage >= 3 else params), (grads / 2 if stage >= 2 else grads)
    optimizer = optimizer / 2 if stage >= 1 else optimizer
    host = 0.0
    if oo and stage >= 1:
        host, optimizer = host + (optimizer + 4 * PARAMS / 2) * 2, 0.0
    if op and stage >= 3:
        host, params = host + params * 2, 0.0
    return params + grads + optimizer + PER_SAMPLE * mbs + CONTEXT, host


def speed(config):
    zero = config["zero_optimization"]
    stage, mbs = zero["stage"], config["train_micro_batch_size_per_gpu"]
    slower = 0.6 if "offload_optimizer" in zero else 1.0
    slower *= 0.5 if "offload_param" in zero else 1.0
    return mbs * 100 / (1 + mbs / 64) * (1 - 0.05 * stage) * slower


RAN = {}  # each run's name -> its outcome (simulate's record keeps only the state)


def fake_run(e):
    RAN[e.name] = outcome = _fake_run(e)
    return outcome


def _fake_run(e):
    gpu, host = fake_need(e.ds_config)
    if host > HOST[0]:
        return Outcome(State.FAILED, None, "host memory exhausted (the fake node's)", 137)
    if gpu > GPU:
        return Outcome(State.FAILED, Reason.OOM, "torch.OutOfMemoryError: CUDA out of memory", 1)
    if e.ds_config.get("autotuning", {}).get("model_info", {}).get("profile"):
        mbs = e.ds_config["train_micro_batch_size_per_gpu"]
        return Outcome(State.SUCCEEDED, metrics={"num_params": PARAMS, "activation_mem_per_gpu": PER_SAMPLE * mbs})
    return Outcome(State.SUCCEEDED, metrics={"throughput": speed(e.ds_config)})


def spec(**changes):
    base = dict(prefix="t", template={"script": "/x/train.py", "num_gpus": 2, "num_nodes": 1, "args": []},
                base={"fp16": {"enabled": True}, "zero_optimization": {}}, stages=(0, 1, 2, 3),
                metric="throughput", max_mbs=256, confirm=0, gpu_memory=GPU, host_memory=HOST[0],
                facts=Facts(PARAMS, PER_SAMPLE).to_json())
    return SearchSpec(**(base | changes))


def tune(search, slots=4):
    return sorted(simulate([], {"h": list(range(slots))}, lambda e: 10.0, outcome=fake_run, searcher=search,
                           metric="throughput").played, key=lambda p: (p.start, p.name))


def best(played):
    return max((p for p in played if p.state == State.SUCCEEDED), key=lambda p: RAN[p.name].metrics["throughput"])


@pytest.mark.parametrize("tuner", ["gridsearch", "random", "model_based"])
def test_a_model_that_fits_no_stage_is_tuned_with_the_optimizer_offloaded(tuner):
    """The model skips every stage without offload: nothing runs there; with the optimizer offloaded no run
    exhausts the node, none runs out of GPU memory below the model's largest size (z1 36, z2 46, z3 56: only its
    probes past it may), and the best is the fastest that fits: z3 near its largest (the fake's is 58)."""
    played = tune(search_for(spec(tuner=tuner)))
    predicted = {1: 36, 2: 46, 3: 56}
    assert played and all(p.name.endswith("_oo") for p in played)
    assert all(RAN[p.name].reason == Reason.OOM and int(p.name.split("_")[2][3:]) > predicted[place(p.name)]
               for p in played if p.state != State.SUCCEEDED)
    assert not any("_op" in p.name for p in played)  # least offload first: the parameters stay on the GPU
    if tuner == "gridsearch":
        assert place(best(played).name) == 3 and int(best(played).name.split("_")[2][3:]) >= 56


def place(name):
    return int(name.split("_")[1][1:])


def test_a_node_too_small_for_the_offloaded_states_launches_nothing():
    """160e9 of offloaded optimizer states on a node of 150 GiB: no level fits, nothing runs."""
    assert tune(MicroBatchSearch(spec(host_memory=150 * GiB))) == []


def test_without_a_memory_model_the_ooms_at_every_stage_lead_to_offload():
    """Nothing known: every stage's smallest size runs out of memory, then the optimizer is offloaded, and the
    best is found as the GPU memory walk finds it (the fake runtime's exact largest, 58)."""
    played = tune(MicroBatchSearch(spec(gpu_memory=None, host_memory=None, facts=None)))
    plain = [p for p in played if not p.name.endswith("_oo")]
    assert plain and all(RAN[p.name].reason == Reason.OOM for p in plain)
    assert any(p.name.startswith("t_z2_mbs1") for p in plain)  # its OOM rules out z0 and z1 (they need more)
    assert best(played).name == "t_z3_mbs58_oo" and not any("_op" in p.name for p in played)


@pytest.mark.parametrize("tuner", ["random", "model_based"])
def test_a_sampling_tuner_without_a_memory_model_goes_on_to_offload_when_every_point_ran_out_of_memory(tuner):
    """Nothing known: the sampling tuners draw points until every stage's smallest size ran out of memory (a
    larger one is then never drawn), then go on with the optimizer offloaded, as gridsearch does, and end with a
    best among the offloaded configs."""
    played = tune(search_for(spec(gpu_memory=None, host_memory=None, facts=None, tuner=tuner, seed=2)))
    plain = [p for p in played if not p.name.endswith(("_oo", "_op"))]
    offloaded = [p for p in played if p.name.endswith("_oo")]
    assert plain and all(RAN[p.name].reason == Reason.OOM for p in plain)
    assert offloaded and all(p.start >= max(q.end for q in plain) for p in offloaded)  # the plain level first
    assert best(played).name.endswith("_oo") and not any("_op" in p.name for p in played)


def test_model_based_offloaded_rebuilt_from_the_ledger_goes_on_the_same():
    """model_based: die after some offloaded runs ended, rebuild from the ledger, go on: the same runs as a search
    never interrupted (its study holds the offloaded level's trials only, in both)."""
    def fresh():
        return search_for(spec(gpu_memory=None, host_memory=None, facts=None, tuner="model_based", seed=4))

    whole = [p.name for p in tune(fresh(), slots=2)]  # one experiment (of 2 GPUs) at a time
    live = fresh()
    ledger, ended = [], {}
    while sum(name.endswith("_oo") for name in ended) < 3:
        ledger.extend(live.propose(2, 0.0))
        e = next(x for x in ledger if x.name not in ended)
        out = fake_run(e)
        ended[e.name] = (out.state, out.reason, (out.metrics or {}).get("throughput"))
        live.observe(type("R", (), {"experiment": e})(), out)
    rebuilt = fresh()
    rebuilt.replay(ledger, ended)
    assert rebuilt.spec == live.spec and rebuilt.points == live.points and rebuilt.proposed == live.proposed
    rest = sorted(simulate([], {"h": [0, 1]}, lambda e: 10.0, outcome=fake_run, searcher=rebuilt,
                           metric="throughput").played, key=lambda p: (p.start, p.name))
    assert [*ended, *(p.name for p in rest)] == whole


def test_parameters_are_offloaded_only_when_the_optimizer_alone_is_not_enough():
    global PARAMS
    kept = PARAMS, HOST[0]
    # z3 with the optimizer offloaded holds 76e9 + 1.5e9: no size fits; with the parameters too, 38e9
    PARAMS, HOST[0] = 38 * G, 2048 * GiB
    try:
        played = tune(MicroBatchSearch(spec(facts=Facts(PARAMS, PER_SAMPLE).to_json(), host_memory=HOST[0])))
    finally:
        PARAMS, HOST[0] = kept
    assert played and all(p.name.endswith("_op") for p in played)  # z1, z2 with the optimizer off: no size fits
    assert all(int(p.name.split("_")[2][3:]) > 38 for p in played if p.state != State.SUCCEEDED)  # probes only
    assert place(best(played).name) == 3  # (76e9 - 38e9 of gradients) / 1e9 = 38 predicted, 40 by the fake


def test_an_offloaded_search_rebuilt_from_the_ledger_goes_on_the_same():
    """Die after some offloaded runs ended, rebuild from the ledger, go on: the same runs as a search never
    interrupted (the level is read back from the experiments' configs)."""
    whole = [p.name for p in tune(MicroBatchSearch(spec(gpu_memory=None, facts=None)), slots=2)]
    live = MicroBatchSearch(spec(gpu_memory=None, facts=None))
    ledger, ended = [], {}
    while len(ended) < 7:
        ledger.extend(live.propose(2, 0.0))
        e = next(x for x in ledger if x.name not in ended)
        out = fake_run(e)
        ended[e.name] = (out.state, out.reason, (out.metrics or {}).get("throughput"))
        live.observe(type("R", (), {"experiment": e})(), out)
    assert any(name.endswith("_oo") for name in ended)
    rebuilt = MicroBatchSearch(spec(gpu_memory=None, facts=None))
    rebuilt.replay(ledger, ended)
    assert rebuilt.spec == live.spec and rebuilt.stages == live.stages and rebuilt.proposed == live.proposed
    running = [e for e in ledger if e.name not in ended]
    rest = sorted(simulate(running, {"h": [0, 1]}, lambda e: 10.0, outcome=fake_run, searcher=rebuilt,
                           metric="throughput").played, key=lambda p: (p.start, p.name))
    assert [*ended, *(p.name for p in rest)] == whole


# --- from the command line, on the stand-in launcher (oom_standin.sh) with a fake GPU -------------------------
ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "oom_standin.sh"
# 2e8 parameters, 1e7 bytes of activations a sample, a fake GPU of 2e9 (the hostfile's X-2GB), 5e8 kept by the
# runtime. By hand, on 2 GPUs, fp16 Adam: z3 holds 1.6e9 of model states and z0-z2 more, past the 0.93e9 the model
# lends of a 2 GB GPU (1 GiB of headroom): nothing fits without offload. With the optimizer offloaded z1 holds
# 0.8e9, z2 0.6e9, z3 0.4e9 (the model's largest sizes 13, 33, 53; the stand-in's 70, 90, 110 below its 2e9: the
# model is low and raised by runs that fit), and the node holds 3.2e9 of offloaded states: within this machine's RAM.
MODEL = "2e8 1e7 2e9"


def cli_setup(tmp_path, num_params):
    (tmp_path / "train.py").write_text("# stand-in: the launcher never runs it\n")
    ds = {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True},
          "optimizer": {"type": "Adam", "params": {"lr": 1e-4}}, "zero_optimization": {"stage": [0, 1, 2, 3]},
          "autotuning": {"enabled": True, "metric": "throughput", "max_train_micro_batch_size_per_gpu": 64,
                         "model_info": {"num_params": num_params, "activation_mem_per_gpu": 10**7}}}
    (tmp_path / "ds.json").write_text(json.dumps(ds, indent=1))
    (tmp_path / "hostfile").write_text("localhost slots=4 gpu=X-2GB\n")
    return env(OOM_STANDIN_LOG=tmp_path / "launches.log", OOM_STANDIN_MODEL=MODEL, OOM_STANDIN_CONTEXT="5e8")


def cli_tune(tmp_path, environ):
    return autotune("tune", "--hostfile", tmp_path / "hostfile", "--num_gpus", "2", "-o", tmp_path / "res",
                    "--launcher", f"sh {STANDIN}", "train.py", "--deepspeed_config", "ds.json",
                    environ=environ, cwd=tmp_path, timeout=300)


def test_a_stand_in_tune_where_nothing_fits_without_offload_ends_with_the_fastest_offload_config(tmp_path):
    result = cli_tune(tmp_path, cli_setup(tmp_path, 200_000_000))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = (tmp_path / "launches.log").read_text().splitlines()
    assert lines and all('offload_optimizer={"device": "cpu"}' in line for line in lines)  # nothing without
    assert not any("offload_param" in line for line in lines)  # the optimizer alone was enough
    states = {a.name: a for a in autotuner.snapshot(tmp_path / "res").attempts}
    assert all(a.state.value == "succeeded" for a in states.values()), states  # no OOM, no node exhausted
    # the stand-in's fastest that fits: every stage fits the largest size allowed, 64, and z1 is the fastest stage
    assert "best: train_z1_mbs64_oo" in result.stdout, result.stdout


def test_a_tune_whose_offloaded_states_exceed_the_nodes_ram_is_refused(tmp_path):
    """2e12 parameters: 32e12 bytes of offloaded optimizer states, more than this machine has: one line."""
    result = cli_tune(tmp_path, cli_setup(tmp_path, 2 * 10**12))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "ds.json:" in result.stderr and "even with offload" in result.stderr and "node's RAM" in result.stderr
    assert not (tmp_path / "launches.log").exists()


# --- real DeepSpeed on CPU -------------------------------------------------------------------------------------
SCRIPT = """
import json, sys
import torch, deepspeed
from autotuner.tune.gridsearch import MicroBatchSearch
from autotuner.tune.space import SearchSpec
deepspeed.init_distributed(dist_backend="gloo")
spec = SearchSpec(prefix="t", template={"script": "x.py", "num_gpus": 1, "num_nodes": 1, "args": []},
                  base={"zero_force_ds_cpu_optimizer": False, "gradient_accumulation_steps": 1,
                        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}}},
                  stages=(0, 1, 2, 3), metric="throughput")
search = MicroBatchSearch(spec)
assert search.escalate()  # as when nothing fits without offload
done = []
for stage in (1, 2, 3):
    config = search.experiment(stage, 2).ds_config
    torch.manual_seed(stage)  # the same start every run; the target, 1, far from it: Adam's steps bring it closer
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    losses = []
    for _ in range(3):
        loss = (engine(torch.ones(2, 8)) - 1).pow(2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    done.append({"stage": stage, "name": search.experiment(stage, 2).name, "zero": config["zero_optimization"],
                 "offload": engine.zero_cpu_offload(), "steps": engine.global_steps, "losses": losses})
print("RESULT " + json.dumps(done))
"""


@pytest.mark.deepspeed
def test_deepspeed_trains_with_the_optimizer_offloaded_as_the_search_configures_it(tmp_path):
    """The configs of the search's first offload level, run by real DeepSpeed on its CPU accelerator: the engine
    says the optimizer is offloaded (ZeRO-Offload's CPU path), and its steps train (the loss goes down)."""
    environ = os.environ | {"DS_ACCELERATOR": "cpu", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533",
                            "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=environ, timeout=600,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    done = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert [d["stage"] for d in done] == [1, 2, 3]
    for d in done:
        assert d["name"].endswith("_oo") and d["zero"]["offload_optimizer"] == {"device": "cpu"}, d
        assert d["offload"] and d["steps"] == 3 and d["losses"][-1] < d["losses"][0], d


@pytest.mark.parametrize("problem", ["missing", "file"])
def test_an_nvme_offload_path_this_machine_cannot_write_to_is_one_located_line(tmp_path, problem):
    environ = cli_setup(tmp_path, 200_000_000)
    target = tmp_path / "nvme"
    if problem == "file":
        target.write_text("not a directory\n")
    ds = json.loads((tmp_path / "ds.json").read_text())
    ds["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": str(target)}
    (tmp_path / "ds.json").write_text(json.dumps(ds, indent=1))
    line = next(n for n, text in enumerate((tmp_path / "ds.json").read_text().splitlines(), 1) if "nvme_path" in text)
    result = cli_tune(tmp_path, environ)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    said = [text for text in result.stderr.splitlines() if "nvme_path" in text]
    assert len(said) == 1 and f"ds.json:{line}" in said[0], result.stderr
    assert not (tmp_path / "launches.log").exists() and not (tmp_path / "res").exists()
    target.unlink(missing_ok=True)
    target.mkdir()  # a directory it can write to: tuned
    assert cli_tune(tmp_path, environ).returncode == 0


def test_the_memory_note_says_what_the_offload_level_held():
    """The report's line, from a recorded search that went to the optimizer offloaded: its stages' bounds there
    and the node's RAM they hold."""
    from types import SimpleNamespace

    from autotuner.views.summary import memory_note

    recorded = spec().to_json()
    note = memory_note(SimpleNamespace(meta=SimpleNamespace(search=recorded),
                                       attempts=[SimpleNamespace(name="t_z3_mbs56_oo", state=State.SUCCEEDED)]))
    assert "z3 skipped, cannot fit (model states 74.5 GiB)" in note  # 80e9 without offload
    assert "z3_oo up to micro-batch 56 (node RAM 149 GiB of 256 GiB)" in note  # 160e9 offloaded (limits.memory)
    assert "_op" not in note  # not gone to
