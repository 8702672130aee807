"""`autotune tune` over layouts (tune/layout.py): DeepSpeed's automatic tensor parallelism (`tensor_parallel.
autotp_size`) searched with the ZeRO stages, and the script's own knobs (`autotuning.script_knobs`), from the
command line on the stand-in launcher with a fake GPU (oom_standin.sh: AutoTP shards the memory and costs a step
10% per doubling, gradient checkpointing keeps a quarter of the activations and slows a step to 0.75, DeepSpeed's
throughput written as it counts it under TP). Bad layouts are refused in one located line, exit 2, nothing run."""
import json
from dataclasses import replace
from pathlib import Path

import pytest

import autotuner
from autotuner.dashboard.feed import SweepFeed
from autotuner.ledger.store import Ledger
from autotuner.states import State
from autotuner.tune.flops import flops_per_sample
from autotuner.tune.layout import activation_share, checkpointed, layout_of
from autotuner.tune.memory_model import Training, model_states
from autotuner.tune.space import SearchSpec
from autotuner.tune.tuners import search_for

from cli_rig import autotune, env, wait_until
from dashboard_rig import chromium_driver, start_dashboard
from helpers import SWEEP_META, experiment

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "oom_standin.sh"
# 2e9 parameters in fp16 with Adam, 4e9 bytes of activations a sample, GPUs of 80e9 bytes, 4 a run. By the
# stand-in's rule the largest sizes that fit are 11-17 (TP 1), 22-26 (TP 2) and 36 (TP 4): the fastest, TP 4 at
# ZeRO 0 and micro-batch 36, fits no stage without TP.
MODEL = "2e9 4e9 80e9"
INFO = {"num_params": 2_000_000_000, "activation_mem_per_gpu": 4_000_000_000, "num_attention_heads": 32,
        "num_key_value_heads": 8, "hidden_size": 3200, "vocab_size": 31250}


def setup(tmp_path, tp=None, knobs=None, info=None, stages="all", largest=64, gpu="gpu=A100-80GB", **more):
    (tmp_path / "train.py").write_text("# stand-in: the launcher never runs it\n")
    autotuning = {"enabled": True, "metric": "throughput", "max_train_micro_batch_size_per_gpu": largest}
    if info is not None:
        autotuning["model_info"] = info
    if knobs is not None:
        autotuning["script_knobs"] = knobs
    autotuning |= more.pop("autotuning", {})
    ds = {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True},
          "optimizer": {"type": "Adam", "params": {"lr": 1e-4}}, "zero_optimization": {"stage": stages},
          **({"tensor_parallel": tp} if tp is not None else {}), **more, "autotuning": autotuning}
    (tmp_path / "ds.json").write_text(json.dumps(ds, indent=1))
    (tmp_path / "hostfile").write_text(f"localhost slots=4 {gpu}\n")
    return env(OOM_STANDIN_LOG=tmp_path / "launches.log", OOM_STANDIN_MODEL=MODEL)


def tune(tmp_path, environ, *args):
    return autotune("tune", "--hostfile", tmp_path / "hostfile", "--num_gpus", "4", "-o", tmp_path / "res",
                    "--launcher", f"sh {STANDIN}", "train.py", "--deepspeed_config", "ds.json", *args,
                    environ=environ, cwd=tmp_path, timeout=300)


def report(directory, fmt="json"):
    shown = autotune("report", directory, "--format", fmt)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    return json.loads(shown.stdout) if fmt == "json" else shown.stdout


