"""`autotune tune`'s tuners against the full grid, through the real runner, on the stand-in launcher with a fake
GPU (tests/oom_standin.sh: a run past the fake GPU's memory fails with the runtime's OOM message; throughput is a
known function of ZeRO stage and micro-batch size, best at the largest size that fits, of stage 3).

  python benchmarks/tune_search.py --seeds 5 --slots 3 --seconds 0.3

The space: ZeRO stages 0-3 x micro-batch sizes up to 256. The full grid is every stage x 1, 2, 4, ... 256 (36
experiments), the grid the random and model_based tuners draw from; gridsearch (the structured walk) also measures
sizes between its points, so its best may lie off the grid: --every-size also runs the grid of every size
(1,024 experiments), the space it searches. Each run sleeps --seconds, OOM or not.

For each: experiments until the config it names the winner first ran, and in all (with the re-runs that confirm
the winner); slot-seconds until the winner's first run ended, and in all; the winner's true throughput against the
grid's best. The sampling tuners run with DeepSpeed's default budget (tuner_num_trials 50, tuner_early_stopping
5) and with a larger patience (36: the whole grid if need be), over --seeds seeds; the mean is printed, and how
many seeds found a config at least as good as the grid's best.

--full plays full mode (fast: false, ZeRO's knobs too: the stand-in counts them as known factors) on the simulated
clock: gridsearch's knob sweep against the grid of every knob setting at each stage's best size.

--sampled-full N plays random and model_based in full mode (every stage's knobs: 1,386 points) on the simulated
clock, N seeds, with DeepSpeed's defaults and with larger budgets (--budgets, no early stopping): past 62 trials
model_based asks TPE fewer times a decision (tune/model_based.py, READS), which changes its draws there.

--memory runs the tuners with and without the memory model (autotuner/tune/memory_model.py), through the real
runner, on the stand-in's DeepSpeed-like fake GPU (OOM_STANDIN_MODEL: 5e9 parameters in fp16 with Adam, 1e9 bytes
of activations a sample, each experiment on 2 GPUs of an "A100-80GB", 80e9 bytes; stage 0 cannot fit, the largest
sizes that fit are 28, 33, 38 for stages 1-3, the best z3 mbs38): without a model (the hostfile states no GPU type),
with `model_info` stated, and with the profile run finding the facts; and the same on the simulated clock.

--unknown runs the case of a new user whose GPUs' memory autotune cannot read (CPU slots, no `gpu=`): every ZeRO
stage, sizes up to 1,024 (the power-of-two grid: 44 experiments), the stand-in's plain rule (largest sizes that fit
30, 35, 40, 45 for stages 0-3; the best z3 mbs45): the power-of-two grid, then gridsearch with the confirming
re-runs as `autotune tune` runs them, through the real runner; with --simulated N, the same on the simulated clock
with 1 to 4 slots.

--loop plays, on the simulated clock, the stand-in's DeepSpeed-like fake GPU (OOM_STANDIN_MODEL's rule) with
`model_info` stating the activations wrong (half, twice), each run reporting its peak memory or not: OOM runs and
experiments with the loop closed against without it; and a model of which 1% of the parameters train (LoRA-like)
with `trainable_num_params` counted apart against all counted as trainable.

--offload runs, through the real runner, a model that fits no stage without offload (OOM_STANDIN_MODEL: 1e9
parameters in fp16 with Adam, 5e7 bytes of activations a sample, 2 GPUs of 8e9 bytes, "X-8GB"; ZeRO-3 alone holds
8e9): with `model_info` on the known GPU, and with the GPU's memory unknown (no gpu=). The search goes on with the
optimizer offloaded (the stand-in: states off the GPU into the host's RAM, 16e9 on the node, steps 0.6x as fast):
experiments, OOM runs, runs without offload, runs that exhausted the node, the winner against the true best.

--simulated N plays the same searches N seeds each on the scheduler's simulated clock
(autotuner.planning.simulate, every run 10 s) with the stand-in's rule as the outcome: the figures of many seeds,
which a few real runs cannot give.
It also plays model_based with an OOM told to TPE as FAIL instead of PRUNED (a subclass here, for comparison).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import autotuner  # noqa: E402
from autotuner.core.outcome import Outcome  # noqa: E402

STANDIN = ROOT / "tests" / "oom_standin.sh"
STAGES, MAX_MBS = (0, 1, 2, 3), 256
GRID = [(stage, 2 ** k) for stage in STAGES for k in range(9)]
EVERY_SIZE = [(stage, mbs) for stage in STAGES for mbs in range(1, MAX_MBS + 1)]


def fits(stage: int, mbs: int) -> bool:
    """The stand-in's memory rule."""
    return {0: 40, 1: 30, 2: 20, 3: 10}[stage] + 2.0 * mbs <= 100


def throughput(stage: int, mbs: int) -> float:
    """The stand-in's throughput (the true value, without noise)."""
    return mbs * 100 / (1 + mbs / 64) * (1 - 0.05 * stage)


GRID_BEST = max((p for p in GRID if fits(*p)), key=lambda p: throughput(*p))


def write_config(work: Path, autotuning: dict) -> None:
    (work / "train.py").write_text("# stand-in: the launcher never runs it\n")
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": list(STAGES)},
              "autotuning": {"enabled": True, "metric": "throughput", "max_train_micro_batch_size_per_gpu": MAX_MBS}
              | autotuning}
    (work / "ds.json").write_text(json.dumps(config))


