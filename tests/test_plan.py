"""`autotune plan`: the real scheduler and policies on a simulated clock, checked against makespans worked out by
hand, against a real stand-in sweep's measured durations, and through the command line."""
import json
import random
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import autotuner
from autotuner.errors import UserError
from autotuner.ledger.store import Ledger
from autotuner.planning.plan import plan_sweep
from autotuner.planning.simulate import simulate
from autotuner.states import State

from cli_rig import autotune
from helpers import experiment

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "benchmarks" / "standin.sh"
STEPS_STANDIN = Path(__file__).parent / "steps_standin.py"


def seconds_of(table):
    return lambda e: table[e.name]


def test_equal_experiments_fill_every_slot():
    exps = [experiment(f"e{i}") for i in range(4)]
    t = simulate(exps, {"h": [0, 1]}, lambda e: 10.0)
    assert t.makespan == 20.0 and t.utilisation == 1.0
    assert sorted((p.name, p.start, p.end) for p in t.played) == [
        ("e0", 0.0, 10.0), ("e1", 0.0, 10.0), ("e2", 10.0, 20.0), ("e3", 10.0, 20.0)]


def test_backfill_and_fifo_against_hand_computed_makespans():
    """small1 (1 slot, 30 s), big (2 slots, 10 s), small2 (1 slot, 5 s) on 2 slots.
    backfill: small2 overtakes big (0-5), big waits for small1 (30-40): 40 s.
    fifo: small2 waits behind big: small1 0-30, big 30-40, small2 40-45: 45 s."""
    exps = [experiment("small1"), experiment("big", num_gpus=2), experiment("small2")]
    took = seconds_of({"small1": 30.0, "big": 10.0, "small2": 5.0})
    backfill = plan_sweep(exps, {"h": [0, 1]}, queues=["backfill", "fifo"], timeout=None,
                          past=None).policies
    assert [p.queue for p in backfill] == ["backfill", "fifo"]
    t = simulate(exps, {"h": [0, 1]}, took)
    assert {p.name: (p.start, p.end) for p in t.played} == {
        "small1": (0.0, 30.0), "small2": (0.0, 5.0), "big": (30.0, 40.0)}
    from autotuner.planning.plan import QUEUES

    t = simulate(exps, {"h": [0, 1]}, took, queue=QUEUES["fifo"])
    assert {p.name: (p.start, p.end) for p in t.played} == {
        "small1": (0.0, 30.0), "big": (30.0, 40.0), "small2": (40.0, 45.0)}


def test_pack_and_spread_differ_as_worked_out_by_hand():
    """Two 2-slot experiments then one 4-slot one on two 4-slot hosts, 10 s each: pack puts both 2-slot ones
    on host a and the 4-slot one on b (10 s); spread puts them on a and b, and the 4-slot one waits (20 s)."""
    exps = [experiment("x", num_gpus=2), experiment("y", num_gpus=2), experiment("z", num_gpus=4)]
    slots = {"a": [0, 1, 2, 3], "b": [0, 1, 2, 3]}
    plan = plan_sweep(exps, slots, default_seconds=10.0, placements=["pack", "spread"])
    pack, spread = plan.policies
    assert (pack.placement, pack.percentile(50)) == ("pack", 10.0)
    assert (spread.placement, spread.percentile(50)) == ("spread", 20.0)
    assert {p.name: dict(p.slots) for p in pack.expected.played} == {
        "x": {"a": (0, 1)}, "y": {"a": (2, 3)}, "z": {"b": (0, 1, 2, 3)}}
    assert plan.lower_bound == 10.0  # max(80 slot-s / 8 slots, longest 10 s)


def test_a_run_longer_than_its_timeout_is_ended_there():
    exps = [experiment("long", timeout=30.0), experiment("default")]
    t = simulate(exps, {"h": [0]}, lambda e: 100.0, timeout=50.0)
    assert {p.name: (p.start, p.end, p.state) for p in t.played} == {
        "long": (0.0, 30.0, State.TIMED_OUT), "default": (30.0, 80.0, State.TIMED_OUT)}
    plan = plan_sweep(exps, {"h": [0]}, default_seconds=100.0, timeout=50.0)
    assert plan.work == 80.0 and plan.longest == 50.0


def test_multi_node_experiments_take_whole_hosts_and_the_lower_bound_counts_their_slots():
    exps = [experiment("wide", num_nodes=2, num_gpus=2), experiment("one")]
    plan = plan_sweep(exps, {"a": [0, 1], "b": [0, 1]}, default_seconds=10.0)
    played = {p.name: p for p in plan.policies[0].expected.played}
    assert dict(played["wide"].slots) == {"a": (0, 1), "b": (0, 1)} and played["one"].start == 10.0
    assert plan.work == 50.0 and plan.lower_bound == 12.5


