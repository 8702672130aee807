"""`autotune tune`'s searches (the structured one, random, model_based) and the re-runs that confirm the best,
driven by the real scheduler on a simulated clock against a fake GPU (named as such): a run needs memory that grows
with its ZeRO stage and micro-batch size and fails with the runtime's OOM message past a limit; its throughput is a
known function."""
import json
import math
import random
import tempfile
from pathlib import Path

import pytest

from autotuner.core.outcome import Outcome
from autotuner.planning.simulate import simulate
from autotuner.spec.sure import SURE_STEPS
from autotuner.states import Reason, State
from autotuner.tune.gridsearch import WORTH, MicroBatchSearch
from autotuner.tune.model_based import ASKS
from autotuner.tune.space import MAX_MICRO_BATCH, SearchSpec, sizes
from autotuner.tune.tuners import search_for

LIMIT = 100.0  # GiB of the fake GPU
NEED = {0: (40.0, 2.0), 1: (30.0, 2.0), 2: (20.0, 1.5), 3: (10.0, 1.0)}  # stage -> (fixed, per sample)


def fits(stage, mbs):
    fixed, per = NEED[stage]
    return fixed + per * mbs <= LIMIT


def throughput(stage, mbs):
    """Grows with the micro-batch size, less with every stage (more communication)."""
    return mbs * 100 / (1 + mbs / 64) * (1 - 0.05 * stage)


def knob_factor(stage, zero):
    """ZeRO knobs (full mode) as known factors, 1 at DeepSpeed's defaults (as tests/oom_standin.sh counts them):
    overlap_comm on 10% faster than off, reduce_bucket_size 1e9 4% faster than 5e8 (5e7 5% slower),
    contiguous_gradients off 3% slower, allgather_bucket_size 5e7 1% slower; the others change nothing."""
    factor = (1.1 if zero.get("overlap_comm", stage == 3) else 1.0) / (1.1 if stage == 3 else 1.0)
    factor *= {5e7: 0.95, 5e8: 1.0, 1e9: 1.04}[zero.get("reduce_bucket_size", 5e8)]
    factor *= 1.0 if zero.get("contiguous_gradients", True) else 0.97
    return factor * (0.99 if zero.get("allgather_bucket_size") == 5e7 else 1.0)


def fake_gpu(e):
    """allgather_bucket_size 1e9 needs 5 GiB more."""
    zero = e.ds_config["zero_optimization"]
    stage, mbs = zero["stage"], e.ds_config["train_micro_batch_size_per_gpu"]
    if not fits(stage, mbs) or (zero.get("allgather_bucket_size") == 1e9 and not fits(stage, mbs + 5 / NEED[stage][1])):
        return Outcome(State.FAILED, Reason.OOM, "torch.OutOfMemoryError: CUDA out of memory", 1)
    return Outcome(State.SUCCEEDED, metrics={"throughput": throughput(stage, mbs) * knob_factor(stage, zero)})


def spec(**changes):
    base = dict(prefix="t", template={"script": "/x/train.py", "num_gpus": 1, "num_nodes": 1, "args": []},
                base={"gradient_accumulation_steps": 1}, stages=(0, 1, 2, 3), metric="throughput", max_mbs=256,
                confirm=0)  # the search alone: re-runs to confirm the best are tested apart
    return SearchSpec(**(base | changes))


def tune(search, slots=4):
    return simulate([], {"h": list(range(slots))}, lambda e: 10.0, outcome=fake_gpu, searcher=search,
                    metric="throughput")


def place(name):
    _, z, mbs = name.split("_")[:3]
    return int(z[1:]), int(mbs[3:])


def test_the_search_finds_the_grids_best_with_a_fraction_of_its_experiments():
    """The best exactly, in fewer runs than the power-of-two grid (36), at most a third of them out of memory; a
    stage that cannot beat the best is not bisected to its exact largest size."""
    played = tune(MicroBatchSearch(spec())).played
    grid = {(z, m): throughput(z, m) for z in NEED for m in range(1, 257) if fits(z, m)}
    best = max(grid, key=grid.get)
    ran = {place(p.name): p.state for p in played}
    found = max((k for k, state in ran.items() if state == State.SUCCEEDED), key=lambda k: throughput(*k))
    assert found == best == (3, 90)
    ooms = sum(1 for p in played if p.state == State.FAILED)
    assert len(played) < 36 and 3 * ooms <= len(played)
    assert not all((z, max(m for y, m in grid if y == z)) in ran for z in (0, 1, 2))


def test_the_stages_tell_each_other_what_fits():
    """At the same size a lower ZeRO stage needs at least the memory of a higher one: an OOM at a stage rules
    out the lower stages at that size and above (none is launched there after it ended), a fit vouches for the
    higher stages (their search starts from it). A run that contradicts the order turns the inference off."""
    played = sorted(tune(MicroBatchSearch(spec()), slots=1).played, key=lambda p: p.start)
    for p in played:
        stage, mbs = place(p.name)
        ruled = [q.name for q in played if q.end <= p.start and q.state == State.FAILED and place(q.name)[0] > stage
                 and place(q.name)[1] <= mbs]
        assert not ruled, f"{p.name} launched after {ruled} ran out of memory"
    search = MicroBatchSearch(spec())
    search.learn(search.experiment(2, 40), State.FAILED, Reason.OOM, None)
    search.learn(search.experiment(1, 20), State.SUCCEEDED, None, 10.0)
    assert search.ruled_out_above(0) == search.ruled_out_above(1) == 40 and search.ruled_out_above(3) is None
    assert search.vouched(3) == search.vouched(2) == 20 and search.vouched(0) is None
    assert not search.open(0, 40) and search.open(3, 40)
    search.learn(search.experiment(0, 50), State.SUCCEEDED, None, 10.0)  # fits where stage 2 did not
    assert not search.ordered() and search.ruled_out_above(1) is None and search.open(1, 45)