def run_tune(work: Path, slots: int, tuner: str, seed: int, patience: int | None) -> autotuner.Snapshot:
    write_config(work, {"tuner_type": tuner} | ({"tuner_early_stopping": patience} if patience else {}))
    cluster = autotuner.load_cluster(slots=slots)
    directory = autotuner.prepare_tune(str(work / "train.py"), ["--deepspeed_config", "ds.json"], cluster,
                                       work / "res", launcher=["sh", str(STANDIN)], cwd=work, seed=seed)
    return autotuner.execute(directory, autotuner.Options(grace=1.0)).snapshot


def run_grid(work: Path, slots: int, points: list[tuple[int, int]]) -> autotuner.Snapshot:
    (work / "train.py").write_text("# stand-in\n")
    experiments = tuple(
        autotuner.Experiment(name=f"grid_z{stage}_mbs{mbs}", num_gpus=1, num_nodes=1, script=str(work / "train.py"),
                             ds_config={"train_micro_batch_size_per_gpu": mbs, "zero_optimization": {"stage": stage}},
                             source="bench") for stage, mbs in points)
    sweep = autotuner.Sweep(name="grid", experiments=experiments, metric=autotuner.metric_named("throughput"),
                            source="bench")
    directory = autotuner.prepare(sweep, autotuner.load_cluster(slots=slots), work / "res",
                                  launcher=["sh", str(STANDIN)])
    return autotuner.execute(directory, autotuner.Options(grace=1.0)).snapshot


def measure(snap: autotuner.Snapshot) -> dict[str, float]:
    """Experiments and slot-seconds until the winner's first run ended, and in all; the winner's true value."""
    best = snap.best
    assert best is not None, snap.counts()
    config = snap.experiments[best.name].ds_config
    point = (config["zero_optimization"]["stage"], config["train_micro_batch_size_per_gpu"])
    ran = sorted((a for a in snap.attempts if a.started_at is not None), key=lambda a: a.started_at)
    until = best.finished_at

    def slot_seconds(end: float) -> float:
        return sum(max(0.0, min(a.finished_at, end) - a.started_at) * sum(len(s) for s in a.slots.values())
                   for a in ran)

    return {"to_best": 1 + [a.name for a in ran].index(best.name), "experiments": len(ran),
            "ooms": sum(1 for a in ran if a.reason == "oom"), "slot_s_to_best": slot_seconds(until),
            "slot_s": slot_seconds(float("inf")), "wall_s": max(a.finished_at for a in ran) - ran[0].started_at,
            "quality": throughput(*point) / throughput(*GRID_BEST), "grid_best": float(at_least_grid_best(point))}


def at_least_grid_best(point: tuple[int, int]) -> bool:
    return throughput(*point) >= throughput(*GRID_BEST) - 1e-9


def row(label: str, results: list[dict[str, float]]) -> str:
    mean = {k: statistics.mean(r[k] for r in results) for k in results[0]}
    found = sum(r["grid_best"] for r in results)
    return (f"| {label} | {mean['to_best']:.1f} | {mean['experiments']:.1f} | {mean['ooms']:.1f} | "
            f"{mean['slot_s_to_best']:.1f} | {mean['slot_s']:.1f} | {mean['wall_s']:.1f} | {mean['quality']:.3f} | "
            f"{found:.0f}/{len(results)} |")


def simulated(tuner: str, seed: int, slots: int, patience: int | None) -> dict[str, float]:
    """One search played on the simulated clock: the same figures as `measure`."""
    from autotuner.planning.simulate import simulate
    from autotuner.tune.space import DEFAULT_PATIENCE, DEFAULT_TRIALS, SearchSpec
    from autotuner.tune.tuners import search_for

    def outcome(e: autotuner.Experiment) -> Outcome:
        point = (e.ds_config["zero_optimization"]["stage"], e.ds_config["train_micro_batch_size_per_gpu"])
        if not fits(*point):
            return Outcome(autotuner.State.FAILED, autotuner.Reason.OOM, "CUDA out of memory", 1)
        return Outcome(autotuner.State.SUCCEEDED, metrics={"throughput": throughput(*point)})

    sampled = tuner != "gridsearch"
    spec = SearchSpec(prefix="b", template={"script": "/b/train.py", "num_gpus": 1, "num_nodes": 1, "args": []},
                      base={}, stages=STAGES, metric="throughput", max_mbs=MAX_MBS, seed=seed,
                      tuner="model_based" if tuner == "told FAIL" else tuner,
                      trials=DEFAULT_TRIALS if sampled else None,
                      patience=(patience or DEFAULT_PATIENCE) if sampled else None)
    search = told_fail(spec) if tuner == "told FAIL" else search_for(spec)
    played = sorted(simulate([], {"h": list(range(slots))}, lambda e: 10.0, outcome=knob_outcome, searcher=search,
                             metric="throughput").played, key=lambda p: (p.start, p.name))
    winner = min(search.configs, key=lambda name: -search.mean(name))
    until = next(p.end for p in played if p.name == winner)
    point = search.configs[winner][:2]  # (stage, size); no knobs in fast mode
    return {"to_best": 1 + [p.name for p in played].index(winner), "experiments": len(played),
            "ooms": sum(1 for p in played if p.state == autotuner.State.FAILED),
            "slot_s_to_best": sum(max(0.0, min(p.end, until) - p.start) for p in played),
            "slot_s": sum(p.end - p.start for p in played), "wall_s": max(p.end for p in played),
            "quality": throughput(*point) / throughput(*GRID_BEST), "grid_best": float(at_least_grid_best(point))}