def test_monte_carlo_percentiles_are_ordered_reproducible_and_shared_by_the_policies():
    exps = [experiment(f"e{i}") for i in range(40)]
    one = plan_sweep(exps, {"h": [0, 1, 2, 3]}, default_seconds=60.0, spread=0.5, samples=200, seed=7,
                     queues=["backfill", "fifo"])
    again = plan_sweep(exps, {"h": [0, 1, 2, 3]}, default_seconds=60.0, spread=0.5, samples=200, seed=7)
    p = one.policies[0]
    assert p.percentile(10) < p.percentile(50) < p.percentile(90)
    assert p.makespans == again.policies[0].makespans
    assert one.policies[1].makespans == p.makespans  # equal experiments: both policies see the same draws
    assert 0.8 < p.percentile(50) / 600.0 < 1.3  # 40 x 60 s on 4 slots is 600 s at the estimates


def test_durations_come_from_a_sweep_already_run_then_the_estimate_then_the_median_then_the_default(tmp_path):
    took = {"quick": 0.3, "slow": 1.2}
    exps = [experiment(name, script=str(STANDIN), env={"STANDIN_SECONDS": str(s)}) for name, s in took.items()]
    sweep = autotuner.Sweep(name="past", experiments=tuple(exps), metric=autotuner.metric_named("throughput"),
                            source="test")
    directory = autotuner.prepare(sweep, autotuner.load_cluster(slots=2), tmp_path / "past",
                                  launcher=["sh", str(STANDIN)])
    result = autotuner.execute(directory, autotuner.Options(grace=1.0))
    assert result.exit_code == 0
    ran = {a.name: a.finished_at - a.started_at for a in result.snapshot.attempts}
    assert ran["quick"] < ran["slow"]
    again = [*exps, experiment("guessed", estimate=42.0), experiment("unknown")]
    plan = plan_sweep(again, {"h": [0, 1]}, past=directory)
    # the stand-in reports a step of 1 us: its runs are start-up, and the unknown one takes their median
    assert plan.durations.origin == {"quick": "measured", "slow": "measured", "guessed": "estimate",
                                     "unknown": "start-up + steps"}
    assert plan.durations.seconds["quick"] == pytest.approx(ran["quick"])
    assert plan.durations.seconds["slow"] == pytest.approx(ran["slow"])
    assert plan.durations.seconds["unknown"] == pytest.approx((ran["quick"] + ran["slow"]) / 2, abs=1e-3)
    assert plan_sweep([experiment("fresh")], {"h": [0]}).durations.origin == {"fresh": "default"}


def _steps_sweep(tmp_path: Path, name: str, sizes: list[int], end_profile_step: int | None,
                 environ: dict[str, str] | None = None) -> tuple[Path, list[autotuner.Experiment]]:
    """A sweep of the steps stand-in, run: one experiment per micro-batch size (a size again: `mbsN_again`, the
    same config)."""
    profile = {} if end_profile_step is None else {"autotuning": {"end_profile_step": end_profile_step}}
    names = [f"mbs{m}" if f"mbs{m}" not in [f"mbs{x}" for x in sizes[:i]] else f"mbs{m}_again"
             for i, m in enumerate(sizes)]
    exps = [experiment(n, script=str(STEPS_STANDIN), env=environ or {},
                       ds_config={"train_micro_batch_size_per_gpu": m, **profile})
            for n, m in zip(names, sizes, strict=True)]
    sweep = autotuner.Sweep(name=name, experiments=tuple(exps), metric=autotuner.metric_named("throughput"),
                            source="test")
    return autotuner.prepare(sweep, autotuner.load_cluster(slots=2), tmp_path / name,
                             launcher=[sys.executable, str(STEPS_STANDIN)]), exps


