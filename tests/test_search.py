"""`autotune tune`'s micro-batch search, driven by the real scheduler on a simulated clock against a fake GPU
(named as such): a run needs memory that grows with its ZeRO stage and micro-batch size and fails with the
runtime's OOM message past a limit; its throughput is a known function."""
from autotuner.outcome import Outcome
from autotuner.search import MicroBatchSearch, SearchSpec
from autotuner.simulate import simulate
from autotuner.states import Reason, State

LIMIT = 100.0  # GiB of the fake GPU
NEED = {0: (40.0, 2.0), 1: (30.0, 2.0), 2: (20.0, 1.5), 3: (10.0, 1.0)}  # stage -> (fixed, per sample)


def fits(stage, mbs):
    fixed, per = NEED[stage]
    return fixed + per * mbs <= LIMIT


def throughput(stage, mbs):
    """Grows with the micro-batch size, less with every stage (more communication)."""
    return mbs * 100 / (1 + mbs / 64) * (1 - 0.05 * stage)


def fake_gpu(e):
    stage, mbs = e.ds_config["zero_optimization"]["stage"], e.ds_config["train_micro_batch_size_per_gpu"]
    if not fits(stage, mbs):
        return Outcome(State.FAILED, Reason.OOM, "torch.OutOfMemoryError: CUDA out of memory", 1)
    return Outcome(State.SUCCEEDED, metrics={"throughput": throughput(stage, mbs)})


def spec(**changes):
    base = dict(prefix="t", template={"script": "/x/train.py", "num_gpus": 1, "num_nodes": 1, "args": []},
                base={"gradient_accumulation_steps": 1}, stages=(0, 1, 2, 3), metric="throughput", max_mbs=256)
    return SearchSpec(**(base | changes))


def tune(search, slots=4):
    return simulate([], {"h": list(range(slots))}, lambda e: 10.0, outcome=fake_gpu, source=search,
                    metric="throughput")


def place(name):
    _, z, mbs = name.split("_")[:3]
    return int(z[1:]), int(mbs[3:])


def test_the_search_finds_the_grids_best_with_a_fraction_of_its_experiments():
    played = tune(MicroBatchSearch(spec())).played
    grid = {(z, m): throughput(z, m) for z in NEED for m in range(1, 257) if fits(z, m)}
    best = max(grid, key=grid.get)
    ran = {place(p.name): p.state for p in played}
    found = max((k for k, state in ran.items() if state == State.SUCCEEDED), key=lambda k: throughput(*k))
    assert found == best == (3, 90)
    for stage in NEED:  # the largest micro-batch size that fits, found exactly, for every stage
        largest = max(m for z, m in grid if z == stage)
        assert ran[(stage, largest)] == State.SUCCEEDED and ran[(stage, largest + 1)] == State.FAILED
    assert len(played) <= 60 < len(grid)


def test_no_size_known_not_to_fit_is_ever_launched():
    played = sorted(tune(MicroBatchSearch(spec())).played, key=lambda p: p.start)
    smallest_oom: dict[int, int] = {}
    for p in played:
        stage, mbs = place(p.name)
        assert mbs < smallest_oom.get(stage, 10**9), f"{p.name} launched after an OOM at {smallest_oom[stage]}"
        if p.state == State.FAILED:
            smallest_oom[stage] = min(mbs, smallest_oom.get(stage, 10**9))


def test_a_stage_that_cannot_fit_at_all_costs_one_run_and_a_crash_gives_a_stage_up():
    NEED[4] = (120.0, 1.0)  # never fits
    try:
        played = tune(MicroBatchSearch(spec(stages=(4, 3)))).played
    finally:
        del NEED[4]
    assert [p.name for p in played if place(p.name)[0] == 4] == ["t_z4_mbs1"]

    def broken(e):  # stage 2 refuses its config: not an answer about sizes
        if e.ds_config["zero_optimization"]["stage"] == 2:
            return Outcome(State.FAILED, Reason.CONFIG, "DeepSpeedConfigError", 1)
        return fake_gpu(e)

    search = MicroBatchSearch(spec(stages=(2, 3)))
    played = simulate([], {"h": [0, 1]}, lambda e: 10.0, outcome=broken, source=search, metric="throughput").played
    assert [p.name for p in played if place(p.name)[0] == 2] == ["t_z2_mbs1"]


def test_gradient_accumulation_keeps_the_global_batch_and_the_budget_and_patience_stop_it():
    search = MicroBatchSearch(spec(stages=(3,), global_batch=512, max_mbs=512 // 4,
                                   template={"script": "/x", "num_gpus": 4, "num_nodes": 1, "args": []}))
    played = simulate([], {"h": list(range(8))}, lambda e: 10.0, outcome=fake_gpu, source=search,
                      metric="throughput").played
    for p in played:
        _, mbs = place(p.name)
        assert p.name.endswith(f"_gas{512 // (mbs * 4)}")
    assert len(tune(MicroBatchSearch(spec(trials=7))).played) == 7
    assert len(tune(MicroBatchSearch(spec(stages=(3,), patience=2)), slots=1).played) < \
        len(tune(MicroBatchSearch(spec(stages=(3,))), slots=1).played)


def test_a_search_rebuilt_from_the_ledger_makes_the_same_decisions():
    """Stop after some runs ended (a crash), rebuild from what the record holds, go on: the same experiments
    as a run that was never interrupted, none twice."""
    whole = {p.name for p in tune(MicroBatchSearch(spec()), slots=2).played}
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
    rest = simulate(proposed[1:], {"h": [0, 1]}, lambda e: 10.0, outcome=fake_gpu, source=rebuilt,
                    metric="throughput").played
    assert {p.name for p in rest} | set(ended) == whole
    assert len(rest) + len(ended) == len(whole)