def told_fail(spec: object) -> object:
    """model_based with an OOM told to TPE as FAIL (what the tuner does not do), for comparison."""
    from autotuner.tune.model_based import ModelSearch

    class ToldFail(ModelSearch):
        def _state(self, stage: int, mbs: int, knobs: tuple = ()) -> tuple[object, float | None]:
            state, value = super()._state(stage, mbs, knobs)
            pruned = self.optuna.trial.TrialState.PRUNED
            return (self.optuna.trial.TrialState.FAIL if state == pruned else state), value

    return ToldFail(spec)  # type: ignore[arg-type]


HEADER = ("| | experiments to best | experiments | OOMs | slot-s to best | slot-s | wall s | best / grid's best | "
          "grid's best found |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|")


def simulated_table(seeds: int, slots: int) -> None:
    print(f"\nsimulated clock, every run 10 s, {slots} slots, mean of {seeds} seeds (gridsearch: one, it draws "
          "nothing)\n")
    print(HEADER)
    cases = [("gridsearch (structured)", "gridsearch", None)]
    for tuner in ("random", "model_based", "told FAIL"):
        label = "model_based, OOM told as FAIL" if tuner == "told FAIL" else tuner
        cases += [(f"{label}, DeepSpeed's defaults", tuner, None), (f"{label}, patience 36", tuner, 36)]
    for label, tuner, patience in cases:
        runs = 1 if tuner == "gridsearch" else seeds
        print(row(label, [simulated(tuner, seed, slots, patience) for seed in range(runs)]), flush=True)


MODEL = (5e9, 1e9, 80e9)  # the stand-in's model: parameters, activation bytes a sample, GPU bytes


def model_fits(stage: int, mbs: int) -> bool:
    """The stand-in's DeepSpeed-like rule (OOM_STANDIN_MODEL), on 2 GPUs."""
    params, per_sample, gpu = MODEL
    states = {0: 16 * params, 1: 4 * params + 6 * params, 2: 2 * params + 7 * params, 3: 8 * params}[stage]
    return states + per_sample * mbs + 1.5e9 <= gpu


MODEL_BEST = max(((z, m) for z in STAGES for m in range(1, MAX_MBS + 1) if model_fits(z, m)),
                 key=lambda p: throughput(*p))
VARIANTS = ("no model", "model_info", "profile run")


def run_memory_tune(work: Path, slots: int, tuner: str, seed: int, variant: str) -> autotuner.Snapshot:
    """One tune on the stand-in's DeepSpeed-like fake GPU: `variant` says where the model's facts come from."""
    (work / "train.py").write_text("# stand-in: the launcher never runs it\n")
    autotuning: dict = {"enabled": True, "metric": "throughput", "max_train_micro_batch_size_per_gpu": MAX_MBS,
                        "tuner_type": tuner}
    if variant == "model_info":
        autotuning["model_info"] = {"num_params": int(MODEL[0]), "activation_mem_per_gpu": int(MODEL[1])}
    config = {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True}, "autotuning": autotuning,
              "zero_optimization": {"stage": list(STAGES)}}
    (work / "ds.json").write_text(json.dumps(config))
    (work / "hostfile").write_text(f"localhost slots={slots}{'' if variant == 'no model' else ' gpu=A100-80GB'}\n")
    cluster = autotuner.load_cluster(hostfile=work / "hostfile")
    directory = autotuner.prepare_tune(str(work / "train.py"), ["--deepspeed_config", "ds.json"], cluster,
                                       work / "res", num_gpus=2, launcher=["sh", str(STANDIN)], cwd=work,
                                       seed=seed)
    return autotuner.execute(directory, autotuner.Options(grace=1.0)).snapshot


def measure_memory(snap: autotuner.Snapshot) -> dict[str, float]:
    """Experiments until the winner first started and in all (the profile run counted), OOM runs, wall seconds,
    the winner's true throughput against the best that fits."""
    best = snap.best
    assert best is not None, snap.counts()
    config = snap.experiments[best.name].ds_config
    point = (config["zero_optimization"]["stage"], config["train_micro_batch_size_per_gpu"])
    ran = sorted((a for a in snap.attempts if a.started_at is not None), key=lambda a: a.started_at)
    return {"to_best": 1 + [a.name for a in ran].index(best.name), "experiments": len(ran),
            "ooms": sum(1 for a in ran if a.reason == "oom"),
            "wall_s": max(a.finished_at for a in ran) - ran[0].started_at,
            "quality": throughput(*point) / throughput(*MODEL_BEST), "found": float(point == MODEL_BEST)}


def memory_row(label: str, results: list[dict[str, float]]) -> str:
    mean = {k: statistics.mean(r[k] for r in results) for k in results[0]}
    return (f"| {label} | {mean['to_best']:.1f} | {mean['experiments']:.1f} | {mean['ooms']:.1f} | "
            f"{mean['wall_s']:.1f} | {mean['quality']:.3f} | {sum(r['found'] for r in results):.0f}/{len(results)} |")


MEMORY_HEADER = ("| | experiments to best | experiments | OOMs | wall s | best / true best | true best found |\n"
                 "|---|---:|---:|---:|---:|---:|---:|")