def test_tensor_parallel_is_searched_and_the_fastest_layout_wins_where_no_stage_fits_it_without(tmp_path):
    result = tune(tmp_path, setup(tmp_path, {"autotp_size": "all"}, info=INFO))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "best: train_tp4_z0_mbs36 " in result.stdout
    assert "tp1 z3 up to micro-batch 17" in result.stdout and "tp4 z0 up to micro-batch 35" in result.stdout
    data = report(tmp_path / "res")
    assert {"tensor_parallel.autotp_size", "dp"} <= set(data["parameters"])
    assert {"throughput", "throughput_per_gpu"} <= set(data["metrics"])
    ran = [e for e in data["experiments"] if e["state"] == "succeeded"]
    assert {e["parameters"]["tensor_parallel.autotp_size"] for e in ran} == {1, 2, 4}
    for e in ran:
        tp, dp = e["parameters"]["tensor_parallel.autotp_size"], e["parameters"]["dp"]
        assert tp * dp == 4
        assert e["metrics"]["throughput_per_gpu"] == pytest.approx(e["metrics"]["throughput"] / 4)
        if tp > 1:  # DeepSpeed counts each sample once per TP rank: the samples trained are its figure over TP
            assert e["metrics"]["throughput_deepspeed"] == pytest.approx(tp * e["metrics"]["throughput"])
    oom = sum(1 for e in data["experiments"] if e["reason"] == "oom")
    assert oom * 3 <= len(data["experiments"])
    optimal = json.loads((tmp_path / "res" / "ds_config_optimal.json").read_text())
    assert optimal["tensor_parallel"] == {"autotp_size": 4} and optimal["zero_optimization"]["stage"] == 0
    assert "ds_config_optimal.json" in (tmp_path / "res" / "cmd_optimal.txt").read_text()
    table = report(tmp_path / "res", "table")
    header = next(line for line in table.splitlines() if " name " in line)
    assert " tp " in header and " dp " in header
    assert "dp" in report(tmp_path / "res", "csv").splitlines()[0].split(",")
    summary = (tmp_path / "res" / "summary.txt").read_text()
    assert "z0_tp4" in summary and "train_tp4_z0_mbs36" in summary
    compared = autotune("compare", tmp_path / "res", tmp_path / "res")
    assert compared.returncode == 0, compared.stderr
    assert "tp" in compared.stdout and "dp" in compared.stdout


def test_a_fixed_tp_size_runs_every_candidate_with_it_and_the_report_shows_it(tmp_path):
    result = tune(tmp_path, setup(tmp_path, {"autotp_size": 2}, info=INFO, stages=[3]))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = (tmp_path / "launches.log").read_text().splitlines()
    assert lines and all(line.split()[-1] == "tp2" for line in lines)
    data = report(tmp_path / "res")
    assert all(e["parameters"]["tensor_parallel.autotp_size"] == 2 and e["parameters"]["dp"] == 2
               for e in data["experiments"])
    assert "best: train_z3_mbs26 " in result.stdout  # a fixed size names no layout


def test_gradient_checkpointing_is_searched_as_a_script_knob_and_lets_larger_micro_batches_fit(tmp_path):
    environ = setup(tmp_path, knobs={"--gradient_checkpointing": [False, True]}, info=INFO, stages=[3])
    result = tune(tmp_path, environ)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = (tmp_path / "launches.log").read_text().splitlines()
    assert any(line.endswith(" gc") for line in lines) and any(not line.endswith(" gc") for line in lines)
    # checkpointing keeps a quarter of the activations: 64, the largest allowed, fits with it (17 without)
    assert "best: train_gc1_z3_mbs64 " in result.stdout
    assert "gc0 z3 up to micro-batch 17" in result.stdout
    data = report(tmp_path / "res")
    assert "--gradient_checkpointing" in data["parameters"]
    values = {e["name"]: e["parameters"]["--gradient_checkpointing"] for e in data["experiments"]}
    assert {v for n, v in values.items() if "_gc1_" in n} == {"true"}
    assert {v for n, v in values.items() if "_gc0_" in n} == {"false"}
    assert "--gradient_checkpointing true" in (tmp_path / "res" / "cmd_optimal.txt").read_text()


def test_the_memory_model_shards_with_tp_and_partitions_zero_over_the_data_parallel_group_only():
    half = Training(half=True)
    n = 10**9
    assert model_states(n, 3, half, dp=4) == pytest.approx(16 * n / 4)
    # TP 2 of 4 GPUs: ZeRO 3 over 2 data-parallel GPUs of the halves, 4 bytes a parameter: never 16/8 (issue 6796)
    assert model_states(n, 3, half, dp=2, tp=2) == pytest.approx(16 * n / 4)
    assert model_states(n, 0, half, dp=2, tp=2) == pytest.approx(16 * n / 2)
    assert model_states(n, 0, half, dp=2, tp=2, whole=n / 10) == pytest.approx(16 * (n / 10 + 0.9 * n / 2))
    assert activation_share(1, False, None) == 1.0
    assert 0.29 < activation_share(1 << 20, False, None) < 0.3  # what stays whole on each rank
    assert activation_share(1, True, {"num_layers": 2}) < 0.6