def test_one_run_at_a_time_and_no_model_the_search_opens_with_the_lowest_stage_at_the_top():
    """Where memory is plentiful the lowest stage at the largest size is most often the best: the first run finds
    it. Where it does not fit, that run is all the opening costs (the best still found within WORTH, under a third
    of the runs out of memory). With room for several runs the first round spans the stages, the highest first."""
    roomy = sorted(tune(MicroBatchSearch(spec(max_mbs=16)), slots=1).played, key=lambda p: p.start)
    assert roomy[0].name == "t_z0_mbs16" and roomy[0].state == State.SUCCEEDED
    assert max(((0, 16), *(place(p.name) for p in roomy)), key=lambda k: throughput(*k)) == (0, 16)
    tight = sorted(tune(MicroBatchSearch(spec()), slots=1).played, key=lambda p: p.start)
    assert tight[0].name == "t_z0_mbs256" and tight[0].state == State.FAILED
    found = max((place(p.name) for p in tight if p.state == State.SUCCEEDED), key=lambda k: throughput(*k))
    ooms = sum(1 for p in tight if p.state == State.FAILED)
    assert throughput(*found) >= (1 - WORTH) * throughput(3, 90)  # the exact largest sought only while worth it
    assert len(tight) < 36 and 3 * ooms <= len(tight)
    assert "t_z0_mbs256" not in {p.name for p in tune(MicroBatchSearch(spec())).played}


def test_no_size_known_not_to_fit_is_ever_launched():
    played = sorted(tune(MicroBatchSearch(spec())).played, key=lambda p: p.start)
    smallest_oom: dict[int, int] = {}
    for p in played:
        stage, mbs = place(p.name)
        assert mbs < smallest_oom.get(stage, 10**9), f"{p.name} launched after an OOM at {smallest_oom[stage]}"
        if p.state == State.FAILED:
            smallest_oom[stage] = min(mbs, smallest_oom.get(stage, 10**9))


def test_a_stage_that_cannot_fit_at_all_costs_one_run_and_a_crash_gives_a_stage_up():
    """The lowest stage needs the most memory: with no size known to fit it is tried at the smallest size first,
    one run that says whether it fits at all (here the higher stage's OOM at the largest rules it out there)."""
    saved = NEED[0]
    NEED[0] = (120.0, 1.0)  # never fits
    try:
        bounded = tune(MicroBatchSearch(spec(stages=(0, 3)))).played
        unbounded = tune(MicroBatchSearch(spec(stages=(0, 3), max_mbs=MAX_MICRO_BATCH))).played
    finally:
        NEED[0] = saved
    assert [p.name for p in bounded if place(p.name)[0] == 0] == ["t_z0_mbs1"]
    assert [p.name for p in unbounded if place(p.name)[0] == 0] == ["t_z0_mbs1"]

    def broken(e):  # stage 2 refuses its config: not an answer about sizes
        if e.ds_config["zero_optimization"]["stage"] == 2:
            return Outcome(State.FAILED, Reason.CONFIG, "DeepSpeedConfigError", 1)
        return fake_gpu(e)

    search = MicroBatchSearch(spec(stages=(2, 3)))
    played = simulate([], {"h": [0, 1]}, lambda e: 10.0, outcome=broken, searcher=search, metric="throughput").played
    assert len([p.name for p in played if place(p.name)[0] == 2]) == 1 and search.stages[2].given_up


def test_gradient_accumulation_keeps_the_global_batch_and_the_budget_and_patience_stop_it():
    search = MicroBatchSearch(spec(stages=(3,), global_batch=512, max_mbs=512 // 4,
                                   template={"script": "/x", "num_gpus": 4, "num_nodes": 1, "args": []}))
    played = simulate([], {"h": list(range(8))}, lambda e: 10.0, outcome=fake_gpu, searcher=search,
                      metric="throughput").played
    for p in played:
        _, mbs = place(p.name)
        assert p.name.endswith(f"_gas{512 // (mbs * 4)}")
    assert len(tune(MicroBatchSearch(spec(trials=7))).played) == 7
    unbounded = dict(stages=(3,), max_mbs=MAX_MICRO_BATCH)  # doubling: runs out of memory twice in a row
    assert len(tune(MicroBatchSearch(spec(**unbounded, patience=2)), slots=1).played) < \
        len(tune(MicroBatchSearch(spec(**unbounded)), slots=1).played)


def test_a_fixed_train_batch_size_is_kept_by_every_candidate():
    """train_batch_size 96 on 4 GPUs with mp_size 2 (2 data-parallel): micro-batch x accumulation x 2 is 96 in
    every experiment; only sizes that divide 48 are run, and the best of them is found (z2 fits up to 53, so 48)."""
    fixed = spec(stages=(2, 3), global_batch=96, fixed_batch=True, max_mbs=48, mp=2,
                 template={"script": "/x", "num_gpus": 4, "num_nodes": 1, "args": []})
    search = MicroBatchSearch(fixed)
    played = tune(search).played
    assert played
    for p in played:
        _, mbs = place(p.name)
        e = search.experiment(*place(p.name))
        assert 48 % mbs == 0 and p.name.endswith(f"_gas{48 // mbs}")
        assert e.ds_config["train_batch_size"] == 96 == mbs * e.ds_config["gradient_accumulation_steps"] * 2
    best = max(search.configs, key=search.mean)
    assert search.configs[best][:2] == (2, 48)
    assert fixed.keeps(16) and not fixed.keeps(20) and fixed.kept(47) == 24 and fixed.kept(5, low=4) is None
    assert sizes(fixed) == [1, 2, 4, 8, 16, 24, 48]  # 32 cannot keep it: 24 stands for it
    # max_train_batch_size is a bound, as DeepSpeed reads it: accumulation = its share of a GPU // micro-batch
    bounded = spec(stages=(3,), global_batch=100, max_mbs=50, template={"script": "/x", "num_gpus": 2,
                                                                         "num_nodes": 1, "args": []})
    assert bounded.accumulation(7) == 7 and bounded.keeps(7)
    assert MicroBatchSearch(bounded).experiment(3, 7).ds_config["train_batch_size"] == 7 * 7 * 2