def memory_table(seeds: int, slots: int, seconds: float) -> None:
    print(f"\nmemory model, the real runner, {slots} slots (2 a run), {seconds} s a run; sampling tuners: mean of "
          f"{seeds} seeds, DeepSpeed's defaults\n")
    print(MEMORY_HEADER)
    os.environ["OOM_STANDIN_MODEL"] = " ".join(str(figure) for figure in MODEL)
    for tuner in ("gridsearch", "random", "model_based"):
        for variant in VARIANTS:
            results = []
            for seed in range(1 if tuner == "gridsearch" else seeds):
                with tempfile.TemporaryDirectory() as tmp:
                    work = Path(tmp)
                    os.environ["OOM_STANDIN_LOG"] = str(work / "launches.log")
                    results.append(measure_memory(run_memory_tune(work, slots, tuner, seed, variant)))
            print(memory_row(f"{tuner}, {variant}", results), flush=True)


def simulated_memory(tuner: str, seed: int, slots: int, variant: str) -> dict[str, float]:
    """One search with or without the memory model on the simulated clock (every run 10 s), the stand-in's
    DeepSpeed-like rule as the outcome."""
    from autotuner.planning.simulate import simulate
    from autotuner.tune.memory_model import Facts
    from autotuner.tune.space import DEFAULT_PATIENCE, DEFAULT_TRIALS, SearchSpec
    from autotuner.tune.tuners import search_for

    def outcome(e: autotuner.Experiment) -> Outcome:
        point = (e.ds_config["zero_optimization"]["stage"], e.ds_config["train_micro_batch_size_per_gpu"])
        if not model_fits(*point):
            return Outcome(autotuner.State.FAILED, autotuner.Reason.OOM, "CUDA out of memory", 1)
        if (e.ds_config.get("autotuning") or {}).get("model_info"):  # a profile run: the engine's model info
            return Outcome(autotuner.State.SUCCEEDED, metrics={"num_params": MODEL[0],
                                                                "activation_mem_per_gpu": MODEL[1] * point[1]})
        return Outcome(autotuner.State.SUCCEEDED, metrics={"throughput": throughput(*point)})

    sampled = tuner != "gridsearch"
    spec = SearchSpec(prefix="b", template={"script": "/b/train.py", "num_gpus": 2, "num_nodes": 1, "args": []},
                      base={"fp16": {"enabled": True}}, stages=STAGES, metric="throughput", max_mbs=MAX_MBS,
                      seed=seed, tuner=tuner, trials=DEFAULT_TRIALS if sampled else None,
                      patience=DEFAULT_PATIENCE if sampled else None,
                      gpu_memory=None if variant == "no model" else int(MODEL[2]),
                      facts=Facts(int(MODEL[0]), MODEL[1]).to_json() if variant == "model_info" else None)
    search = search_for(spec)
    played = sorted(simulate([], {"h": list(range(slots))}, lambda e: 10.0, outcome=knob_outcome, searcher=search,
                             metric="throughput").played, key=lambda p: (p.start, p.name))
    ooms = sum(1 for p in played if p.state == autotuner.State.FAILED)
    if not search.configs:  # stopped early with nothing that fits (random's patience spent on OOMs)
        return {"to_best": len(played), "experiments": len(played), "ooms": ooms,
                "wall_s": max(p.end for p in played), "quality": 0.0, "found": 0.0}
    winner = min(search.configs, key=lambda name: -search.mean(name))
    point = search.configs[winner][:2]  # (stage, size); no knobs in fast mode
    return {"to_best": 1 + [p.name for p in played].index(winner), "experiments": len(played), "ooms": ooms,
            "wall_s": max(p.end for p in played), "quality": throughput(*point) / throughput(*MODEL_BEST),
            "found": float(point == MODEL_BEST)}


def simulated_memory_table(seeds: int, slots: int) -> None:
    print(f"\nmemory model, simulated clock, every run 10 s, {slots} slots (2 a run), mean of {seeds} seeds\n")
    print(MEMORY_HEADER)
    for tuner in ("gridsearch", "random", "model_based"):
        for variant in VARIANTS:
            runs = 1 if tuner == "gridsearch" else seeds
            print(memory_row(f"{tuner}, {variant}", [simulated_memory(tuner, seed, slots, variant)
                                                     for seed in range(runs)]), flush=True)


UNKNOWN_MAX = 1024
UNKNOWN_GRID = [(stage, 2 ** k) for stage in STAGES for k in range(11)]
UNKNOWN_BEST = max(((z, m) for z in STAGES for m in range(1, UNKNOWN_MAX + 1) if fits(z, m)),
                   key=lambda p: throughput(*p))
UNKNOWN_HEADER = ("| | experiments | OOMs | OOM share | winner | winner / true best | wall s |\n"
                  "|---|---:|---:|---:|---|---:|---:|")


def unknown_row(label: str, snap: autotuner.Snapshot) -> str:
    """Experiments, OOM runs and the winner of one sweep of the memory-unknown case."""
    ran = [a for a in snap.attempts if a.started_at is not None]
    ooms = sum(1 for a in ran if a.reason == "oom")
    assert snap.best is not None, snap.counts()
    config = snap.experiments[snap.best.name].ds_config
    point = (config["zero_optimization"]["stage"], config["train_micro_batch_size_per_gpu"])
    wall = max(a.finished_at for a in ran) - min(a.started_at for a in ran)
    return (f"| {label} | {len(ran)} | {ooms} | {ooms / len(ran):.2f} | z{point[0]} mbs{point[1]} | "
            f"{throughput(*point) / throughput(*UNKNOWN_BEST):.3f} | {wall:.1f} |")


