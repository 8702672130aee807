"""The commands that run a sweep or stop one: `run`, `tune`, `resume`, `cancel`."""
from __future__ import annotations

import json
from pathlib import Path

import typer

import autotuner
from autotuner import UserError

from ..backends.kinds import inputs
from .app import Brief, fail, format_option, note
from .bundles import (
    DIRECTORY,
    GPU_MIXED,
    GPU_TYPE,
    LAUNCHER,
    RESULTS,
    SCRIPT,
    SPECS,
    STOP_OUTCLASSED,
    WATCH_AND_VERDICT,
    Given,
    Timing,
    Watch,
    backend_options,
    bundled,
    sweep_options,
    timing,
)
from .checks import check_outputs, policy_names, results_path, split
from .execute import execute
from .goal import GOAL, GoalOptions
from .holding import held

# `tune` hands everything after the script to the script.
TUNE_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False}


def _check_before_asking(command: str, given: Given, times: Timing) -> None:
    """What `run` and `tune` check of where and how to run before a cluster is asked for anything (an
    allocation, a probe): each backend its own options, then the timing."""
    autotuner.check_options(command, given)
    times.check()


def _slots(cluster: autotuner.Cluster) -> str:
    return (f"{sum(len(s) for s in cluster.slots.values())} {cluster.accelerator} slot(s) of "
            f"{len(cluster.slots)} host(s)")


@bundled
def run(
    specs: list[Path] = SPECS,
    backend: Given = backend_options("run"),
    results: str | None = RESULTS,
    script: str | None = SCRIPT,
    args: str = typer.Option("", "--args", help="The script's arguments, as one shell-quoted string."),
    metric: str | None = typer.Option(None, "--metric", help=f"{', '.join(autotuner.KNOWN)}, or NAME:min|max."),
    times: Timing = timing("the whole sweep"),
    launcher: str | None = LAUNCHER,
    placement: str = typer.Option("pack", "--placement", help="pack (best fit), spread, or memory (only GPUs with "
                                                              "room for the sweep's gpu_memory)."),
    past: Path | None = typer.Option(None, "--from", help="A sweep already run: the peak GPU memory each config held "
                                                          "there is the need of the same config here, where its "
                                                          "spec states no gpu_memory."),
    gpu_type: str | None = GPU_TYPE,
    gpu_mixed: bool = GPU_MIXED,
    stop_outclassed: bool = STOP_OUTCLASSED,
    watch: Watch = WATCH_AND_VERDICT,
) -> None:
    """Run a sweep and report the best configuration."""
    notes: list[str] = []
    try:  # everything that can be checked before a cluster is asked for anything (an allocation, a probe)
        _check_before_asking("run", backend, times)
        launch = split(launcher, "--launcher") if launcher else None
        chosen = policy_names(placement, "--placement", autotuner.PLACEMENTS, one=True)[0]
        directory_asked = results_path(results)
        # Paths absolute: `resume` reads them again from any directory.
        sweep = autotuner.load_sweep([p.resolve() for p in specs], script=script, args=split(args, "--args"),
                                     metric=metric, gpu_type=gpu_type, gpu_mixed=gpu_mixed)
        check_outputs(watch.events, directory_asked, [*sweep.paths(), *inputs("run", backend)], specs)
        peaks = autotuner.measured_peaks(past) if past is not None else None
    except UserError as e:
        raise fail(e) from None
    with held(backend) as running:
        try:
            options = sweep_options(times, watch, running, times.timeout_seconds(), chosen, stop_outclassed)
            cluster = autotuner.cluster_for(running, sweep=sweep, log=notes.append, probe=True)
            directory = autotuner.prepare(sweep, cluster, directory_asked, launcher=launch,
                                          timeout=options.timeout, memory_from=peaks)
        except UserError as e:
            raise fail(e) from None
        for line in notes:
            note(line)
        if not watch.quiet:  # with --format json stdout holds only the result
            typer.echo(f"sweep {sweep.name}: {len(sweep.experiments)} experiments on {_slots(cluster)}; results in "
                       f"{directory}", err=watch.fmt == Brief.json)
        execute(directory, options, watch, prepared=True)