def test_early_stopping_counts_only_gains_of_the_margin_asked_for():
    """With min_gain, a run better than the best by less than the margin is no progress: the same patience stops
    the search sooner; a margin of zero is the plain rule (any better run is progress)."""
    unbounded = dict(stages=(3,), max_mbs=MAX_MICRO_BATCH, patience=3)
    plain = tune(MicroBatchSearch(spec(**unbounded)), slots=1).played
    strict = tune(MicroBatchSearch(spec(**unbounded, min_gain=0.5)), slots=1).played
    assert len(strict) < len(plain)
    gains = [p.name for p in strict]
    assert gains[:4] == ["t_z3_mbs1", "t_z3_mbs2", "t_z3_mbs4", "t_z3_mbs8"]  # each still half as fast again
    search = MicroBatchSearch(spec(min_gain=0.1))
    assert search._improves(100.0) and not search._improves(105.0) and search.best == 105.0
    assert search._improves(116.0) and not search._improves(100.0) and search.best == 116.0


def test_a_bounded_search_starts_at_the_largest_size_allowed_and_settles_there_when_it_fits():
    """The largest size that fits is most often the fastest: with a bound the user set, one run per stage at it,
    then only the sizes worth measuring below it (none of the doubling from the smallest): three quarters of it,
    and no further, since it measured slower (as DeepSpeed's autotuner, a smaller size only while one pays)."""
    played = tune(MicroBatchSearch(spec(stages=(2, 3), max_mbs=32)), slots=1).played
    assert [next(p.name for p in played if place(p.name)[0] == z) for z in (2, 3)] == ["t_z2_mbs32", "t_z3_mbs32"]
    assert sorted(place(p.name)[1] for p in played) == [24, 24, 32, 32]


def test_a_search_rebuilt_from_the_ledger_makes_the_same_decisions():
    """Stop after some runs ended (a crash), rebuild from what the record holds, go on: the same experiments
    as the search that was never interrupted going on from there, none twice."""
    first = MicroBatchSearch(spec())
    proposed = first.propose(2, 0.0)
    ended = {}
    for e in proposed[:1]:  # one ended before the crash, the other was running
        out = fake_gpu(e)
        first.learn(e, out.state, out.reason, out.metrics.get("throughput") if out.metrics else None)
        ended[e.name] = (out.state, out.reason, out.metrics.get("throughput") if out.metrics else None)
    rebuilt = MicroBatchSearch(spec())
    rebuilt.replay(proposed, ended)
    assert rebuilt.proposed == first.proposed and rebuilt.stages == first.stages
    went_on, rest = (simulate(proposed[1:], {"h": [0, 1]}, lambda e: 10.0, outcome=fake_gpu, searcher=search,
                              metric="throughput").played for search in (first, rebuilt))
    assert [(p.name, p.start) for p in rest] == [(p.name, p.start) for p in went_on]
    assert len({p.name for p in rest} | set(ended)) == len(rest) + len(ended) > 10


# --- the sampling tuners (random, model_based) ------------------------------------------------------------------
def grid(search_spec):
    """The points the sampling tuners draw from, and the best of them that fits."""
    points = [(z, m) for z in search_spec.stages for m in sizes(search_spec)]
    return points, max((p for p in points if fits(*p)), key=lambda p: throughput(*p))


def assert_no_known_oom_launched(played):
    """No run started at a size at or above one of its stage whose OOM had ended before it started."""
    ooms = [(place(p.name), p.end) for p in played if p.state == State.FAILED]
    for p in played:
        stage, mbs = place(p.name)
        known = [q for q, end in ooms if q[0] == stage and q[1] <= mbs and end <= p.start]
        assert not known, f"{p.name} launched at {p.start} after {known} ran out of memory"


@pytest.mark.parametrize("tuner", ["random", "model_based"])
def test_a_sampling_tuner_never_repeats_a_point_never_launches_one_known_not_to_fit_and_finds_the_best(tuner):
    for seed in range(4):
        search_spec = spec(tuner=tuner, seed=seed)
        played = tune(search_for(search_spec)).played
        points, best = grid(search_spec)
        ran = [place(p.name) for p in played]
        assert len(ran) == len(set(ran)) and set(ran) <= set(points)
        assert_no_known_oom_launched(played)
        assert best in ran  # no budget: it goes on until every point worth trying was tried
        assert len(ran) < len(points)  # what an OOM seen had pruned was never run


@pytest.mark.parametrize("tuner", ["random", "model_based"])
def test_a_sampling_tuner_honours_the_trial_budget_and_early_stopping(tuner):
    assert len(tune(search_for(spec(tuner=tuner, trials=7))).played) == 7
    stopped = tune(search_for(spec(tuner=tuner, patience=3)), slots=1).played
    assert len(stopped) < len(tune(search_for(spec(tuner=tuner)), slots=1).played)
    values = [throughput(*place(p.name)) if p.state == State.SUCCEEDED else None for p in stopped]
    best_at = max(range(len(values)), key=lambda i: values[i] or -1)
    assert len(stopped) == best_at + 1 + 3  # three ended runs after the best, none of them better


def played_names(search, slots=1, queued=()):
    return [p.name for p in sorted(simulate(list(queued), {"h": list(range(slots))}, lambda e: 10.0,
                                            outcome=fake_gpu, searcher=search, metric="throughput").played,
                                   key=lambda p: (p.start, p.name))]


def recorded(experiment):
    out = fake_gpu(experiment)
    return out.state, out.reason, out.metrics.get("throughput") if out.metrics else None