def unknown_table(slots: int, seconds: float, simulated_seeds: int) -> None:
    """The memory-unknown case (--unknown), through the real runner and, with --simulated, the simulated clock."""
    print(f"\nmemory unknown (CPU slots, no gpu=), stages 0-3, sizes up to {UNKNOWN_MAX}, the real runner, {slots} "
          f"slots, {seconds} s a run; true best z{UNKNOWN_BEST[0]} mbs{UNKNOWN_BEST[1]}\n")
    print(UNKNOWN_HEADER)
    for label in ("power-of-two grid", "gridsearch (autotune tune)"):
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            os.environ["OOM_STANDIN_LOG"] = str(work / "launches.log")
            if label.startswith("power"):
                snap = run_grid(work, slots, UNKNOWN_GRID)
            else:
                write_config(work, {})
                config = json.loads((work / "ds.json").read_text())
                config["autotuning"]["max_train_micro_batch_size_per_gpu"] = UNKNOWN_MAX
                (work / "ds.json").write_text(json.dumps(config))
                directory = autotuner.prepare_tune(str(work / "train.py"), ["--deepspeed_config", "ds.json"],
                                                   autotuner.load_cluster(slots=slots), work / "res",
                                                   launcher=["sh", str(STANDIN)], cwd=work)
                snap = autotuner.execute(directory, autotuner.Options(grace=1.0)).snapshot
            print(unknown_row(label, snap), flush=True)
    if not simulated_seeds:
        return
    from autotuner.planning.simulate import simulate
    from autotuner.tune.space import SearchSpec
    from autotuner.tune.tuners import search_for

    def outcome(e: autotuner.Experiment) -> Outcome:
        point = (e.ds_config["zero_optimization"]["stage"], e.ds_config["train_micro_batch_size_per_gpu"])
        if not fits(*point):
            return Outcome(autotuner.State.FAILED, autotuner.Reason.OOM, "CUDA out of memory", 1)
        return Outcome(autotuner.State.SUCCEEDED, metrics={"throughput": throughput(*point)})

    print("\nthe same search on the simulated clock (every run 10 s), re-runs included\n")
    print("| slots | experiments | OOMs | OOM share | winner | wall s |\n|---:|---:|---:|---:|---|---:|")
    for n in (1, 2, 3, 4):
        spec = SearchSpec(prefix="b", template={"script": "/b/train.py", "num_gpus": 1, "num_nodes": 1, "args": []},
                          base={}, stages=STAGES, metric="throughput", max_mbs=UNKNOWN_MAX)
        search = search_for(spec)
        played = simulate([], {"h": list(range(n))}, lambda e: 10.0, outcome=knob_outcome, searcher=search,
                          metric="throughput").played
        winner = min(search.configs, key=lambda name: -search.mean(name))
        ooms = sum(1 for p in played if p.state == autotuner.State.FAILED)
        stage, mbs, _ = search.configs[winner]
        print(f"| {n} | {len(played)} | {ooms} | {ooms / len(played):.2f} | z{stage} mbs{mbs} | "
              f"{max(p.end for p in played):.0f} |", flush=True)


def loop_table(slots: int) -> None:
    """--loop: the memory model corrected by measured peaks, and trainable parameters counted apart."""
    from autotuner.planning.simulate import simulate
    from autotuner.tune.gridsearch import MicroBatchSearch
    from autotuner.tune.memory_model import Facts
    from autotuner.tune.space import SearchSpec

    params, per_sample, gpu = MODEL

    def need(stage: int, mbs: int, trained: float) -> float:
        states = {0: 2 * params + 14 * trained, 1: 2 * params + 2 * trained + 6 * trained,
                  2: 2 * params + 7 * trained, 3: params + 7 * trained}[stage]  # 2 GPUs, as oom_standin.sh
        return states + per_sample * mbs + 1.5e9

    def play(facts: Facts, trained: float, peaks: bool) -> tuple[int, int, tuple[int, int], float]:
        def outcome(e: autotuner.Experiment) -> Outcome:
            point = (e.ds_config["zero_optimization"]["stage"], e.ds_config["train_micro_batch_size_per_gpu"])
            held = need(*point, trained)
            if held > gpu:
                return Outcome(autotuner.State.FAILED, autotuner.Reason.OOM, "CUDA out of memory", 1)
            return Outcome(autotuner.State.SUCCEEDED, metrics={"throughput": throughput(*point)}
                           | ({"peak_memory": held} if peaks else {}))

        spec = SearchSpec(prefix="b", template={"script": "/b/train.py", "num_gpus": 2, "num_nodes": 1, "args": []},
                          base={"fp16": {"enabled": True}}, stages=STAGES, metric="throughput", max_mbs=MAX_MBS,
                          gpu_memory=int(gpu), facts=facts.to_json())
        search = MicroBatchSearch(spec)
        played = sorted(simulate([], {"h": list(range(slots))}, lambda e: 10.0, outcome=knob_outcome, searcher=search,
                                 metric="throughput").played, key=lambda p: (p.start, p.name))
        winner = min(search.configs, key=lambda name: -search.mean(name))
        point = search.configs[winner][:2]
        best = max(((z, m) for z in STAGES for m in range(1, MAX_MBS + 1) if need(z, m, trained) <= gpu),
                   key=lambda p: throughput(*p))
        return (len(played), sum(1 for p in played if p.state == autotuner.State.FAILED), point,
                throughput(*point) / throughput(*best))

    print(f"\nthe loop closed, simulated clock, {slots} slots (2 a run), the DeepSpeed-like fake GPU\n")
    print("| model_info's activations | peaks reported | experiments | OOMs | winner | winner / true best |\n"
          "|---|---|---:|---:|---|---:|")
    for wrong in (0.5, 1.0, 2.0):
        for peaks in (False, True):
            n, ooms, point, quality = play(Facts(int(params), wrong * per_sample), params, peaks)
            print(f"| {wrong}x | {'yes' if peaks else 'no'} | {n} | {ooms} | z{point[0]} mbs{point[1]} | "
                  f"{quality:.3f} |", flush=True)
    trained = params / 100
    print(f"\n{int(params):,} parameters, 1% trainable (LoRA-like), simulated, {slots} slots (2 a run)\n")
    print("| counted | experiments | OOMs | winner | winner / true best |\n|---|---:|---:|---|---:|")
    for label, facts in (("all as trainable", Facts(int(params), per_sample)),
                         ("trainable apart", Facts(int(params), per_sample, trainable=int(trained)))):
        n, ooms, point, quality = play(facts, trained, False)
        print(f"| {label} | {n} | {ooms} | z{point[0]} mbs{point[1]} | {quality:.3f} |", flush=True)