def test_a_longer_profile_is_planned_as_the_start_up_plus_the_steps_at_each_configs_measured_step_time(tmp_path):
    past, _ = _steps_sweep(tmp_path, "short", [1, 4], None)  # DeepSpeed's default profile: 6 steps
    assert autotuner.execute(past, autotuner.Options(grace=1.0)).exit_code == 0
    cuts = {}
    for a in autotuner.snapshot(past).attempts:
        per_step = a.metrics["latency"] / 1e6
        cuts[a.name] = (a.finished_at - a.started_at - 6 * per_step, per_step)
    _, exps = _steps_sweep(tmp_path, "long", [1, 4, 2], 29)  # 30 steps
    planned = plan_sweep(exps, {"h": [0, 1]}, past=past).durations
    assert planned.origin == {"mbs1": "scaled", "mbs4": "scaled", "mbs2": "start-up + steps"}
    for name, (startup, per_step) in cuts.items():
        assert planned.seconds[name] == pytest.approx(startup + 30 * per_step)
    startups, steps = zip(*cuts.values(), strict=True)
    assert planned.seconds["mbs2"] == pytest.approx(statistics.median(startups) + 30 * statistics.median(steps))
    # How near the longer sweep run for real this comes is a measurement, not a test: it moves with the machine's
    # load between the two sweeps (benchmarks/plan.py; BENCHMARKS.md, "plan from start-up and step time apart").


def test_a_script_that_writes_its_steps_is_planned_from_the_ledgers_start_up_and_step_time(tmp_path):
    """No `latency` (a script's own metric), but its steps in the progress file: the ledger's measured step time
    splits each run (start-up: the run less its steps), so a plan for 30 steps where the earlier sweep made 6 is
    each config's start-up plus 30 of its steps, nearer the real run than the earlier run's whole duration (which
    the plan used before: the same name, "measured"); the spreads are the measured ones."""
    written = {"STEPS_PROGRESS": "1"}
    past, _ = _steps_sweep(tmp_path, "short", [1, 4, 4], None, written)  # 6 steps each; mbs4 twice
    assert autotuner.execute(past, autotuner.Options(grace=1.0)).exit_code == 0
    with Ledger.open(past) as ledger:
        timings = {name: t for (name, _), t in ledger.measures().items()}
    runs = {a.name: a for a in autotuner.snapshot(past).attempts}
    assert all("latency" not in a.metrics for a in runs.values()) and set(timings) == set(runs)
    # The steps made: the 4 before its measured window (DeepSpeed's default start_profile_step 3 + 1) and those
    cuts = {n: (runs[n].duration - (4 + timings[n].steps) * timings[n].step_seconds, timings[n].step_seconds)
            for n in runs}
    assert all(timings[n].steps == 2 and cuts[n][0] >= 0.3 for n in runs)
    _, exps = _steps_sweep(tmp_path, "long", [1, 4, 2], 29, written)  # 30 steps
    planned = plan_sweep(exps, {"h": [0, 1]}, past=past).durations
    assert planned.origin == {"mbs1": "scaled", "mbs4": "scaled", "mbs2": "start-up + steps"}
    four = [cuts["mbs4"], cuts["mbs4_again"]]
    assert planned.seconds["mbs1"] == pytest.approx(cuts["mbs1"][0] + 30 * cuts["mbs1"][1])
    assert planned.seconds["mbs4"] == pytest.approx(statistics.median(c[0] for c in four)
                                                   + 30 * statistics.median(c[1] for c in four))
    startups = [c[0] for c in cuts.values()]
    parts = planned.parts["mbs2"]
    assert parts.steps == 30 and parts.startup == pytest.approx(statistics.median(startups))
    assert parts.startup_spread == pytest.approx(statistics.stdev(startups) / statistics.fmean(startups))
    ratio = [c[1] / statistics.median(x[1] for x in four) for c in four]
    assert parts.step_spread == pytest.approx(statistics.fmean((r - 1) ** 2 for r in ratio) ** 0.5)
    # How near the real 30-step runs this comes is a measurement, not a test: it moves with the machine's load
    # between the two sweeps (benchmarks/plan.py steps; BENCHMARKS.md, "plan from start-up and step time apart").


def test_a_run_is_cut_by_the_steps_it_made_where_it_reported_fewer():
    """The steps a run made: those before its measured window (4 of DeepSpeed's default profile, 6 steps) and those
    it measured: one that measured 2 is cut by 6 of its steps; a script that measured more than the profile's
    by those and its first 4; DeepSpeed's latency alone, by the profile's 6."""
    from autotuner.planning.durations import Split, split
    from autotuner.spec.interval import RunTimes

    e = experiment("e")
    assert split(e, 10.0, {}, RunTimes(8.0, 0.1, 2, None)) == Split(pytest.approx(9.4), 0.1)
    assert split(e, 10.0, {}, RunTimes(1.0, 0.1, 46, None)) == Split(pytest.approx(5.0), 0.1)
    assert split(e, 10.0, {"latency": 1e5}, None) == Split(pytest.approx(9.4), 0.1)  # DeepSpeed's latency alone