BAD = [
    ({"tp": {"autotp_size": 3}}, "tensor_parallel.autotp_size 3 does not divide the 4 GPU(s) of a node"),
    ({"tp": {"autotp_size": [1, 8]}}, "tensor_parallel.autotp_size 8 is more than the 4 GPU(s) of a node"),
    ({"tp": {"autotp_size": [2, 4]}, "info": {"num_attention_heads": 6, "num_key_value_heads": 6}},
     "autotp_size 4 does not divide the model's 6 attention heads"),
    ({"tp": {"autotp_size": 4}, "info": {"num_attention_heads": 8, "num_key_value_heads": 2}},
     "autotp_size 4 does not divide the model's 2 key value heads"),
    ({"tp": {"autotp_size": 4}, "info": {"hidden_size": 66}}, "does not divide the model's 66 hidden size"),
    ({"tp": {"autotp_size": "two"}}, "tensor_parallel.autotp_size 'two': a size, a list of sizes, or \"all\""),
    ({"tp": {"autotp_size": [2, 0]}}, "a size, a list of sizes"),
    ({"tp": {"autotp_size": []}}, "a size, a list of sizes"),
    ({"tp": {"autotp_size": 1.5}}, "a size, a list of sizes"),
    ({"tp": {"autotp_size": True}}, "a size, a list of sizes"),
    ({"tp": 4}, "tensor_parallel must be an object"),
    ({"tp": {"autotp_size": [1, 2]}, "autotuning": {"mp_size": 2}}, "both split the model"),
    ({"info": {"num_attention_heads": 8, "num_key_value_heads": 3}}, "not a multiple of 3 key-value heads"),
    ({"info": {"num_attention_heads": -2}}, "model_info.num_attention_heads must be a positive whole number"),
    ({"info": {"hf_config": "nowhere/config.json"}}, "hf_config 'nowhere/config.json'"),
    ({"knobs": {"gradient_checkpointing": [True]}}, "script_knobs: 'gradient_checkpointing' is not a script option"),
    ({"knobs": {"--deepspeed_config": ["a.json"]}}, "--deepspeed_config is the option the config is handed to"),
    ({"knobs": {"--local_rank": [0]}}, "--local_rank is DeepSpeed's launcher's own"),
    ({"knobs": {"--bs": [1, 2]}, "autotuning": {"arg_mappings": {"train_micro_batch_size_per_gpu": "--bs"}}},
     "--bs is set by arg_mappings from the config"),
    ({"knobs": {"--gradient_checkpointing": []}}, "--gradient_checkpointing needs a non-empty list of values"),
    ({"knobs": {"--gradient_checkpointing": True}}, "needs a non-empty list of values, not true"),
    ({"knobs": {"--seed": [None]}}, "every value must be a number, a boolean or a non-empty string"),
    ({"knobs": {"--seed": [""]}}, "every value must be a number, a boolean or a non-empty string"),
    ({"knobs": {"--seed": [{"a": 1}]}}, "every value must be a number"),
    ({"knobs": ["--seed"]}, "script_knobs must be an object"),
]


@pytest.mark.parametrize(("given", "message"), BAD, ids=[m[:40] for _, m in BAD])
def test_a_layout_that_cannot_work_is_refused_at_its_line(tmp_path, given, message):
    setup(tmp_path, given.get("tp"), given.get("knobs"), given.get("info"), autotuning=given.get("autotuning", {}))
    with pytest.raises(autotuner.UserError) as refused:
        autotuner.read_tune("train.py", ["--deepspeed_config", "ds.json"], num_gpus=4, cwd=tmp_path)
    assert message in str(refused.value) and str(refused.value.path) == str(tmp_path / "ds.json")
    assert refused.value.line is not None


@pytest.mark.parametrize(("given", "message"), [BAD[0], BAD[2], BAD[15], BAD[19]],
                         ids=["tp-gpus", "tp-heads", "knob-unknown", "knob-empty"])
def test_the_command_line_refuses_a_bad_layout_in_one_line_and_runs_nothing(tmp_path, given, message):
    environ = setup(tmp_path, given.get("tp"), given.get("knobs"), given.get("info"))
    result = tune(tmp_path, environ)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{tmp_path / 'ds.json'}:" in lines[0] and "Traceback" not in result.stderr
    assert message in lines[0]
    assert not (tmp_path / "launches.log").exists() and not (tmp_path / "res").exists()