OFFLOAD_MODEL = (1e9, 5e7, 8e9)  # parameters, activation bytes a sample, GPU bytes: fits no stage without offload


def offload_need(stage: int, mbs: int, level: int) -> float:
    """The stand-in's GPU need (oom_standin.sh) of OFFLOAD_MODEL on 2 GPUs at an offload level (1: optimizer)."""
    params, per_sample, _ = OFFLOAD_MODEL
    weights = params if stage >= 3 else 2 * params
    grads = params if stage >= 2 else 2 * params
    adam = 0.0 if level >= 1 and stage >= 1 else (6 * params if stage >= 1 else 12 * params)
    return weights + grads + adam + per_sample * mbs + 1.5e9


def offload_throughput(stage: int, mbs: int, level: int) -> float:
    return throughput(stage, mbs) * (0.6 if level >= 1 and stage >= 1 else 1.0)


def offload_table(slots: int, seconds: float) -> None:
    """--offload: a model that fits only with the optimizer offloaded, tuned through the real runner."""
    gpu = OFFLOAD_MODEL[2]
    points = [(z, m, level) for z in STAGES for m in range(1, MAX_MBS + 1) for level in (0, 1)
              if offload_need(z, m, level) <= gpu]
    best = max(points, key=lambda p: offload_throughput(*p))
    print(f"\noffload, the real runner, {slots} slots (2 a run), {seconds} s a run; true best z{best[0]} mbs{best[1]}"
          f"{'_oo' if best[2] else ''}, throughput {offload_throughput(*best):.1f}\n")
    print("| GPU memory | experiments | OOMs | without offload | node exhausted | winner | winner / true best | "
          "wall s |\n|---|---:|---:|---:|---:|---|---:|---:|")
    for label, gpu_attr, info in (("known, model_info", " gpu=X-8GB", True), ("unknown (no gpu=)", "", False)):
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            (work / "train.py").write_text("# stand-in: the launcher never runs it\n")
            autotuning: dict = {"enabled": True, "metric": "throughput", "max_train_micro_batch_size_per_gpu": MAX_MBS}
            if info:
                autotuning["model_info"] = {"num_params": int(OFFLOAD_MODEL[0]),
                                            "activation_mem_per_gpu": int(OFFLOAD_MODEL[1])}
            config = {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True}, "autotuning": autotuning,
                      "zero_optimization": {"stage": list(STAGES)}}
            (work / "ds.json").write_text(json.dumps(config))
            (work / "hostfile").write_text(f"localhost slots={slots}{gpu_attr}\n")
            os.environ["OOM_STANDIN_LOG"] = str(work / "launches.log")
            os.environ["OOM_STANDIN_MODEL"] = " ".join(str(v) for v in OFFLOAD_MODEL)
            cluster = autotuner.load_cluster(hostfile=work / "hostfile")
            directory = autotuner.prepare_tune(str(work / "train.py"), ["--deepspeed_config", "ds.json"], cluster,
                                               work / "res", num_gpus=2, launcher=["sh", str(STANDIN)], cwd=work)
            snap = autotuner.execute(directory, autotuner.Options(grace=1.0)).snapshot
            ran = [a for a in snap.attempts if a.started_at is not None]
            plain = sum(1 for a in ran if "offload_optimizer" not in
                        (snap.experiments[a.name].ds_config.get("zero_optimization") or {}))
            killed = sum(1 for a in ran if a.exit_code == 137)
            assert snap.best is not None, snap.counts()
            config = snap.experiments[snap.best.name].ds_config
            zero = config["zero_optimization"]
            point = (zero["stage"], config["train_micro_batch_size_per_gpu"], 1 if "offload_optimizer" in zero else 0)
            wall = max(a.finished_at for a in ran) - min(a.started_at for a in ran)
            quality = offload_throughput(*point) / offload_throughput(*best)
            print(f"| {label} | {len(ran)} | {sum(1 for a in ran if a.reason == 'oom')} | {plain} | {killed} | "
                  f"{snap.best.name.removeprefix('train_')} | {quality:.3f} | {wall:.1f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--slots", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.3)
    parser.add_argument("--simulated", type=int, default=0, metavar="N",
                        help="Also play each search N seeds on the simulated clock.")
    parser.add_argument("--no-real", action="store_true", help="Only the simulated table.")
    parser.add_argument("--full", action="store_true", help="Also play full mode (ZeRO's knobs) simulated.")
    parser.add_argument("--memory", action="store_true", help="Only the tuners with and without the memory model.")
    parser.add_argument("--loop", action="store_true",
                        help="Only the memory model corrected by peaks, and trainable parameters apart (simulated).")
    parser.add_argument("--unknown", action="store_true",
                        help=f"Only the case of GPUs whose memory is unknown, sizes up to {UNKNOWN_MAX}.")
    parser.add_argument("--offload", action="store_true",
                        help="Only a model that fits no stage without offload (the real runner).")
    parser.add_argument("--sampled-full", type=int, default=0, metavar="N",
                        help="Only the sampling tuners in full mode on the simulated clock, N seeds.")
    parser.add_argument("--budgets", default="300,600", help="--sampled-full's trial budgets past DeepSpeed's.")
    parser.add_argument("--every-size", action="store_true",
                        help=f"Also run the grid of every size 1-{MAX_MBS} of each stage ({len(EVERY_SIZE)} runs).")
    opts = parser.parse_args()
    os.environ["OOM_STANDIN_SECONDS"] = str(opts.seconds)
    cases: list[tuple[str, str | None, int | None, int]] = [("full grid (powers of two)", None, None, 1)]
    if opts.every_size:
        cases.append((f"full grid (every size 1-{MAX_MBS})", "every", None, 1))
    cases.append(("gridsearch (structured)", "gridsearch", None, 1))
    for tuner in ("random", "model_based"):
        cases += [(f"{tuner}, DeepSpeed's defaults", tuner, None, opts.seeds),
                  (f"{tuner}, patience 36", tuner, 36, opts.seeds)]
    if opts.sampled_full:
        sampled_full_table(opts.sampled_full, opts.slots, [int(n) for n in opts.budgets.split(",") if n])
        return
    if opts.offload:
        offload_table(2 * opts.slots, opts.seconds)
        return
    if opts.unknown:
        unknown_table(opts.slots, opts.seconds, opts.simulated)
        return
    if opts.loop:
        loop_table(2 * opts.slots)
        return
    if opts.memory:
        print(f"true best {MODEL_BEST}: throughput {throughput(*MODEL_BEST):.1f}")
        if not opts.no_real:
            memory_table(opts.seeds, 2 * opts.slots, opts.seconds)
        if opts.simulated:
            simulated_memory_table(opts.simulated, 2 * opts.slots)
        return
    print(f"grid best {GRID_BEST}: throughput {throughput(*GRID_BEST):.1f}")
    if not opts.no_real:
        real_table(cases, opts.slots, opts.seconds)
    if opts.simulated:
        simulated_table(opts.simulated, opts.slots)
    if opts.full:
        full_mode_table(opts.slots)