def test_a_start_up_and_steps_draw_each_by_its_own_spread():
    """Monte Carlo of an estimate made of parts: the start-up drawn by its spread, the steps by theirs; with no
    spread of the start-up, no draw is shorter than it; their mean is the estimate."""
    from autotuner.planning.durations import Durations, Parts
    from autotuner.planning.plan import _draw

    exps = [experiment("e")]
    fixed = Durations({"e": 40.0}, {"e": "scaled"}, {"e": Parts(10.0, 1.0, 30, 0.0, 0.5)})
    rng = random.Random(1)
    draws = [_draw(exps, fixed, 0.0, rng)["e"] for _ in range(4000)]
    assert min(draws) > 10.0 and statistics.fmean(draws) == pytest.approx(40.0, rel=0.03)
    assert statistics.stdev(draws) == pytest.approx(30 * 0.5, rel=0.1)
    startup = Durations({"e": 40.0}, {"e": "scaled"}, {"e": Parts(10.0, 1.0, 30, 0.2, 0.0)})
    draws = [_draw(exps, startup, 0.0, rng)["e"] for _ in range(4000)]
    assert min(draws) > 30.0 and statistics.stdev(draws) == pytest.approx(10 * 0.2, rel=0.1)
    assert plan_sweep(exps, {"h": [0]}).samples == 1  # nothing measured, no --spread: the estimate alone


def test_bad_plan_arguments_are_one_clear_error():
    exps = [experiment("e")]
    for kwargs, fragment in [({"queues": ["lifo"]}, "not a queue policy"),
                             ({"placements": ["random"]}, "not a placement"),
                             ({"spread": -1.0}, "--spread"), ({"spread": float("nan")}, "--spread"),
                             ({"samples": 0}, "--samples")]:
        with pytest.raises(UserError, match=fragment):
            plan_sweep(exps, {"h": [0]}, **kwargs)
    with pytest.raises(UserError, match="nothing to plan"):
        plan_sweep([], {"h": [0]})


# --- the command line ------------------------------------------------------------------------------------------
SWEEP = """{
  name: p
  script: train.py
  estimate: 20
  timeout: 300
  ds_config: {train_micro_batch_size_per_gpu: 1}
  space: {"zero_optimization.stage": [0, 1, 2], "train_micro_batch_size_per_gpu": [4, 32]}
}
"""


def sweep_file(tmp_path, body=SWEEP):
    (tmp_path / "train.py").write_text("# stand-in\n")
    path = tmp_path / "sweep.hjson"
    path.write_text(body)
    return path