@pytest.mark.parametrize("tuner", ["random", "model_based"])
def test_a_sampling_tuners_draws_are_the_seeds_and_a_resume_replays_them(tuner):
    """One slot: the order is the search's alone. The same seed draws the same points, another seed others; a
    search that died after some runs (one still running) and was rebuilt from what the ledger holds runs the same
    points in the same order as one never interrupted."""
    whole = played_names(search_for(spec(tuner=tuner, seed=7)))
    assert played_names(search_for(spec(tuner=tuner, seed=7))) == whole
    assert played_names(search_for(spec(tuner=tuner, seed=8))) != whole
    for crash in (1, 5, 11):
        live = search_for(spec(tuner=tuner, seed=7))
        ledger, ended = [], {}
        while len(ended) < crash:  # one slot: propose one, it ends, the next
            (e,) = live.propose(1, 0.0)
            ledger.append(e)
            ended[e.name] = recorded(e)
            live.learn(e, *ended[e.name])
        (running,) = live.propose(1, 0.0)  # running when the runner died
        rebuilt = search_for(spec(tuner=tuner, seed=7))
        rebuilt.replay([*ledger, running], ended)
        assert rebuilt.trials == live.trials and rebuilt.stages == live.stages
        rest = played_names(rebuilt, queued=[running])
        assert [e.name for e in ledger] + rest == whole


def test_model_based_tells_an_oom_as_pruned_never_as_a_failure():
    """TPE leaves FAIL trials out of its model: an OOM told so would teach it nothing."""
    import optuna

    search = search_for(spec(tuner="model_based", seed=1))
    tune(search)
    trials = search.study().trials
    assert len(trials) == len(search.trials) > 10
    states = optuna.trial.TrialState
    sizes_of = sizes(search.spec)
    for trial in trials:
        stage, mbs = trial.params["stage"], sizes_of[trial.params["log2_mbs"]]
        if fits(stage, mbs):
            assert trial.state == states.COMPLETE and trial.value == pytest.approx(throughput(stage, mbs))
        else:
            assert trial.state == states.PRUNED
    assert sum(t.state == states.PRUNED for t in trials) >= 3


def test_model_based_rebuilt_from_the_ledger_proposes_what_the_live_search_would():
    """Three slots, runs ending one at a time while others still run (told to TPE as running, its constant
    liar): at any point, a search rebuilt from the ledger (proposed in order, what ended) proposes the very
    experiments the live one proposes next, and so on to the end; no point twice."""
    def drive(search, running, ledger, ended, steps):
        """End the oldest running experiment, then fill the free slots, `steps` times (or to the end)."""
        for _ in range(steps):
            if not running:
                return
            e = running.pop(0)
            ended[e.name] = recorded(e)
            search.learn(e, *ended[e.name])
            new = search.propose(3 - len(running), 0.0)
            running += new
            ledger += new

    live = search_for(spec(tuner="model_based", seed=3))
    running = live.propose(3, 0.0)
    ledger, ended = list(running), {}
    drive(live, running, ledger, ended, 9)
    rebuilt = search_for(spec(tuner="model_based", seed=3))
    rebuilt.replay(ledger, ended)
    assert rebuilt.trials == live.trials and rebuilt.stages == live.stages
    twin_running, twin_ledger, twin_ended = list(running), list(ledger), dict(ended)
    drive(live, running, ledger, ended, 100)
    drive(rebuilt, twin_running, twin_ledger, twin_ended, 100)
    assert [e.name for e in twin_ledger] == [e.name for e in ledger]
    assert len(ledger) > 13 and len({e.name for e in ledger}) == len(ledger)


def test_model_based_keeps_its_study_and_tells_it_only_what_changed():
    """The study is kept between asks (not rebuilt from the ledger each time, whose cost grew with every trial):
    after each decision it holds, the asks' failed trials aside, the very trials a study built from the ledger
    holds, in the same order and as told, so TPE reads the same; it is one object from one decision to the next,
    built anew only once the asks it failed outnumber its trials (then it holds none of them)."""
    import optuna

    fail = optuna.trial.TrialState.FAIL

    def seen(study):
        return [(t.params, t.state, t.value) for t in study.trials if t.state != fail]

    live = search_for(spec(tuner="model_based", seed=5))
    running = live.propose(3, 0.0)
    kept = live._kept
    assert kept is not None
    decisions, rebuilt = 0, 0
    while running:
        e = running.pop(0)
        live.learn(e, *recorded(e))
        running += live.propose(3 - len(running), 0.0)
        assert live._kept is kept  # one study through each decision
        stale = live._size > 2 * len(live.points) + 4 * ASKS  # the asks it failed outnumber its trials
        synced = live._synced()
        if synced is not kept:  # built anew: only where those asks had come to outnumber the trials
            assert stale and not any(t.state == fail for t in synced.trials)
            kept, rebuilt = synced, rebuilt + 1
        assert seen(synced) == seen(live.study())
        decisions += 1
    assert decisions > 13 and rebuilt < decisions / 4


# --- confirming the best ----------------------------------------------------------------------------------------
def test_the_best_configs_are_run_again_once_the_search_is_over():
    played = tune(MicroBatchSearch(spec(confirm=None))).played
    reruns = [p for p in played if p.name.endswith("_confirm1")]
    assert sorted(p.name for p in reruns) == ["t_z3_mbs88_confirm1", "t_z3_mbs90_confirm1"]  # the best two
    assert min(p.start for p in reruns) >= max(p.end for p in played if p not in reruns)
    assert not any(p.name.endswith("_confirm1") for p in tune(MicroBatchSearch(spec(confirm=0))).played)
    three = [p.name for p in tune(MicroBatchSearch(spec(confirm=3))).played if p.name.endswith("_confirm1")]
    assert len(three) == 3
    few = tune(MicroBatchSearch(spec(confirm=None, stages=(3,), max_mbs=2))).played  # two configs: no re-runs
    assert [p.name for p in few] == ["t_z3_mbs2", "t_z3_mbs1_gas2"]  # below the largest, its batch kept