def knob_factor(stage: int, zero: dict) -> tuple[float, float]:
    """The stand-in's ZeRO knobs: (throughput factor, GiB more memory needed)."""
    factor = (1.1 if zero.get("overlap_comm", stage == 3) else 1.0) / (1.1 if stage == 3 else 1.0)
    factor *= {5e7: 0.95, 5e8: 1.0, 1e9: 1.04}.get(zero.get("reduce_bucket_size", 5e8), 1.0)
    factor *= 1.0 if zero.get("contiguous_gradients", True) else 0.97
    allgather = zero.get("allgather_bucket_size", 5e8)
    return factor * (0.99 if allgather == 5e7 else 1.0), (5.0 if allgather >= 1e9 else 0.0)


def knob_value(stage: int, mbs: int, zero: dict) -> float | None:
    """The stand-in's throughput with ZeRO's knobs, None where it runs out of memory."""
    factor, more = knob_factor(stage, zero)
    fixed = {0: 40, 1: 30, 2: 20, 3: 10}[stage]
    return None if fixed + 2.0 * mbs + more > 100 else throughput(stage, mbs) * factor


def knob_outcome(e: autotuner.Experiment) -> Outcome:
    """A simulated run of `e` in full mode: its throughput, or out of memory."""
    zero = e.ds_config["zero_optimization"]
    measured = knob_value(zero["stage"], e.ds_config["train_micro_batch_size_per_gpu"], zero)
    if measured is None:
        return Outcome(autotuner.State.FAILED, autotuner.Reason.OOM, "CUDA out of memory", 1)
    return Outcome(autotuner.State.SUCCEEDED, metrics={"throughput": measured})


def knob_spaces() -> dict[str, dict[str, list]]:
    """Every searched knob of each stage above 0, its default first."""
    from autotuner.tune.knobs import KNOBS

    return {str(stage): {k.key: [k.default(stage), *(v for v in k.values if v != k.default(stage))]
                         for k in KNOBS if stage in k.searched} for stage in STAGES if stage}