def test_a_hugging_face_config_states_the_shape_a_tp_size_must_divide(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(
        {"num_attention_heads": 12, "num_key_value_heads": 4, "hidden_size": 768, "vocab_size": 50257,
         "max_position_embeddings": 1024, "num_hidden_layers": 12}))
    environ = setup(tmp_path, {"autotp_size": "all"}, info={**INFO, "hf_config": "model"})
    spec = autotuner.read_tune("train.py", ["--deepspeed_config", "ds.json"], num_gpus=4, cwd=tmp_path).spec
    assert spec.tp == (1, 2, 4) and spec.shape["num_attention_heads"] == 32  # model_info's own keys win
    setup(tmp_path, {"autotp_size": "all"}, info={"hf_config": "model"})
    spec = autotuner.read_tune("train.py", ["--deepspeed_config", "ds.json"], num_gpus=4, cwd=tmp_path).spec
    assert spec.tp == (1, 2, 4) and spec.shape == {"num_attention_heads": 12, "num_key_value_heads": 4,
                                                   "hidden_size": 768, "vocab_size": 50257, "max_positions": 1024,
                                                   "num_layers": 12}
    setup(tmp_path, {"autotp_size": 4}, info={"hf_config": "model/config.json", "num_key_value_heads": 2})
    refused = tune(tmp_path, environ)
    assert refused.returncode == 2 and "does not divide the model's 2 key value heads" in refused.stderr


def test_every_lane_is_read_back_from_its_experiment_as_resume_replays_it():
    from autotuner.tune.space import SearchSpec
    from autotuner.tune.tuners import search_for

    spec = SearchSpec(prefix="t", template={"script": "/x/train.py", "args": ["--gradient_checkpointing", "false"],
                                            "num_gpus": 4, "num_nodes": 1}, base={"tensor_parallel": {"tp_overlap_comm":
                                                                                                        True}},
                      stages=(1, 3), metric="throughput", tp=(1, 2),
                      script_knobs={"--gradient_checkpointing": [False, True]})
    search = search_for(spec)
    names = set()
    for lane in spec.lanes:
        e = search.experiment(lane, 4)
        assert search.place_of(e) == (lane, 4) and e.name == search.name_of(lane, 4)
        assert e.ds_config["tensor_parallel"] == {"tp_overlap_comm": True, "autotp_size": spec.tp_of(lane)}
        assert e.args.count("--gradient_checkpointing") == 1  # the user's own value replaced, never doubled
        names.add(e.name)
    assert names == {f"t_tp{tp}_gc{gc}_z{z}_mbs4" for tp in (1, 2) for gc in (0, 1) for z in (1, 3)}
    # a smaller TP size, or checkpointing off, needs at least the memory of a larger one (or on) at one stage
    tp1_gc0_z1, tp2_gc1_z3 = 1, 3 * 4 + 3
    assert spec.needs_at_least(tp1_gc0_z1, tp2_gc1_z3) and not spec.needs_at_least(tp2_gc1_z3, tp1_gc0_z1)