@bundled
def tune(
    ctx: typer.Context,
    script: str = typer.Argument(..., help="The training script; everything after it goes to the script, which "
                                           "names its DeepSpeed config (--deepspeed_config ds.json, or --deepspeed "
                                           "ds.json for a Trainer script). Or a tune file (.hjson) stating it all."),
    backend: Given = backend_options("tune"),
    num_gpus: str | None = typer.Option(None, "--num_gpus", "--num-gpus", metavar="N[,N...]|LOW-HIGH",
                                        help="Slots per node of each experiment (default: a tune file's, or 1); "
                                             "several (1,2,4,8, or 1-8: the powers of two) search each world "
                                             "size."),
    num_nodes: str | None = typer.Option(None, "--num_nodes", "--num-nodes", metavar="N[,N...]|LOW-HIGH",
                                         help="Nodes of each experiment (default: a tune file's, or 1); several "
                                              "as --num_gpus."),
    results: str | None = RESULTS,
    times: Timing = timing("the whole tuning", spec=False),
    confirm: int | None = typer.Option(None, "--confirm", min=0, metavar="K",
                                       help="Run the K best configs once more and rank them by the mean of their "
                                            "runs before the winner is named; 0: no re-runs [default: 2 when "
                                            "more than 2 configs succeeded]."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random and model_based tuners: the same seed, the "
                                               "same search."),
    min_improvement: float = typer.Option(0.0, "--min-improvement", metavar="PERCENT",
                                          help="Early stopping (tuner_early_stopping N) counts a run as progress "
                                               "only when it beats the best so far by this many percent "
                                               "(0 to 1000)."),
    tolerance: str | None = typer.Option(None, "--tolerance", metavar="FRACTION|off",
                                         help="Measure each run until its 95% interval is within this fraction of "
                                              "its mean (0.03: 3%), then end it as succeeded; off: the fixed profile "
                                              "window [default: the config's autotuning.tolerance, else 0.03 "
                                              "unless it sets end_profile_step]."),
    max_measured_steps: int | None = typer.Option(None, "--max-measured-steps", metavar="N",
                                                  help="The most steps a run measures until sure; it ends there "
                                                       "[default: the config's, else 30]."),
    launcher: str | None = LAUNCHER,
    training_run: GoalOptions = GOAL,
    watch: Watch = WATCH_AND_VERDICT,
) -> None:
    """Find the fastest DeepSpeed config for a script without writing the grid: your usual DeepSpeed command,
    with `autotune tune` where `deepspeed` stood. The config's `autotuning` section is read as DeepSpeed
    documents it; each ZeRO stage's largest micro-batch size that fits is searched (tuner_type gridsearch), or
    the grid sampled (random, model_based); with `fast: false` each stage's ZeRO knobs too (bucket sizes,
    overlap_comm, reduce_scatter, contiguous_gradients); runs out of memory are answers, not failures; the best
    configs are run again before the winner is named."""
    notes: list[str] = []
    try:  # everything that can be checked before a cluster is asked for anything (an allocation, a probe)
        _check_before_asking("tune", backend, times)
        launch = split(launcher, "--launcher") if launcher else None
        chosen = results_path(results)
        wanted = training_run.goal()
        gpus = autotuner.world_counts(num_gpus, "--num_gpus") if num_gpus is not None else None
        nodes = autotuner.world_counts(num_nodes, "--num_nodes") if num_nodes is not None else None
        request = autotuner.read_tune(script, list(ctx.args), num_gpus=gpus, num_nodes=nodes, seed=seed,
                                      confirm=confirm, min_gain=min_improvement / 100, goal=wanted,
                                      until_sure=autotuner.until_sure(tolerance, max_measured_steps))
        check_outputs(watch.events, chosen, [*request.inputs, *inputs("tune", backend)])
    except UserError as e:
        raise fail(e) from None
    with held(backend) as running:
        try:
            options = sweep_options(times, watch, running, times.timeout_seconds())
            cluster = autotuner.cluster_for(running, log=notes.append, probe=True)
            directory = autotuner.prepare_tune(request, (), cluster, chosen, launcher=launch,
                                               timeout=options.timeout)
        except UserError as e:
            raise fail(e) from None
        for line in notes:
            note(line)
        if not watch.quiet:
            search = autotuner.snapshot(directory).meta.search
            template = search["template"]  # type: ignore[index]
            shapes = [f"{n} node(s) x {g} slot(s)" for g, n in search.get("worlds") or ()] or [  # type: ignore[union-attr]
                f"{template['num_nodes']} node(s) x {template['num_gpus']} slot(s)"]
            typer.echo(f"tuning {script}: experiments of {', '.join(shapes)} on {_slots(cluster)}; results in "
                       f"{directory}", err=watch.fmt == Brief.json)
        execute(directory, options, watch, prepared=True)


@bundled
def resume(
    directory: Path = DIRECTORY,
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Run failed and timed-out experiments again."),
    only_new: bool = typer.Option(False, "--only-new", help="The spec changed: run only its new experiments."),
    times: Timing = timing("the resumed sweep", default="as the sweep was started"),
    placement: str | None = typer.Option(None, "--placement", help="pack, spread or memory [default: as the "
                                                                      "sweep last ran]."),
    stop_outclassed: bool = STOP_OUTCLASSED,
    watch: Watch = WATCH_AND_VERDICT,
    backend: Given = backend_options("resume"),
) -> None:
    """Finish an interrupted sweep: nothing that succeeded runs again. A sweep started in Slurm runs in this
    allocation, in the one it ran in while that still runs, or in a new one (--nodes, --gpus-per-node)."""
    try:  # everything that can be checked before a cluster is asked for anything
        autotuner.check_options("resume", backend)
        times.check()
        chosen = policy_names(placement, "--placement", autotuner.PLACEMENTS, one=True)[0] if placement is not None \
            else None
        plan = autotuner.resume_plan(directory, only_new=only_new)
        check_outputs(watch.events, None, [*plan.inputs, *inputs("resume", backend)])
    except UserError as e:
        raise fail(e) from None
    for line in plan.notes:
        note(line)
    with held(backend, recorded=plan.recorded) as running:
        timeout = plan.timeout if times.timeout is None else times.timeout_seconds()
        options = sweep_options(times, watch, running, timeout, chosen, stop_outclassed)
        execute(directory, options, watch, retry_failed=retry_failed, new_experiments=plan.new_experiments)


def cancel(
    directory: Path = DIRECTORY,
    names: list[str] = typer.Argument(None, help="Experiments to cancel; none = the whole sweep."),
    fmt: Brief = format_option("table: what was done, in a line; json: the same as one JSON object."),
) -> None:
    """Cancel experiments of a sweep, or all of it, from any terminal."""
    try:
        done = autotuner.cancel(directory, names or [])
    except UserError as e:
        raise fail(e) from None
    typer.echo(json.dumps(done.to_json()) if fmt == Brief.json else str(done))