def full_mode_table(slots: int) -> None:
    """gridsearch in full mode against every knob setting at each stage's best size, on the simulated clock."""
    from autotuner.planning.simulate import simulate
    from autotuner.tune.gridsearch import MicroBatchSearch
    from autotuner.tune.space import SearchSpec

    spaces = knob_spaces()
    spec = SearchSpec(prefix="b", template={"script": "/b/train.py", "num_gpus": 1, "num_nodes": 1, "args": []},
                      base={}, stages=STAGES, metric="throughput", max_mbs=MAX_MBS, knobs=spaces, confirm=0)
    search = MicroBatchSearch(spec)
    played = sorted(simulate([], {"h": list(range(slots))}, lambda e: 10.0, outcome=knob_outcome, searcher=search,
                             metric="throughput").played, key=lambda p: (p.start, p.name))
    winner = min(search.configs, key=lambda name: -search.mean(name))
    knob_runs = len(search.knob_trials)
    exhaustive, best = 0, 0.0
    for stage in STAGES:  # every knob setting at the stage's best size, as the search found it
        mbs = search.best_size(stage)
        for knobs in search.settings(stage):
            exhaustive += 1
            best = max(best, knob_value(stage, mbs, dict(knobs)) or 0.0)
    print(f"\nfull mode, simulated clock, every run 10 s, {slots} slots\n")
    print("| | experiments | knob runs | winner | its throughput / the knob grid's best |\n|---|---:|---:|---|---:|")
    print(f"| gridsearch, knob by knob | {len(played)} | {knob_runs} | {winner} | "
          f"{search.mean(winner) / best:.3f} |")
    print(f"| every knob setting at each stage's best size | {exhaustive} (knob runs alone) | {exhaustive} | | 1.000 |")


def sampled_full_table(seeds: int, slots: int, budgets: list[int]) -> None:
    """random and model_based in full mode (every stage's knobs, 1,386 points) on the simulated clock, each with
    DeepSpeed's defaults and with budgets of `budgets` trials and no early stopping: where model_based's asks are
    bounded (past 62 trials in full mode) its draws change, and this is where to see what that costs the search."""
    from autotuner.planning.simulate import simulate
    from autotuner.tune.space import DEFAULT_PATIENCE, DEFAULT_TRIALS, SearchSpec
    from autotuner.tune.tuners import search_for

    spaces = knob_spaces()
    print(f"\nfull mode, sampling tuners, simulated clock, {slots} slots, mean of {seeds} seeds\n")
    print("| | experiments to best | experiments | best / the space's best | seeds at the space's best | CPU s |\n"
          "|---|---:|---:|---:|---:|---:|")
    for tuner in ("random", "model_based"):
        for trials, patience in [(DEFAULT_TRIALS, DEFAULT_PATIENCE), *((n, None) for n in budgets)]:
            found, best = [], 0.0
            for seed in range(seeds):
                spec = SearchSpec(prefix="b", template={"script": "/b/train.py", "num_gpus": 1, "num_nodes": 1,
                                                        "args": []}, base={}, stages=STAGES, metric="throughput",
                                  max_mbs=MAX_MBS, knobs=spaces, confirm=0, tuner=tuner, seed=seed, trials=trials,
                                  patience=patience)
                search = search_for(spec)
                started = time.process_time()
                played = sorted(simulate([], {"h": list(range(slots))}, lambda e: 10.0, outcome=knob_outcome,
                                         searcher=search, metric="throughput").played, key=lambda p: (p.start, p.name))
                cpu = time.process_time() - started
                winner = min(search.configs, key=lambda name: -search.mean(name))
                found.append((1 + [p.name for p in played].index(winner), len(played), search.first[winner], cpu))
                best = max(knob_value(z, m, dict(k)) or 0.0 for z in STAGES for m in sorted({m for _, m in GRID})
                           for k in search.settings(z))
            label = f"{tuner}, {trials} trials" + (f", patience {patience}" if patience else "")
            print(f"| {label} | {statistics.mean(f[0] for f in found):.1f} | {statistics.mean(f[1] for f in found):.1f}"
                  f" | {statistics.mean(f[2] for f in found) / best:.4f} | {sum(f[2] >= best * 0.9999 for f in found)}"
                  f"/{seeds} | {statistics.mean(f[3] for f in found):.2f} |", flush=True)


def real_table(cases: list[tuple[str, str | None, int | None, int]], slots: int, seconds: float) -> None:
    print(f"\nthe real runner, {slots} slots, {seconds} s a run\n")
    print(HEADER)
    for label, tuner, patience, seeds in cases:
        results = []
        for seed in range(seeds):
            with tempfile.TemporaryDirectory() as tmp:
                work = Path(tmp)
                os.environ["OOM_STANDIN_LOG"] = str(work / "launches.log")
                started = time.perf_counter()
                if tuner in (None, "every"):
                    snap = run_grid(work, slots, GRID if tuner is None else EVERY_SIZE)
                else:
                    snap = run_tune(work, slots, tuner, seed, patience)
                results.append(measure(snap))
                if tuner in (None, "every"):  # a grid names its winner once all of it ran
                    results[-1]["to_best"] = results[-1]["experiments"]
                    results[-1]["slot_s_to_best"] = results[-1]["slot_s"]
            print(f"  {label} seed {seed}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
        print(row(label, results), flush=True)


if __name__ == "__main__":
    main()