@pytest.mark.parametrize("half, steps, reruns", [
    (0.001, None, []),  # each first run known within 0.1%: the best two (3179, 3149) are told apart, no re-run
    (0.001, SURE_STEPS, []),  # the same, of the fewest measured steps an interval is trusted with
    (0.001, SURE_STEPS - 1, ["t_z3_mbs88_confirm1", "t_z3_mbs90_confirm1"]),  # fewer: narrow by chance, both re-run
    (0.02, None, ["t_z3_mbs88_confirm1", "t_z3_mbs90_confirm1"]),  # within 2%: their intervals overlap, both re-run
])
def test_the_leaders_are_re_run_only_where_their_intervals_overlap(half, steps, reruns):
    """A run's interval (its METRIC_low and METRIC_high, spec/interval.py) says whether one more run is needed:
    a leader whose interval is clear of every other leader's is not re-run; one without an interval, or with one
    of fewer than SURE_STEPS measured steps (two steps of DeepSpeed's default window), is, as before."""
    def measured(e):
        out = fake_gpu(e)
        if out.metrics:
            value = out.metrics["throughput"]
            return Outcome(State.SUCCEEDED, metrics={"throughput": value, "throughput_low": value * (1 - half),
                                                     "throughput_high": value * (1 + half)}
                           | ({"steps_measured": float(steps)} if steps is not None else {}))
        return out

    search = MicroBatchSearch(spec(confirm=None))
    played = simulate([], {"h": list(range(4))}, lambda e: 10.0, outcome=measured, searcher=search,
                      metric="throughput").played
    assert sorted(p.name for p in played if p.name.endswith("_confirm1")) == reruns

    rebuilt = MicroBatchSearch(spec(confirm=None))  # resumed: the intervals replayed from the ledger's metrics
    outcomes, metrics = {}, {}
    for p in played:
        e = rebuilt.experiment(*place(p.name), rerun=p.name.endswith("_confirm1"))
        out = measured(e)
        outcomes[e] = (out.state, out.reason, out.metrics.get("throughput") if out.metrics else None)
        metrics[e.name] = dict(out.metrics or {})
    rebuilt.replay(list(outcomes), {e.name: v for e, v in outcomes.items()}, metrics)
    assert rebuilt.propose(4, 0.0) == []


def test_re_runs_change_the_winner_when_the_first_measurement_was_a_lucky_outlier():
    """z2 mbs49's first run measures 3300 (lucky: its throughput is 2498), above the true best, z3 mbs90
    (3179); z3's search, which could not beat it, stops short at 76. Re-run, z2 mbs49's mean falls below
    z3 mbs76's: z3's search goes on (a size past 76 can beat the best again), and its best two are re-run
    in turn and win."""
    seen = set()

    def lucky_once(e):
        out = fake_gpu(e)
        if place(e.name) == (2, 49) and (2, 49) not in seen:
            seen.add((2, 49))
            return Outcome(State.SUCCEEDED, metrics={"throughput": 3300.0})
        return out

    search = MicroBatchSearch(spec(confirm=None, stages=(2, 3)))
    played = sorted(simulate([], {"h": [0, 1]}, lambda e: 10.0, outcome=lucky_once, searcher=search,
                             metric="throughput").played, key=lambda p: p.start)
    names = [p.name for p in played]
    reruns = [name for name in names if name.endswith("_confirm1")]
    assert reruns == ["t_z2_mbs49_confirm1", "t_z3_mbs76_confirm1", "t_z3_mbs89_confirm1", "t_z3_mbs87_confirm1"]
    assert names.index("t_z3_mbs89") > names.index("t_z2_mbs49_confirm1")
    ranked = sorted(search.configs, key=lambda name: -search.mean(name))
    assert ranked[:2] == ["t_z3_mbs89", "t_z3_mbs87"] and ranked.index("t_z2_mbs49") > 2
    assert search.mean("t_z2_mbs49") == pytest.approx((3300 + throughput(2, 49)) / 2)

    rebuilt = MicroBatchSearch(spec(confirm=None, stages=(2, 3)))
    outcomes = {}
    for p in played:
        e = rebuilt.experiment(*place(p.name), rerun=p.name.endswith("_confirm1"))
        out = fake_gpu(e) if p.name != "t_z2_mbs49" else Outcome(State.SUCCEEDED, metrics={"throughput": 3300.0})
        outcomes[e] = (out.state, out.reason, out.metrics.get("throughput") if out.metrics else None)
    rebuilt.replay(list(outcomes), {e.name: v for e, v in outcomes.items()})
    assert rebuilt.propose(2, 0.0) == [] and rebuilt.reruns == search.reruns


# --- full mode: the ZeRO knobs ----------------------------------------------------------------------------------
def full_spec(tmp_path, zero=None, **changes):
    """A full-mode spec as `autotune tune` reads it from a config (`fast: false`), with `zero` in its
    zero_optimization."""
    from autotuner.tune.inputs import read_tuning

    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": [1, 2, 3]} | (zero or {}),
                                "autotuning": {"fast": False}}))
    tuning = read_tuning(path, 1)
    return spec(**{"base": tuning.base | {"gradient_accumulation_steps": 1}, "stages": tuning.stages,
                   "knobs": {str(s): space for s, space in tuning.knobs.items() if space}} | changes)


