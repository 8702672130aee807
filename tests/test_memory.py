"""The memory model (autotuner/tune/memory_model.py) against figures computed by hand, and `autotune tune`'s search
with it, driven by the real scheduler on a simulated clock against a fake GPU (named as such) whose memory need is
DeepSpeed-like: model states per ZeRO stage, partitioned over the data-parallel GPUs, plus activations per sample,
plus what CUDA keeps for itself; past the GPU's size a run fails with the runtime's OOM message."""
import pytest

from autotuner.core.outcome import Outcome
from autotuner.planning.simulate import simulate
from autotuner.states import Reason, State
from autotuner.tune.gridsearch import MicroBatchSearch
from autotuner.tune.memory_model import Bound, Facts, Training, bound, budget, model_states
from autotuner.tune.space import SearchSpec
from autotuner.tune.tuners import search_for

G = 10**9


# --- the model, by hand ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("training, dp, expected", [
    # fp32 Adam: 4 B parameters, 4 B gradients, 8 B of Adam states; 1e9 parameters over 4 GPUs
    (Training(), 4, {0: 16 * G, 1: 4 * G + 4 * G + 2 * G, 2: 4 * G + 1 * G + 2 * G, 3: 1 * G + 1 * G + 2 * G}),
    # fp16 / bf16 Adam: 2 B + 2 B, and 12 B (the fp32 copy and Adam's two states) with the optimizer
    (Training(half=True), 4, {0: 16 * G, 1: 2 * G + 2 * G + 3 * G, 2: 2 * G + 0.5 * G + 3 * G, 3: 4 * G}),
    # the optimizer offloaded: its states leave the GPU from stage 1 on; the parameters too at stage 3
    (Training(half=True, offload_optimizer=True, offload_params=True), 4,
     {0: 16 * G, 1: 4 * G, 2: 2.5 * G, 3: 0.5 * G}),
    # SGD with momentum keeps one fp32 state: 4 + 4 + 4
    (Training(optimizer_states=1), 1, {0: 12 * G, 1: 12 * G, 2: 12 * G, 3: 12 * G}),
])
def test_model_states_per_stage_match_the_hand_computed_figures(training, dp, expected):
    for stage, figure in expected.items():
        assert model_states(10**9, stage, training, dp) == pytest.approx(figure)


def test_model_parallelism_divides_the_model_states():
    assert model_states(10**9, 2, Training(half=True), dp=2, mp=2) == pytest.approx((2 + 1 + 6) * G / 2)