def test_plan_prints_each_policy_and_the_schedule_and_launches_nothing(tmp_path):
    spec = sweep_file(tmp_path)
    result = autotune("plan", spec, "--slots", "2", "--policy", "backfill,fifo", "--placement", "pack,spread",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "plan: 6 experiments on 2 slot(s) of 1 host(s); durations: 6 estimate" in out
    assert out.count("1m00s") >= 4 and "backfill" in out and "fifo" in out and "spread" in out
    assert "p_z2_mbs32" in out and "expected schedule" in out
    assert not (tmp_path / "results").exists()


def test_plan_json_lists_every_experiment_and_the_plot_is_drawn(tmp_path):
    spec = sweep_file(tmp_path)
    result = autotune("plan", spec, "--slots", "2", "--format", "json", "--spread", "0.2", "--samples", "50",
                      "--plot", tmp_path / "plan.png", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["experiments"] == 6 and data["slots"] == 2 and data["lower_bound_s"] == 60.0
    first = data["plans"][0]
    assert len(first["experiments"]) == 6 and first["makespan_s"]["at_estimates"] == 60.0
    assert first["makespan_s"]["p10"] <= first["makespan_s"]["p50"] <= first["makespan_s"]["p90"]
    assert (tmp_path / "plan.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(("args", "fragment"), [
    (["--policy", "lifo"], "--policy"),
    (["--placement", ""], "--placement"),
    (["--format", "yaml"], "--format"),
    (["--duration", "0"], "--duration"),
    (["--duration", "1e12"], "--duration"),
    (["--spread", "-0.5"], "--spread"),
    (["--from", "/nonexistent/sweep"], "nonexistent"),
    (["--plot", "/nonexistent/dir/plan.png"], "plot"),
])
def test_plan_refuses_bad_options_in_one_line(tmp_path, args, fragment):
    spec = sweep_file(tmp_path)
    result = autotune("plan", spec, "--slots", "2", *args, cwd=tmp_path)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr and fragment in lines[0], result.stderr


def test_a_bad_estimate_in_the_sweep_file_is_located(tmp_path):
    spec = sweep_file(tmp_path, SWEEP.replace("estimate: 20", "estimate: -3"))
    result = autotune("plan", spec, "--slots", "2", cwd=tmp_path)
    assert result.returncode == 2 and "sweep.hjson:4" in result.stderr and "estimate" in result.stderr


# --- the live view's ETA: what is left, re-planned -------------------------------------------------------------
def test_time_left_replans_what_waits_and_what_runs_as_worked_out_by_hand():
    """Runs seen took 10 s each; one has run 5 s: 5 s are left. Two queued take 10 s each on 2 slots: one
    starts now (ends at 10), the other when the running one ends (5 -> 15)."""
    from autotuner.planning.plan import Ongoing, time_left

    running = [Ongoing(experiment("r"), {"h": [0]}, 5.0)]
    left = time_left({"h": [0, 1]}, [experiment("q1"), experiment("q2")], running, [10.0, 10.0, 10.0])
    assert left == pytest.approx(15.0)


def test_a_run_past_every_run_seen_is_expected_in_the_tail_but_never_past_its_timeout():
    """Seen: 10 and 10 s; one has run 12 s. What ended says nothing past 12 s: the tail is put at 1.5 x the
    longest time seen (18 s), so 6 s are left; a timeout at 15 s leaves 3."""
    from autotuner.planning.plan import Ongoing, time_left

    seen = [10.0, 10.0]
    assert time_left({"h": [0]}, [], [Ongoing(experiment("r"), {"h": [0]}, 12.0)], seen) == pytest.approx(6.0)
    capped = Ongoing(experiment("r", timeout=15.0), {"h": [0]}, 12.0)
    assert time_left({"h": [0]}, [], [capped], seen) == pytest.approx(3.0)
    assert time_left({"h": [0]}, [], [Ongoing(experiment("r"), {"h": [0]}, 12.0)], seen, timeout=13.0) == \
        pytest.approx(1.0)


def test_survival_learns_from_runs_under_way_not_only_from_those_that_ended():
    """Early in a sweep the runs that ended are the short ones: 2 ended at 1 s while 2 still run at 5 s.
    Counting only the ended says every run takes 1 s; the runs under way say half of them take longer."""
    import random

    from autotuner.planning.plan import Survival

    survival = Survival([1.0, 1.0], [5.0, 5.0])
    assert survival.values == [1.0, 7.5] and survival.weights == pytest.approx([0.5, 0.5])
    rng = random.Random(0)
    assert {survival.draw(rng, longer_than=5.0) for _ in range(20)} == {7.5}
    assert survival.draw(rng, longer_than=9.0) == pytest.approx(13.5)  # past the tail too


def test_time_left_needs_something_to_go_on_and_counts_hosts_that_are_down():
    from autotuner.planning.plan import time_left

    assert time_left({"h": [0]}, [experiment("q")], [], []) is None  # nothing seen, no estimate
    assert time_left({"h": [0]}, [experiment("q", estimate=30.0)], [], []) == 30.0
    assert time_left({"h": [0]}, [], [], []) == 0.0
    two = [experiment("a"), experiment("b")]
    assert time_left({"x": [0], "y": [0]}, two, [], [10.0]) == 10.0
    assert time_left({"x": [0], "y": [0]}, two, [], [10.0], down=["y"]) == 20.0


def test_a_sweep_too_large_for_every_draw_plays_fewer_and_says_so(monkeypatch):
    import autotuner.planning.plan as planning
    from autotuner.views.plan import render_plan

    monkeypatch.setattr(planning, "RUN_BUDGET", 1000)
    plan = plan_sweep([experiment(f"e{i}") for i in range(100)], {"h": [0, 1]}, spread=0.3, samples=100)
    assert (plan.samples, plan.samples_asked) == (9, 100) and len(plan.policies[0].makespans) == 9
    assert "9 draws (of the 100 asked" in render_plan(plan).splitlines()[0]


def test_time_left_keeps_experiments_on_their_gpu_type():
    """Two hosts of one slot, of types A and B; four queued experiments of 10 s pinned to A run one after
    another on A's one slot (40 s), not two at a time on both (20 s)."""
    from autotuner.core.placement import placement_named
    from autotuner.planning.plan import time_left

    queued = [replace(experiment(f"q{i}", estimate=10.0), gpu_type="A") for i in range(4)]
    slots = {"a": [0], "b": [0]}
    assert time_left(slots, queued, [], []) == pytest.approx(20.0)  # blind to types
    typed = placement_named("pack", {"a": "A", "b": "B"})
    assert time_left(slots, queued, [], [], placement=typed) == pytest.approx(40.0)