def test_full_mode_sweeps_each_stages_knobs_at_its_best_size_once_its_micro_batch_search_is_over(tmp_path):
    """Knob by knob (the table's order), each other value with the rest at the best so far: z2 keeps
    overlap_comm on (10% faster), not reduce_scatter off (no faster: a tie keeps what was) nor contiguous gradients
    off (slower), then reduce_bucket_size 1e9; allgather_bucket_size 1e9 runs out of memory at that size, an
    answer about those knobs only. The winner carries its knobs."""
    search = MicroBatchSearch(full_spec(tmp_path))
    played = tune(search).played
    knob_runs = {z: sorted(p.name.removeprefix(f"t_z{z}_") for p in played if place(p.name)[0] == z
                           and p.name.count("_") > 2) for z in (1, 2, 3)}
    assert knob_runs[2] == sorted(["mbs53_ovl1", "mbs53_ovl1_rs0", "mbs53_ovl1_cg0", "mbs53_ovl1_rbs5e7",
                                   "mbs53_ovl1_rbs1e9", "mbs53_ovl1_rbs1e9_abs5e7", "mbs53_ovl1_rbs1e9_abs1e9"])
    assert knob_runs[3] == sorted(["mbs90_ovl0", "mbs90_rs0", "mbs90_cg0", "mbs90_rbs5e7", "mbs90_rbs1e9",
                                   "mbs90_rbs1e9_pbs5e6", "mbs90_rbs1e9_pbs5e8"])
    assert knob_runs[1] == sorted(["mbs33_rbs5e7", "mbs33_rbs1e9", "mbs33_rbs1e9_abs5e7", "mbs33_rbs1e9_abs1e9"])
    for z in (1, 2, 3):  # no knob run before the stage's micro-batch search had ended
        sizes_end = max(p.end for p in played if place(p.name)[0] == z and p.name.count("_") == 2)
        assert all(p.start >= sizes_end for p in played if place(p.name)[0] == z and p.name.count("_") > 2)
    oom = next(p for p in played if p.name == "t_z2_mbs53_ovl1_rbs1e9_abs1e9")
    assert oom.state == State.FAILED and max(search.stages[2].fits) == 53
    best = max(search.configs, key=lambda name: search.mean(name))
    assert best == "t_z3_mbs90_rbs1e9"
    stage, mbs, knobs = search.configs[best]
    e = search.experiment(stage, mbs, knobs=knobs)
    assert e.ds_config["zero_optimization"] == {"stage": 3, "reduce_bucket_size": 1_000_000_000}
    fast = {p.name for p in tune(MicroBatchSearch(spec(stages=(1, 2, 3)))).played}
    assert fast == {p.name for p in played if p.name.count("_") == 2}  # the same micro-batch search as fast mode


def test_a_knob_the_config_fixes_is_never_searched_and_a_list_is_searched_from_its_first_value(tmp_path):
    """reduce_bucket_size fixed at 5e7: every run has it, no name varies it. overlap_comm listed [true, false]:
    every stage's micro-batch search runs with it on, and its knob sweep tries it off."""
    search = MicroBatchSearch(full_spec(tmp_path, {"reduce_bucket_size": 5e7, "overlap_comm": [True, False]}))
    launched = []
    simulate([], {"h": [0, 1, 2, 3]}, lambda e: 10.0, outcome=lambda e: launched.append(e) or fake_gpu(e),
             searcher=search, metric="throughput")
    assert launched and all(e.ds_config["zero_optimization"]["reduce_bucket_size"] == 5e7 for e in launched)
    assert not any("rbs" in e.name for e in launched)
    assert {e.name for e in launched if "ovl" in e.name} == {"t_z1_mbs33_ovl0", "t_z2_mbs53_ovl0", "t_z3_mbs90_ovl0"}
    assert all(e.ds_config["zero_optimization"]["overlap_comm"] is ("_ovl0" not in e.name) for e in launched)
    auto = full_spec(tmp_path, {"reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto"})
    assert {s: list(space) for s, space in auto.knobs.items()} == {  # a Trainer fills "auto" in: fixed too
        "1": ["allgather_bucket_size"], "2": ["overlap_comm", "reduce_scatter", "contiguous_gradients",
                                              "allgather_bucket_size"],
        "3": ["overlap_comm", "reduce_scatter", "contiguous_gradients"]}


@pytest.mark.parametrize("tuner", ["gridsearch", "random", "model_based"])
def test_full_mode_rebuilt_from_the_ledger_makes_the_same_decisions(tmp_path, tuner):
    """One slot: a full-mode search that died after some runs, knob runs among them (one still running), rebuilt
    from what the ledger holds, runs the same points in the same order as one never interrupted."""
    zero = {} if tuner == "gridsearch" else {"reduce_scatter": True, "contiguous_gradients": True,
                                             "allgather_bucket_size": 5e8, "stage3_prefetch_bucket_size": 5e7}
    made = full_spec(tmp_path, zero, tuner=tuner, seed=5, max_mbs=64, trials=40)
    whole = played_names(search_for(made))
    assert any(name.count("_") > 2 for name in whole[:30])
    for crash in (3, 17, 29):
        live = search_for(made)
        ledger, ended = [], {}
        while len(ended) < crash:
            (e,) = live.propose(1, 0.0)
            ledger.append(e)
            ended[e.name] = recorded(e)
            live.learn(e, *ended[e.name])
        (running,) = live.propose(1, 0.0)
        rebuilt = search_for(made)
        rebuilt.replay([*ledger, running], ended)
        assert (rebuilt.trials, rebuilt.knob_trials, rebuilt.knob_fits, rebuilt.knob_out) == \
            (live.trials, live.knob_trials, live.knob_fits, live.knob_out)
        assert [e.name for e in ledger] + played_names(rebuilt, queued=[running]) == whole


@pytest.mark.parametrize("tuner", ["random", "model_based"])
def test_a_sampling_tuner_in_full_mode_samples_the_knobs_too_and_finds_the_best(tmp_path, tuner):
    """overlap_comm and reduce_bucket_size searched (the rest fixed): 2 stages x 7 sizes x 6 settings. No point
    twice, none known not to fit (a knob run's OOM bounds its knobs only: knobs change the memory a run needs),
    the best found; an OOM told to TPE as pruned."""
    zero = {"reduce_scatter": True, "contiguous_gradients": True, "allgather_bucket_size": 5e8,
            "stage3_prefetch_bucket_size": 5e7, "stage": [2, 3]}
    made = full_spec(tmp_path, zero, tuner=tuner, seed=2, max_mbs=64)
    search = search_for(made)
    played = tune(search).played
    ran = [p.name for p in played]
    assert len(ran) == len(set(ran)) and any("_ovl" in n for n in ran) and any("_rbs" in n for n in ran)
    ooms = [(p.name, p.end) for p in played if p.state == State.FAILED]
    for p in played:  # an OOM without knobs bounds every setting of its stage; one with knobs, those knobs
        stage, mbs = place(p.name)
        knobs = p.name.split("_")[3:]
        known = [q for q, end in ooms if end <= p.start and place(q)[0] == stage and place(q)[1] <= mbs
                 and q.split("_")[3:] in ([], knobs)]
        assert not known, f"{p.name} launched at {p.start} after {known} ran out of memory"
    assert any(name.count("_") > 2 for name, _ in ooms)
    best = max(search.configs, key=lambda name: search.mean(name))
    assert best == "t_z3_mbs64_rbs1e9"  # overlap_comm is on at ZeRO-3 by default: 1.04 x z3's best beats z2's
    if tuner == "model_based":
        import optuna

        trials = search.study().trials
        assert len(trials) == len(ran)
        assert all(t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED) for t in trials)