@pytest.mark.parametrize("config, expected", [
    ({}, Training()),
    ({"fp16": {"enabled": True}}, Training(half=True)),
    ({"bf16": {"enabled": True}}, Training(half=True)),  # bf16 is half precision, not costed as fp32
    ({"bf16": {"enabled": "auto"}, "fp16": {"enabled": False}}, Training(half=True)),
    ({"optimizer": {"type": "SGD"}}, Training(optimizer_states=1)),
    ({"optimizer": {"type": "AdamW"}}, Training()),
    ({"zero_optimization": {"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "nvme"}}},
     Training(offload_optimizer=True, offload_params=True)),
    ({"zero_optimization": {"offload_optimizer": {"device": "none"}}}, Training()),
])
def test_what_a_config_says_of_its_memory(config, expected):
    assert Training.of(config) == expected


def test_the_largest_micro_batch_per_stage_on_an_80gb_gpu():
    """4e9 parameters in fp16 with Adam on 2 GPUs, 1e9 bytes of activations per sample, an "A100-80GB" (80e9
    bytes, 4e9 of them kept free): stage 0 holds 64e9 of states, stage 1 2+2+6 = 40e9 per GPU... so 12, 36, 40
    and 44 samples fit."""
    facts, half = Facts(4 * 10**9, 1e9), Training(half=True)
    assert budget(80 * G) == 76 * G
    assert [bound(facts, half, stage, 80 * G, dp=2).largest for stage in range(4)] == [12, 36, 40, 44]
    assert bound(Facts(5 * 10**9, 1e9), half, 0, 80 * G, dp=2) == Bound(0, 80 * G, 0)  # cannot fit: 80 > 76
    assert bound(facts, half, 0, 80 * G, dp=2, min_mbs=13).largest == 0  # not even the smallest allowed
    assert bound(Facts(4 * 10**9), half, 1, 80 * G, dp=2).largest is None  # no activation figure: no size


# --- the search with it, on a fake GPU --------------------------------------------------------------------------
GPU = 80 * G  # the fake GPU: what A100-80GB states
CONTEXT = 1.5 * G  # what the fake runtime keeps for itself beyond the model's need
PARAMS, PER_SAMPLE = 4 * 10**9, 1e9
STATES = {0: 64 * G, 1: 40 * G, 2: 36 * G, 3: 32 * G}  # by hand: 4e9 parameters, fp16 Adam, 2 GPUs


def fits(stage, mbs):
    return STATES[stage] + PER_SAMPLE * mbs + CONTEXT <= GPU


def throughput(stage, mbs):
    return mbs * 100 / (1 + mbs / 64) * (1 - 0.05 * stage)


def fake_gpu(e):
    """A run on the fake GPU; the profile run writes the model info DeepSpeed's engine would (at its size)."""
    config = e.ds_config
    stage, mbs = config["zero_optimization"]["stage"], config["train_micro_batch_size_per_gpu"]
    if not fits(stage, mbs):
        return Outcome(State.FAILED, Reason.OOM, "torch.OutOfMemoryError: CUDA out of memory", 1)
    if config.get("autotuning", {}).get("model_info", {}).get("profile"):
        return Outcome(State.SUCCEEDED, metrics={"num_params": PARAMS, "activation_mem_per_gpu": PER_SAMPLE * mbs})
    return Outcome(State.SUCCEEDED, metrics={"throughput": throughput(stage, mbs)})


def spec(**changes):
    base = dict(prefix="t", template={"script": "/x/train.py", "num_gpus": 2, "num_nodes": 1, "args": []},
                base={"fp16": {"enabled": True}}, stages=(0, 1, 2, 3), metric="throughput", max_mbs=256,
                confirm=0, gpu_memory=GPU)
    return SearchSpec(**(base | changes))


def stated(**changes):
    """Facts as model_info states them."""
    return spec(facts=Facts(PARAMS, PER_SAMPLE).to_json(), **changes)


def tune(search, slots=4):
    return sorted(simulate([], {"h": list(range(slots))}, lambda e: 10.0, outcome=fake_gpu, searcher=search,
                           metric="throughput").played, key=lambda p: (p.start, p.name))


def place(name):
    _, z, mbs = name.split("_")[:3]
    return int(z[1:]), int(mbs[3:])


def largest(stage):
    return max(m for m in range(1, 257) if fits(stage, m))


def oom_runs(played):
    return sum(1 for p in played if p.state == State.FAILED)


@pytest.mark.parametrize("tuner", ["gridsearch", "random", "model_based"])
def test_the_model_launches_fewer_runs_out_of_memory_and_finds_the_same_best(tuner):
    without = tune(search_for(spec(gpu_memory=None, tuner=tuner)))
    model = tune(search_for(stated(tuner=tuner)))
    if tuner == "random":  # without a model the stages' order prunes its draws as much (4 OOM runs either way)
        assert oom_runs(model) <= oom_runs(without)
    else:
        assert oom_runs(model) < oom_runs(without)
    best = {p.name for p in without if p.state == State.SUCCEEDED}
    best_model = {p.name for p in model if p.state == State.SUCCEEDED}
    assert max(throughput(*place(n)) for n in best_model) >= max(throughput(*place(n)) for n in best)


def test_with_the_model_the_walk_starts_at_the_prediction_and_finds_the_best_stages_largest_exactly():
    """The others' largest only as near as could beat the best (gridsearch._worth)."""
    played = tune(MicroBatchSearch(stated()))
    ran = {place(p.name): p.state for p in played}
    best = max((place(p.name) for p in played if p.state == State.SUCCEEDED), key=lambda point: throughput(*point))
    assert ran[(best[0], largest(best[0]))] == State.SUCCEEDED and ran[(best[0], largest(best[0]) + 1)] == State.FAILED
    for stage in STATES:
        fit = max(m for (z, m), state in ran.items() if z == stage and state == State.SUCCEEDED)
        assert largest(stage) - largest(stage) // 8 <= fit <= largest(stage)
    firsts = {}
    for p in played:
        firsts.setdefault(place(p.name)[0], place(p.name)[1])
    assert firsts == {0: 12, 1: 36, 2: 40, 3: 44}  # the predicted largest, first
    # at most two OOMs a stage (the probe past the prediction, one in the bisection), against 3-4 without it
    assert oom_runs(played) <= 2 * len(STATES) and oom_runs(played) < oom_runs(tune(MicroBatchSearch(
        spec(gpu_memory=None))))


def test_a_stage_that_cannot_fit_is_never_run():
    """5e9 parameters: stage 0 needs 80e9 of states alone, more than the 76e9 an 80 GB GPU lends."""
    global STATES
    kept = STATES
    STATES = {0: 80 * G, 1: 50 * G, 2: 45 * G, 3: 40 * G}
    try:
        played = tune(MicroBatchSearch(spec(facts=Facts(5 * 10**9, PER_SAMPLE).to_json())))
    finally:
        STATES = kept
    assert played and all(place(p.name)[0] != 0 for p in played)
    without = tune(MicroBatchSearch(spec(gpu_memory=None)))
    assert any(place(p.name)[0] == 0 for p in without)


def test_no_config_above_the_bound_is_launched_before_a_run_at_the_bound_fits():
    """The prediction bounds each stage until a run at it fits; a probe past it follows only then."""
    played = tune(search_for(stated()), slots=1)
    ended: dict[int, set[int]] = {}
    for p in played:
        stage, mbs = place(p.name)
        predicted = {0: 12, 1: 36, 2: 40, 3: 44}[stage]
        if mbs > predicted:
            assert predicted in ended.get(stage, set()), f"{p.name} before the predicted size ran"
        if p.state == State.SUCCEEDED:
            ended.setdefault(stage, set()).add(mbs)


def test_a_model_that_is_low_is_raised_by_what_runs_show():
    """model_info states twice the activations the fake GPU needs: the prediction is low, a probe past it
    fits, and the walk goes on past the prediction to the true largest size."""
    played = tune(MicroBatchSearch(spec(facts=Facts(PARAMS, 2 * PER_SAMPLE).to_json())))
    ran = {place(p.name): p.state for p in played}
    best = max((point for point, state in ran.items() if state == State.SUCCEEDED), key=lambda p: throughput(*p))
    assert ran[(best[0], largest(best[0]))] == State.SUCCEEDED and ran[(best[0], largest(best[0]) + 1)] == State.FAILED
    for stage in STATES:  # the others' largest as near as could beat the best (gridsearch._worth)
        fit = max(m for (z, m), state in ran.items() if z == stage and state == State.SUCCEEDED)
        assert largest(stage) - largest(stage) // 8 <= fit <= largest(stage)


def test_a_model_that_is_high_is_bounded_by_an_oom():
    """Half the activations: the predicted size runs out of memory; the smallest, then a bisection find the
    largest that fits."""
    played = tune(MicroBatchSearch(spec(facts=Facts(PARAMS, PER_SAMPLE / 2).to_json())))
    ran = {place(p.name): p.state for p in played}
    best = max((point for point, state in ran.items() if state == State.SUCCEEDED), key=lambda p: throughput(*p))
    assert ran[(best[0], largest(best[0]))] == State.SUCCEEDED and ran[(best[0], largest(best[0]) + 1)] == State.FAILED
    for stage in STATES:  # the others' largest as near as could beat the best (gridsearch._worth)
        fit = max(m for (z, m), state in ran.items() if z == stage and state == State.SUCCEEDED)
        assert largest(stage) - largest(stage) // 8 <= fit <= largest(stage)


def test_without_gpu_memory_the_model_prunes_nothing_and_no_profile_runs():
    plain = [p.name for p in tune(MicroBatchSearch(spec(gpu_memory=None, base={})))]
    with_facts = [p.name for p in tune(MicroBatchSearch(spec(gpu_memory=None, base={},
                                                             facts=Facts(PARAMS, PER_SAMPLE).to_json())))]
    assert plain == with_facts and not any(n.endswith("_profile") for n in plain)


def test_the_profile_run_comes_first_at_the_smallest_stage_and_size_and_its_facts_bound_the_search():
    played = tune(MicroBatchSearch(spec(stages=(1, 2, 3), min_mbs=2)))
    first = played[0]
    assert first.name == "t_profile" and first.state == State.SUCCEEDED
    assert all(p.start >= first.end for p in played[1:])  # nothing else while it runs
    from_profile = [p.name for p in played[1:]]
    assert from_profile == [p.name for p in tune(MicroBatchSearch(stated(stages=(1, 2, 3), min_mbs=2)))]


def test_the_profile_run_asks_deepspeeds_engine_for_its_model_info_at_the_users_stage():
    search = MicroBatchSearch(spec(stages=(2, 3), min_mbs=4))
    (profile,) = search.propose(8, 0.0)
    assert profile.name == "t_profile"
    assert profile.ds_config["autotuning"]["model_info"] == {"profile": True}
    assert profile.ds_config["zero_optimization"]["stage"] == 2  # the smallest stage tuned, not ZeRO-3
    assert profile.ds_config["train_micro_batch_size_per_gpu"] == 4  # the smallest size, not 1
    assert search.propose(8, 0.0) == []  # nothing more while it runs


def test_a_failed_profile_run_leaves_the_search_without_a_model(caplog):
    def broken(e):
        if e.name.endswith("_profile"):
            return Outcome(State.FAILED, Reason.EXIT, "ValueError: the script broke", 1)
        return fake_gpu(e)

    search = MicroBatchSearch(spec())
    played = sorted(simulate([], {"h": [0, 1, 2, 3]}, lambda e: 10.0, outcome=broken, searcher=search,
                             metric="throughput").played, key=lambda p: (p.start, p.name))
    assert played[0].name == "t_profile" and played[0].state == State.FAILED
    assert [p.name for p in played[1:]] == [p.name for p in tune(MicroBatchSearch(spec(gpu_memory=None)))]
    warned = [r.getMessage() for r in caplog.records if "profile run" in r.getMessage()]
    assert len(warned) == 1 and "t_profile failed" in warned[0] and "without a memory model" in warned[0]


@pytest.mark.parametrize("crash", [1, 2, 6])
def test_a_search_with_a_profile_rebuilt_from_the_ledger_goes_on_the_same(crash):
    """One slot: the order is the search's alone. Die after `crash` runs ended (the profile among them, or
    running), rebuild from what the ledger holds (the profile's model info in its metrics), go on: the same
    runs as a search never interrupted."""
    whole = [p.name for p in tune(MicroBatchSearch(spec()), slots=2)]
    live = MicroBatchSearch(spec())
    ledger, ended, metrics = [], {}, {}
    while len(ended) < crash:
        for e in live.propose(2, 0.0):
            ledger.append(e)
        e = next(x for x in ledger if x.name not in ended)
        out = fake_gpu(e)
        ended[e.name] = (out.state, out.reason, (out.metrics or {}).get("throughput"))
        metrics[e.name] = dict(out.metrics or {})
        live.observe(type("R", (), {"experiment": e})(), out)
    running = [e for e in ledger if e.name not in ended]
    rebuilt = MicroBatchSearch(spec())
    rebuilt.replay(ledger, ended, metrics)
    assert rebuilt.proposed == live.proposed and rebuilt.stages == live.stages and rebuilt.facts == live.facts
    rest = sorted(simulate(running, {"h": [0, 1]}, lambda e: 10.0, outcome=fake_gpu, searcher=rebuilt,
                           metric="throughput").played, key=lambda p: (p.start, p.name))
    assert sorted([*ended, *(p.name for p in rest)]) == sorted(whole)


def test_a_profile_run_out_of_memory_rules_its_stage_out_and_the_next_stage_is_profiled():
    global STATES, PARAMS
    kept = STATES, PARAMS
    STATES, PARAMS = {0: 80 * G, 1: 50 * G, 2: 45 * G, 3: 40 * G}, 5 * 10**9  # stage 0 cannot fit one sample
    try:
        played = tune(MicroBatchSearch(spec()))
        stated_search = tune(MicroBatchSearch(spec(facts=Facts(PARAMS, PER_SAMPLE).to_json())))
    finally:
        STATES, PARAMS = kept
    assert [(p.name, p.state) for p in played[:2]] == [("t_profile", State.FAILED), ("t_profile_z1", State.SUCCEEDED)]
    assert not any(place(p.name)[0] == 0 for p in played[2:])  # what the profile showed is not run again
    assert [p.name for p in played[2:]] == [p.name for p in stated_search]


def test_the_note_says_why_a_stage_is_skipped():
    """The report's line, from a recorded search: states alone too big, or not even the smallest size."""
    from types import SimpleNamespace

    from autotuner.views.summary import memory_note

    def note(**changes):
        recorded = spec(**({"facts": Facts(PARAMS, PER_SAMPLE).to_json()} | changes)).to_json()
        return memory_note(SimpleNamespace(meta=SimpleNamespace(search=recorded), attempts=[]))

    assert note(facts=Facts(5 * 10**9, PER_SAMPLE).to_json()).startswith(
        "Memory model (model_info: 5000000000 parameters, 953.7 MiB of activations per sample; GPUs of 74.5 GiB, "
        "70.8 GiB usable): z0 skipped, cannot fit (model states 74.5 GiB); z1 up to micro-batch 26;")
    assert "z0 skipped, cannot fit micro-batch 13 (model states 59.6 GiB, activations 12.1 GiB)" in note(min_mbs=13)
    assert note(gpu_memory=None) is None
    # A small model's activations, as a real GPU's profile run measured them (43 MB at micro-batch 1,024):
    assert ", 41 KiB of activations per sample;" in note(facts=Facts(PARAMS, 43_000_000 // 1024).to_json())


@pytest.mark.parametrize("tuner", ["random", "model_based"])
def test_a_sampling_tuner_tries_the_predicted_size_for_a_point_above_it_and_a_resume_replays_it(tuner):
    """A drawn point above the bound stands for the bound (the predicted largest, then the probe past it), never
    for a size an OOM ruled out; one slot pair: the order is the search's alone, and a search rebuilt from what
    the ledger holds (one run still out) runs the same points in the same order."""
    def names(search, queued=()):
        return [p.name for p in sorted(simulate(list(queued), {"h": [0, 1]}, lambda e: 10.0, outcome=fake_gpu,
                                                searcher=search, metric="throughput").played,
                                       key=lambda p: (p.start, p.name))]

    whole = names(search_for(stated(tuner=tuner, seed=3)))
    ran = [place(n) for n in whole if "confirm" not in n]
    assert any(mbs in (12, 36, 40, 44) for _, mbs in ran)  # a predicted size, off the grid of powers of two
    for crash in (2, 5):
        live = search_for(stated(tuner=tuner, seed=3))
        ledger, ended = [], {}
        while len(ended) < crash:
            (e,) = live.propose(2, 0.0)
            ledger.append(e)
            out = fake_gpu(e)
            ended[e.name] = (out.state, out.reason, (out.metrics or {}).get("throughput"))
            live.learn(e, *ended[e.name])
        (running,) = live.propose(2, 0.0)
        rebuilt = search_for(stated(tuner=tuner, seed=3))
        rebuilt.replay([*ledger, running], ended)
        assert rebuilt.trials == live.trials and rebuilt.stages == live.stages
        assert [e.name for e in ledger] + names(rebuilt, [running]) == whole


# --- frozen parameters (LoRA, PEFT) ------------------------------------------------------------------------------
FROZEN_PARAMS, TRAINABLE = 5 * 10**9, 5 * 10**7  # 1% trains, as a LoRA adapter does
# by hand, fp16 Adam on 2 GPUs: every parameter held (2 B, stage 3 halves it), gradients (2 B) and the fp32 copy
# with Adam's states (12 B) of the trainable ones only, partitioned from stage 2 and 1 on
FROZEN_STATES = {0: 10 * G + 0.1 * G + 0.6 * G, 1: 10 * G + 0.1 * G + 0.3 * G, 2: 10 * G + 0.05 * G + 0.3 * G,
                 3: 5 * G + 0.05 * G + 0.3 * G}


def test_frozen_parameters_have_no_gradients_nor_optimizer_states():
    half = Training(half=True)
    for stage, figure in FROZEN_STATES.items():
        assert model_states(FROZEN_PARAMS, stage, half, dp=2, trainable=TRAINABLE) == pytest.approx(figure)
    assert model_states(10**9, 0, half, dp=1, trainable=None) == model_states(10**9, 0, half, dp=1, trainable=10**9)
    # all counted, stage 0 needs 80e9 and is skipped on an 80 GB GPU; the trainable counted apart, it fits 65
    assert bound(Facts(FROZEN_PARAMS, 1e9), half, 0, GPU, dp=2).largest == 0
    assert bound(Facts(FROZEN_PARAMS, 1e9, trainable=TRAINABLE), half, 0, GPU, dp=2).largest == 65


def frozen_gpu(e):
    """The fake GPU with a model of which 1% trains; its profile run reports the trainable count as DeepSpeed's
    engine does (`trainable_num_params`)."""
    config = e.ds_config
    stage, mbs = config["zero_optimization"]["stage"], config["train_micro_batch_size_per_gpu"]
    if FROZEN_STATES[stage] + PER_SAMPLE * mbs + CONTEXT > GPU:
        return Outcome(State.FAILED, Reason.OOM, "torch.OutOfMemoryError: CUDA out of memory", 1)
    if config.get("autotuning", {}).get("model_info", {}).get("profile"):
        return Outcome(State.SUCCEEDED, metrics={"num_params": FROZEN_PARAMS, "trainable_num_params": TRAINABLE,
                                                 "activation_mem_per_gpu": PER_SAMPLE * mbs})
    return Outcome(State.SUCCEEDED, metrics={"throughput": throughput(stage, mbs)})


def test_a_frozen_model_is_tuned_at_the_stages_an_all_parameters_count_would_skip():
    """Counting every parameter as trainable skips stage 0 (and bounds the others far too low): the winner is a
    slower config. Counted apart (model_info's trainable_num_params, or the profile run's), stage 0 is searched
    from its true largest size and wins."""
    def run(facts):
        search = MicroBatchSearch(spec(facts=facts.to_json() if facts else None))
        played = sorted(simulate([], {"h": list(range(4))}, lambda e: 10.0, outcome=frozen_gpu, searcher=search,
                                 metric="throughput").played, key=lambda p: (p.start, p.name))
        return search, played

    all_counted, played_all = run(Facts(FROZEN_PARAMS, PER_SAMPLE))
    apart, played_apart = run(Facts(FROZEN_PARAMS, PER_SAMPLE, trainable=TRAINABLE))
    profiled, played_profiled = run(None)
    assert all_counted.stages[0].given_up and not any(place(p.name)[0] == 0 for p in played_all)
    for search, played in ((apart, played_apart), (profiled, played_profiled)):
        winner = max(search.configs, key=search.mean)
        assert search.configs[winner][:2] == (0, 67)  # the true largest: 10.7e9 + 67e9 + 1.5e9 <= 80e9
        assert not any(p.state == State.FAILED for p in played if "profile" not in p.name
                       and place(p.name)[0] == 0 and place(p.name)[1] <= 67)
    assert profiled.facts is not None and profiled.facts.trainable == TRAINABLE
    best_all = max(all_counted.configs, key=all_counted.mean)
    assert throughput(*all_counted.configs[best_all][:2]) < throughput(0, 67)


# --- the loop closed: measured peaks and OOMs correct the model ---------------------------------------------------
def peaked_gpu(e):
    """The fake GPU, each run that fits reporting the peak memory it held (the script's own `peak_memory`, as NVML
    would measure it: the model states, the activations and what the runtime keeps)."""
    out = fake_gpu(e)
    if out.state != State.SUCCEEDED or "profile" in e.name:
        return out
    stage, mbs = place(e.name)
    return Outcome(State.SUCCEEDED, metrics={**out.metrics, "peak_memory": STATES[stage] + PER_SAMPLE * mbs + CONTEXT})


@pytest.mark.parametrize("wrong", [0.5, 2.0])
def test_measured_peaks_correct_the_model_for_the_stages_still_to_come(wrong):
    """model_info states the activations `wrong` times what they are: without peaks each stage's first run is
    at the wrong prediction (out of memory when it is high, far below the largest when low); with them, once the
    first stage's runs end, the stages still to come start at (or just below) their true largest size, and
    fewer runs run out of memory."""
    def run(outcome):
        search = MicroBatchSearch(spec(facts=Facts(PARAMS, wrong * PER_SAMPLE).to_json()))
        played = sorted(simulate([], {"h": [0, 1]}, lambda e: 10.0, outcome=outcome, searcher=search,
                                 metric="throughput").played, key=lambda p: (p.start, p.name))
        return search, played

    blind, played_blind = run(fake_gpu)
    closed, played_closed = run(peaked_gpu)
    corrected = closed.model()
    assert corrected is not None and PER_SAMPLE <= corrected.activation <= 1.1 * PER_SAMPLE \
        and "corrected by" in corrected.source
    taught = blind.model()  # without peaks only OOMs teach it: a model that predicts too little runs out of none
    assert taught == blind.facts if wrong > 1 else taught is not None and taught.activation > wrong * PER_SAMPLE
    firsts = {}
    for p in played_closed:
        firsts.setdefault(place(p.name)[0], (place(p.name)[1], p.state))
    exact = {stage: bound(Facts(PARAMS, PER_SAMPLE), Training(half=True), stage, GPU, dp=2).largest
             for stage in STATES}  # what the right model predicts (its headroom below the true largest)
    later = [stage for stage in STATES if stage != 3]  # z3 goes first, on the stated model
    for stage in later:
        mbs, state = firsts[stage]
        assert state == State.SUCCEEDED and exact[stage] - 1 <= mbs <= largest(stage), (stage, firsts)
    assert oom_runs(played_closed) <= oom_runs(played_blind)
    best = {p.name for p in played_closed if p.state == State.SUCCEEDED}
    assert max(throughput(*place(n)) for n in best) == max(throughput(z, largest(z)) for z in STATES)