def test_the_loop_learns_checkpointing_from_its_own_runs_and_tp_through_its_share():
    from autotuner.states import State
    from autotuner.tune.space import SearchSpec
    from autotuner.tune.tuners import search_for

    spec = SearchSpec(prefix="t", template={"script": "/x/train.py", "num_gpus": 4, "num_nodes": 1},
                      base={"fp16": {"enabled": True}}, stages=(2, 3), metric="throughput", gpu_memory=80 * 10**9,
                      facts={"num_params": 2 * 10**9, "activation": 4e9}, tp=(1, 2),
                      script_knobs={"--gradient_checkpointing": [False, True]})
    search = search_for(spec)
    lane = {(tp, gc, z): spec.lanes.index(i) for i in spec.lanes for tp, gc, z in
            [(spec.tp_of(i), spec.layouts[i // 4][1][0][1], i % 4)]}
    lane = {key: spec.lanes[index] for key, index in lane.items()}
    states = search._states(search.facts)
    predicted = {key: search.stages[i].predicted for key, i in lane.items()}
    # checkpointing kept twice what the model guessed: its z3 run's peak says so, and its z2 is bounded by it
    measured = 2 * 4e9 * spec.share(1)
    search.learn(search.take(lane[1, True, 3], 40), State.SUCCEEDED, None, 100.0,
                 int(states[lane[1, True, 3]] + 40 * measured))
    assert search._by_layout()[1] == pytest.approx(measured)
    assert search.stages[lane[1, True, 2]].predicted < predicted[1, True, 2]
    assert search.model() == search.facts  # a checkpointed layout teaches itself alone
    # TP 2's peak shows 1.5 times the activations it was given: every other layout's bound follows, through shares
    measured = 1.5 * 4e9 * spec.share(2)
    search.learn(search.take(lane[2, False, 3], 10), State.SUCCEEDED, None, 100.0,
                 int(states[lane[2, False, 3]] + 10 * measured))
    assert search.model().activation == pytest.approx(1.5 * 4e9)
    assert search.stages[lane[1, False, 3]].predicted < predicted[1, False, 3]


def rounds_of_a_checkpointing_search(throughput):
    """The rounds a search of `--gradient_checkpointing` at one stage, sizes 4 to 8, on two slots, proposes when
    each (checkpointing, size) measures `throughput(checkpointing, size)` (test_hf_trainer.py's tune)."""
    spec = SearchSpec(prefix="t", template={"script": "/x/train.py", "num_gpus": 1, "num_nodes": 1},
                      base={"gradient_accumulation_steps": 1}, stages=(1,), metric="throughput", min_mbs=4,
                      max_mbs=8, measure=2, confirm=0, script_knobs={"--gradient_checkpointing": [False, True]})
    search = search_for(spec)
    rounds = []
    while proposed := search.propose(2, 0.0):
        places = [search.place_of(e) for e in proposed]
        rounds.append([(spec.layouts[layout_of(lane)][1][0][1], mbs) for lane, mbs in places])
        for e, (checkpointed_, mbs) in zip(proposed, rounds[-1], strict=True):
            search.learn(e, State.SUCCEEDED, None, throughput(checkpointed_, mbs), None)
    return rounds


def test_checkpointing_off_is_measured_at_the_largest_size_unless_it_could_not_beat_the_best():
    def quiet(checkpointed_, mbs):  # recomputing costs checkpointing a third; larger sizes gain a little
        return (0.7 if checkpointed_ else 1.0) * 100 * mbs / (mbs + 2)

    # the first round is fixed: checkpointing on (the least memory) at the largest, off (the most) at the smallest
    assert rounds_of_a_checkpointing_search(quiet) == [[(True, 8), (False, 4)], [(False, 8)]]
    # off at 4 starved of CPU (a loaded machine): twice its throughput cannot beat on at 8, so 8 is never run
    starved = rounds_of_a_checkpointing_search(lambda c, m: quiet(c, m) * (0.3 if (c, m) == (False, 4) else 1))
    assert starved[0] == [(True, 8), (False, 4)] and all((False, 8) not in r for r in starved)
    # test_hf_trainer.py's tune under load: on at 8 the best, so it measures 6; that run, at a size known to fit,
    # rules nothing out, and off, which could beat it at 8, goes there (it went to 5, below the pending 6, then
    # judged 8 by 4 to 5's flat growth, and never ran it)
    measured = {(True, 8): 35.5, (True, 6): 34.0, (False, 4): 33.0, (False, 5): 33.0, (False, 8): 45.0}
    loaded = rounds_of_a_checkpointing_search(lambda c, m: measured.get((c, m), 30.0))
    assert loaded[:2] == [[(True, 8), (False, 4)], [(True, 6), (False, 8)]], loaded


# --- TFLOPs per GPU, and the layout on the dashboard --------------------------------------------------------------
# The model the stand-in tunes, with what TFLOPs are counted from: 32 layers of hidden 3200, sequences of 2048.
LAYERS, HIDDEN, SEQ = 32, 3200, 2048
COUNTED = {**INFO, "num_layers": LAYERS, "seq_length": SEQ}


def operations(params, checkpointed, trainable=None, layers=LAYERS, hidden=HIDDEN, seq=SEQ):
    """A sample's operations written out as the papers state them: 6N + 12·L·h·s a token (PaLM, appendix B), the
    forward pass once more with checkpointing (8N + 16·L·h·s), frozen weights without their gradient (4N + 2T)."""
    trainable = params if trainable is None else trainable
    weights = (8 if checkpointed else 6) * params - 2 * (params - trainable)
    return seq * (weights + (16 if checkpointed else 12) * layers * hidden * seq)


def test_a_samples_operations_are_the_published_figures_and_absent_without_the_facts():
    # GPT-3 175B as Narayanan et al. 2021 count it (N = 12·L·h² + V·h): 72·s·L·h²·(1 + s/6h + V/12Lh) a sample, and
    # with recomputation 96·s·L·h²·(1 + s/6h + V/12Lh) (the logits recomputed too).
    layers, hidden, seq, vocab = 96, 12288, 2048, 51200
    n = 12 * layers * hidden**2 + vocab * hidden
    shape = {"num_layers": layers, "hidden_size": hidden, "seq_length": seq}
    megatron = seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (12 * hidden * layers))
    assert flops_per_sample(n, None, shape, False) == pytest.approx(72 * megatron)
    assert flops_per_sample(n, None, shape, True) == pytest.approx(96 * megatron)
    # The paper's estimate for it: 300 billion tokens on 1,024 GPUs at 140 TFLOP/s each take 34 days (8·N a token,
    # the attention left out: it adds 3% here)
    days = 300e9 / seq * flops_per_sample(n, None, shape, True) / (1024 * 140e12) / 86400
    assert days == pytest.approx(34, rel=0.04)
    # LoRA: 7B parameters, 4M of them trained: 4N + 2T (the frozen weights get no gradient of their own)
    assert flops_per_sample(7 * 10**9, 4 * 10**6, shape, False) == pytest.approx(
        operations(7 * 10**9, False, 4 * 10**6, layers, hidden, seq))
    for lacking in ("num_layers", "hidden_size", "seq_length"):  # absent, not zero, not guessed
        assert flops_per_sample(n, None, {k: v for k, v in shape.items() if k != lacking}, False) is None
    assert flops_per_sample(n, None, None, False) is None
    # Checkpointing on the command line: a knob's value or the script's own argument, a flag alone, the last said
    on = (["--gradient_checkpointing", "true"], ["--gradient_checkpointing=True"], ["--gradient_checkpointing"],
          ["--gradient_checkpointing", "--bf16"], ["--activation_checkpointing", "1"], ["--use_gradient_checkpointing"],
          ["--gradient_checkpointing", "false", "--gradient_checkpointing", "true"])
    off = ([], ["--gradient_checkpointing", "false"], ["--gradient_checkpointing=0"], ["--resume_from_checkpoint"],
           ["--resume_from_checkpoint", "out/checkpoint-500"], ["--save_checkpoint", "true"],
           ["--gradient_checkpointing", "true", "--gradient_checkpointing", "false"], ["gradient_checkpointing"])
    assert all(checkpointed(args) for args in on) and not any(checkpointed(args) for args in off)


@pytest.fixture(scope="module")
def layouts_tuned(tmp_path_factory):
    """TP 1 and 2, with gradient checkpointing off and on, ZeRO 3: a tune whose model_info states what TFLOPs are
    counted from."""
    tmp = tmp_path_factory.mktemp("layouts")
    environ = setup(tmp, {"autotp_size": [1, 2]}, knobs={"--gradient_checkpointing": [False, True]}, info=COUNTED,
                    stages=[3], largest=16)
    result = tune(tmp, environ)
    assert result.returncode == 0, result.stdout + result.stderr
    return tmp / "res"


def test_each_candidates_tflops_per_gpu_is_in_every_report_format(layouts_tuned, tmp_path):
    data = report(layouts_tuned)
    assert "tflops_per_gpu" in data["metrics"]
    ran = [e for e in data["experiments"] if e["state"] == "succeeded"]
    assert {(e["parameters"]["tensor_parallel.autotp_size"], e["parameters"]["--gradient_checkpointing"])
            for e in ran} == {(1, "false"), (1, "true"), (2, "false"), (2, "true")}
    for e in ran:  # the samples trained a second (DeepSpeed's figure over TP) times a sample's operations, per GPU
        expected = e["metrics"]["throughput"] * operations(2e9, e["parameters"]["--gradient_checkpointing"] == "true")
        assert e["metrics"]["tflops_per_gpu"] == pytest.approx(expected / 4 / 1e12)
    best = next(e for e in ran if e["best"])
    figure = best["metrics"]["tflops_per_gpu"]
    csv_lines = report(layouts_tuned, "csv").splitlines()
    head = csv_lines[0].split(",")
    row = next(line.split(",") for line in csv_lines if line.split(",")[2] == best["name"])
    assert float(row[head.index("tflops_per_gpu")]) == pytest.approx(figure)
    markdown = report(layouts_tuned, "md").splitlines()
    assert "tflops_per_gpu" in markdown[0]
    table = report(layouts_tuned, "table")
    assert "tflops_per_gpu" in next(line for line in table.splitlines() if " name " in line)
    page = tmp_path / "page.html"
    shown = autotune("report", layouts_tuned, "--html", page)
    assert shown.returncode == 0, shown.stderr
    html = page.read_text()
    assert "tflops_per_gpu" in html and f'data-v="{figure!r}"' in html


def test_tflops_come_from_a_profile_runs_count_and_are_absent_without_the_sequence_length(tmp_path):
    # No num_params: the profile run counts them, 2e9 of which 1e8 train (LoRA-like): 4N + 2T
    profiled = tmp_path / "profiled"
    profiled.mkdir()
    environ = setup(profiled, info={k: v for k, v in COUNTED.items() if k not in ("num_params",
                                                                                  "activation_mem_per_gpu")},
                    stages=[3], largest=4)
    environ["OOM_STANDIN_MODEL"] = f"{MODEL} 1e8"
    result = tune(profiled, environ)
    assert result.returncode == 0, result.stdout + result.stderr
    ran = [e for e in report(profiled / "res")["experiments"] if e["metrics"].get("throughput")]
    assert ran and all(e["metrics"]["tflops_per_gpu"] == pytest.approx(
        e["metrics"]["throughput"] * operations(2e9, False, 1e8) / 4 / 1e12) for e in ran)
    # A Hugging Face config states the longest sequence the model takes, not the one trained on: no figure made up
    unknown = tmp_path / "unknown"
    (unknown / "model").mkdir(parents=True)
    (unknown / "model" / "config.json").write_text(json.dumps(
        {"num_attention_heads": 32, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
         "max_position_embeddings": 131072}))
    environ = setup(unknown, info={"num_params": 2_000_000_000, "activation_mem_per_gpu": 4_000_000_000,
                                   "hf_config": "model"}, stages=[3], largest=4)
    result = tune(unknown, environ)
    assert result.returncode == 0, result.stdout + result.stderr
    data = report(unknown / "res")
    assert "tflops_per_gpu" not in data["metrics"]
    assert all("tflops_per_gpu" not in e["metrics"] for e in data["experiments"])
    assert "tflops_per_gpu" not in report(unknown / "res", "csv").splitlines()[0]


def test_the_dashboards_feed_shows_the_layout_and_tflops_as_the_report_does(layouts_tuned):
    data = report(layouts_tuned)
    feed = SweepFeed(layouts_tuned)
    assert feed.refresh()
    sent = feed.changes(-1)
    for column in ("param:tensor_parallel.autotp_size", "param:dp", "param:--gradient_checkpointing",
                   "metric:throughput_per_gpu", "metric:tflops_per_gpu"):
        assert column in sent.columns, (column, sent.columns)
    rows = {r[0]: dict(zip(sent.columns, r, strict=True)) for r in sent.rows}
    for e in data["experiments"]:
        row = rows[e["name"]]
        for key in ("tensor_parallel.autotp_size", "dp", "--gradient_checkpointing"):
            assert row[f"param:{key}"] == e["parameters"][key]
        assert row["metric:tflops_per_gpu"] == pytest.approx(e["metrics"].get("tflops_per_gpu"))


def test_the_dashboards_page_shows_each_candidates_layout_and_tflops(layouts_tuned, runners, tmp_path):
    data = {e["name"]: e for e in report(layouts_tuned)["experiments"]}
    shown = start_dashboard(runners, layouts_tuned)
    browser = chromium_driver(tmp_path / "profile", width=1400, height=1000)
    try:
        (sid,) = shown.sweep_ids()
        browser.get(f"{shown.base}/?token={shown.token}#/s/{sid}")
        wait_until(lambda: browser.execute_script(
            "return document.querySelectorAll('#experiments tbody tr').length") == len(data), timeout=60,
            message="every experiment in the table")
        table = browser.execute_script("""
            const heads = [...document.querySelectorAll('#experiments th')].map((h) => h.dataset.col);
            return [...document.querySelectorAll('#experiments tbody tr')].map((tr) =>
              Object.fromEntries([...tr.cells].map((td, i) => [heads[i], td.textContent])));""")
    finally:
        browser.quit()
    assert {"param:tensor_parallel.autotp_size", "param:dp", "param:--gradient_checkpointing",
            "metric:tflops_per_gpu"} <= set(table[0])
    for row in table:
        e = data[row["name"]]
        assert int(row["param:tensor_parallel.autotp_size"]) == e["parameters"]["tensor_parallel.autotp_size"]
        assert int(row["param:dp"]) == e["parameters"]["dp"]
        assert row["param:--gradient_checkpointing"] == e["parameters"]["--gradient_checkpointing"]
        assert float(row["metric:tflops_per_gpu"].replace(",", "")) == pytest.approx(
            e["metrics"]["tflops_per_gpu"], abs=0.06)


def test_a_live_tunes_page_gets_the_layout_of_each_new_candidate_and_tflops_once_the_profile_run_counted(tmp_path):
    """The feed as a tune fills the ledger: candidates proposed after the page's first read carry their layout, and
    when the profile run's count arrives every row already sent is sent again with its TFLOPs."""
    spec = SearchSpec(prefix="t", template={"script": "/x/train.py", "args": [], "num_gpus": 4, "num_nodes": 1},
                      base={}, stages=(3,), metric="throughput", gpu_memory=80 * 10**9, tp=(1, 2),
                      shape={"num_layers": LAYERS, "hidden_size": HIDDEN, "seq_length": SEQ})
    ledger = Ledger.create(tmp_path, replace(SWEEP_META, search=spec.to_json()))

    def ran(name, tp, metrics, at, gpus=4):
        ledger.add_experiments([experiment(name, num_gpus=gpus, script="/x/train.py", ds_config={
            "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3},
            "tensor_parallel": {"autotp_size": tp}})], at=at)
        ledger.start(name, 1, slots={"localhost": [0]}, tag=f"sid.{name}.1", dir=str(tmp_path / name), at=at)
        if metrics is not None:
            ledger.finish(name, 1, State.SUCCEEDED, at + 1, exit_code=0, metric=metrics.get("throughput"),
                          metrics=metrics)

    ran("t_profile", 1, None, 1.0)  # running: no count yet
    ran("t_tp1_z3_mbs2", 1, {"throughput": 100.0}, 3.0)
    feed = SweepFeed(tmp_path)
    assert feed.refresh()
    first = feed.changes(-1)
    assert "param:dp" in first.columns and "metric:tflops_per_gpu" not in first.columns
    ledger.finish("t_profile", 1, State.SUCCEEDED, 4.0, exit_code=0, metrics={"num_params": 2e9})
    ran("t_tp2_z3_mbs2", 2, {"throughput": 80.0}, 5.0)
    ran("t_g2_tp2_z3_mbs2", 2, {"throughput": 50.0}, 7.0, gpus=2)  # a world size of its own (tune --num_gpus 2,4)
    ledger.close()
    assert feed.refresh()
    later = feed.changes(first.seq)
    assert later.full  # the facts arrived: every row again, not only the new one
    rows = {r[0]: dict(zip(later.columns, r, strict=True)) for r in later.rows}
    assert (rows["t_tp2_z3_mbs2"]["param:tensor_parallel.autotp_size"], rows["t_tp2_z3_mbs2"]["param:dp"]) == (2, 2)
    assert (rows["t_g2_tp2_z3_mbs2"]["param:tensor_parallel.autotp_size"], rows["t_g2_tp2_z3_mbs2"]["param:dp"]) \
        == (2, 1)  # the experiment's own GPUs over TP
    for name, samples, gpus in (("t_tp1_z3_mbs2", 100.0, 4), ("t_tp2_z3_mbs2", 80.0, 4), ("t_g2_tp2_z3_mbs2", 50.0, 2)):
        assert rows[name]["metric:tflops_per_gpu"] == pytest.approx(samples * operations(2e9, False) / gpus / 1e12)
    assert rows["t_profile"]["metric:tflops_per_gpu"] is None