def test_the_trial_budget_and_re_runs_count_knob_runs(tmp_path):
    sized = len([p for p in tune(MicroBatchSearch(spec(stages=(1, 2, 3)))).played])
    played = tune(MicroBatchSearch(full_spec(tmp_path, trials=sized + 3))).played
    assert len(played) == sized + 3 and sum(p.name.count("_") > 2 for p in played) >= 3  # stage 1's knobs start early
    stopped = tune(MicroBatchSearch(full_spec(tmp_path, stages=(3,), patience=2)), slots=1).played
    assert len(stopped) < len(tune(MicroBatchSearch(full_spec(tmp_path, stages=(3,))), slots=1).played)
    confirmed = tune(MicroBatchSearch(full_spec(tmp_path, confirm=None))).played
    assert sorted(p.name for p in confirmed if p.name.endswith("_confirm1")) == [
        "t_z3_mbs90_rbs1e9_confirm1", "t_z3_mbs90_rbs1e9_pbs5e6_confirm1"]


def test_smaller_sizes_are_measured_only_while_they_pay():
    """A fake CPU whose throughput peaks at 16 samples (caches): from the largest that fits (32), three quarters
    (24) measured faster, so half (16) is measured, faster again, then 12, slower: the walk stops there."""
    def cached(e):
        _, mbs = place(e.name)
        return Outcome(State.SUCCEEDED, metrics={"throughput": 1000 - (mbs - 16) ** 2})

    search = MicroBatchSearch(spec(stages=(3,), max_mbs=32, measure=5))
    played = simulate([], {"h": [0]}, lambda e: 10.0, outcome=cached, searcher=search, metric="throughput").played
    assert [place(p.name)[1] for p in played] == [32, 24, 16, 12]
    assert search.best_size(3) == 16


@pytest.mark.parametrize("seed", range(40))
def test_on_random_fake_gpus_the_best_is_found_within_the_margin_and_nothing_ruled_out_is_launched(seed):
    """Random fake GPUs whose stages are ordered by memory (a lower stage needs more at every size), random
    throughput curves and bounds, 1-4 slots: no size at or above one that ran out of memory at its stage or a
    higher one (ended before it started) is launched, and the best found is within WORTH of the true best."""
    r = random.Random(seed)
    fixed = sorted((r.uniform(0, 90) for _ in range(4)), reverse=True)
    per, knee, top, slots = r.uniform(0.05, 3), r.choice([16, 64, 256]), r.choice([64, 256, 1024]), r.randint(1, 4)

    def outcome(e):
        stage, mbs = place(e.name)
        if fixed[stage] + per * mbs > 100:
            return Outcome(State.FAILED, Reason.OOM, "torch.OutOfMemoryError: CUDA out of memory", 1)
        return Outcome(State.SUCCEEDED, metrics={"throughput": mbs * 100 / (1 + mbs / knee) * (1 - 0.05 * stage)})

    search = MicroBatchSearch(spec(max_mbs=top))
    played = simulate([], {"h": list(range(slots))}, lambda e: 10.0, outcome=outcome, searcher=search,
                      metric="throughput").played
    for p in played:
        stage, mbs = place(p.name)
        ruled = [q.name for q in played if q.end <= p.start and q.state == State.FAILED
                 and place(q.name)[0] >= stage and place(q.name)[1] <= mbs]
        assert not ruled, f"{p.name} launched after {ruled} ran out of memory"
    truth = [outcome(search.experiment(z, m)).metrics["throughput"] for z in range(4) for m in range(1, top + 1)
             if fixed[z] + per * m <= 100]
    if truth:
        assert max(search.first.values()) >= (1 - WORTH) * max(truth)
    else:
        assert not search.configs


# --- gradient accumulation given as a list -------------------------------------------------------------------
def accumulation_spec(tmp_path, **changes):
    """A fast-mode spec as `autotune tune` reads it from a config listing gradient_accumulation_steps [1, 2, 4]."""
    from autotuner.tune.inputs import read_tuning

    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"gradient_accumulation_steps": [1, 2, 4], "zero_optimization": {"stage": [1, 2, 3]}}))
    tuning = read_tuning(path, 1)
    return spec(**{"base": tuning.base, "stages": tuning.stages,
                   "knobs": {str(s): space for s, space in tuning.knobs.items() if space}} | changes)


def smaller_pays(e):
    """Every size fits; the best is 16, and each size measured below 64 beats the larger ones."""
    mbs = e.ds_config["train_micro_batch_size_per_gpu"]
    return Outcome(State.SUCCEEDED, metrics={"throughput": 1000 / (1 + abs(math.log2(mbs / 16)))})


def test_without_a_global_batch_sizes_measured_below_the_largest_keep_its_batch():
    """As DeepSpeed's autotuner derives it: the search runs at the config's accumulation (here 2) until a stage's
    largest size is known; the sizes measured below it then keep its batch per GPU (largest x 2 over the size),
    fixed when proposed, so that their names and their re-runs' never change. Not with a global batch in the
    config, nor with the accumulation searched as a list, nor with "auto"."""
    launched = []
    bounded = spec(stages=(3,), max_mbs=64, measure=4, base={"gradient_accumulation_steps": 2}, confirm=2)
    search = MicroBatchSearch(bounded)
    simulate([], {"h": [0]}, lambda e: 10.0, outcome=lambda e: launched.append(e) or smaller_pays(e), searcher=search,
             metric="throughput")
    gas = {e.name: e.ds_config["gradient_accumulation_steps"] for e in launched}
    sizes = {place(e.name)[1]: gas[e.name] for e in launched if "_confirm" not in e.name}
    assert sizes == {64: 2, 48: 2, 32: 4, 24: 5}  # 64 x 2 over the size; 48 keeps 2 (no suffix)
    assert all(name.removesuffix("_confirm1").endswith(f"_gas{g}") or (g == 2 and "_gas" not in name)
               for name, g in gas.items())
    reruns = [name for name in gas if name.endswith("_confirm1")]
    assert reruns and all(name.removesuffix("_confirm1") in search.configs for name in reruns)
    assert all(gas[name] == gas[name.removesuffix("_confirm1")] for name in reruns)  # a re-run is the same config
    rebuilt = MicroBatchSearch(bounded)
    rebuilt.replay(launched, {e.name: (State.SUCCEEDED, None, smaller_pays(e).metrics["throughput"]) for e in launched})
    assert rebuilt.stages == search.stages and rebuilt.propose(1, 0.0) == []

    # unbounded: doubling from 1 runs 16, the best, long before the largest is known; it keeps the config's 2
    launched.clear()
    doubling = MicroBatchSearch(spec(stages=(3,), max_mbs=MAX_MICRO_BATCH, base={"gradient_accumulation_steps": 2},
                                     confirm=3))
    simulate([], {"h": [0]}, lambda e: 10.0, outcome=lambda e: launched.append(e) or smaller_pays(e),
             searcher=doubling, metric="throughput")
    names = {e.name: e.ds_config["gradient_accumulation_steps"] for e in launched}
    assert names["t_z3_mbs16"] == 2 and names["t_z3_mbs16_confirm1"] == 2
    for changes in ({"global_batch": 64}, {"base": {"gradient_accumulation_steps": "auto"}}):
        assert spec(**changes).config_accumulation() is None
    assert accumulation_spec(Path(tempfile.mkdtemp())).config_accumulation() is None


def gas_outcome(e):
    """fake_gpu, with each doubling of the accumulation 5% faster (fewer optimizer steps a sample)."""
    out = fake_gpu(e)
    if out.state != State.SUCCEEDED:
        return out
    gas = e.ds_config["gradient_accumulation_steps"]
    return Outcome(State.SUCCEEDED, metrics={"throughput": out.metrics["throughput"] * 1.05 ** math.log2(gas)})


def test_gradient_accumulation_given_as_a_list_is_searched_at_each_stages_best_size(tmp_path):
    """The micro-batch search runs at the list's first value (1); then each stage's best size is run with 2 and 4
    (the config's own key, in the name as _gas2), and the winner is the largest accumulation at the best stage."""
    search = MicroBatchSearch(accumulation_spec(tmp_path))
    launched = []
    simulate([], {"h": [0, 1, 2, 3]}, lambda e: 10.0, outcome=lambda e: launched.append(e) or gas_outcome(e),
             searcher=search, metric="throughput")
    plain = [e for e in launched if "_gas" not in e.name]
    assert plain and all(e.ds_config["gradient_accumulation_steps"] == 1 for e in plain)
    swept = {e.name for e in launched if "_gas" in e.name}
    assert swept == {"t_z1_mbs33_gas2", "t_z1_mbs33_gas4", "t_z2_mbs53_gas2", "t_z2_mbs53_gas4",
                     "t_z3_mbs90_gas2", "t_z3_mbs90_gas4"}
    assert all(e.ds_config["gradient_accumulation_steps"] == int(e.name.split("_gas")[1]) for e in launched
               if "_gas" in e.name)
    assert all("gradient_accumulation_steps" not in e.ds_config["zero_optimization"] for e in launched)
    assert max(search.configs, key=search.mean) == "t_z3_mbs90_gas4"


@pytest.mark.parametrize("tuner", ["random", "model_based"])
def test_the_sampling_tuners_draw_the_accumulation_with_the_point_and_replay_it(tmp_path, tuner):
    """random and model_based draw the accumulation with the stage and size; a search rebuilt from the ledger reads
    each point's accumulation back from its config and goes on as the live one."""
    def fresh():
        return search_for(accumulation_spec(tmp_path, tuner=tuner, seed=1, trials=12, patience=None))

    live, launched = fresh(), {}
    simulate([], {"h": [0, 1]}, lambda e: 10.0, outcome=lambda e: launched.setdefault(e, gas_outcome(e)),
             searcher=live, metric="throughput")
    assert {e.name.split("_gas")[1] for e in launched if "_gas" in e.name} == {"2", "4"}
    assert all(e.ds_config["gradient_accumulation_steps"] == (int(e.name.split("_gas")[1]) if "_gas" in e.name
                                                              else 1) for e in launched)
    rebuilt = fresh()
    rebuilt.replay(list(launched), {e.name: (out.state, out.reason, (out.metrics or {}).get("throughput"))
                                    for e, out in launched.items()})
    assert rebuilt.knob_trials == live.knob_trials and rebuilt.trials == live.trials
    assert rebuilt.configs == live.configs


def test_the_open_points_listed_at_once_are_those_open_one_by_one(tmp_path):
    """`open_points` (what model_based draws from when TPE keeps choosing points tried) works out each stage's
    bound once: the same points, in the same order, as asking `open` of every point of the grid, mid-search."""
    search = search_for(full_spec(tmp_path, tuner="random", seed=3, trials=40, patience=None))
    grid = sizes(search.spec)
    for _ in range(12):
        for e in search.propose(3, 0.0):
            out = fake_gpu(e)
            search.learn(e, out.state, out.reason, (out.metrics or {}).get("throughput"))
        every = [(s, m, k) for s in search.spec.stages for m in grid for k in search.settings(s)
                 if search.open(s, m, k)]
        assert search.open_points(grid) == every
    assert search.knob_oom or any(known.too_big for known in search.stages.values())  # some ruled out on the way
