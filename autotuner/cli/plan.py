"""`autotune plan`: a sweep predicted on the scheduler `run` uses, with a simulated clock; nothing launched."""
from __future__ import annotations

from pathlib import Path

import typer

import autotuner
from autotuner import UserError

from ..backends.kinds import inputs
from .app import Brief, collecting, drop_stdout, fail, format_option, note, screen
from .bundles import GPU_MIXED, GPU_TYPE, SCRIPT, Given, backend_options, bundled, timeout_option
from .checks import policy_names, seconds
from .goal import GOAL, GoalOptions


@bundled
def plan(
    specs: list[Path] | None = typer.Argument(None, help="Sweep files (hjson), DeepSpeed experiment files, or "
                                                         "directories of them (none with --training)."),
    backend: Given = backend_options("plan"),
    script: str | None = SCRIPT,
    past: Path | None = typer.Option(None, "--from", help="A sweep already run: its measured durations, and the "
                                                          "peak GPU memory of each config as its need."),
    duration: float = typer.Option(600.0, "--duration",
                                   help="Seconds an experiment takes when nothing better is known."),
    spread: float = typer.Option(0.0, "--spread", help="Coefficient of variation of durations: with it, "
                                                       "Monte Carlo gives P10/P50/P90 (durations --from measured "
                                                       "as start-up and steps draw by their measured spreads)."),
    samples: int = typer.Option(100, "--samples", min=1, max=10_000, help="Monte Carlo draws (with --spread)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the draws: the same seed, the same plan."),
    policy: str = typer.Option("backfill", "--policy", help="Queue policies to compare: backfill, fifo."),
    placement: str = typer.Option("pack", "--placement", help="Placements to compare: pack, spread, memory."),
    gpu_type: str | None = GPU_TYPE,
    gpu_mixed: bool = GPU_MIXED,
    timeout: str | None = timeout_option(),
    fmt: Brief = format_option("table or JSON (every experiment's expected start and end)."),
    plot: Path | None = typer.Option(None, "--plot", help="Draw the expected slot timeline into this PNG file."),
    nodes: int | None = typer.Option(None, "--nodes", min=1, help="With --slurm: the allocation's nodes; with "
                                                                   "--training: the training run's [default: as "
                                                                   "measured]."),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", min=1,
                                             help="With --slurm: the allocation's GPUs per node; with --training: "
                                                  "the training run's [default: as measured]."),
    training: Path | None = typer.Option(None, "--training", metavar="DIR",
                                         help="Plan the training run instead: with a config the sweep in DIR "
                                              "measured (--config, default its best), its time and cost, with "
                                              "the spread of its runs."),
    config: str | None = typer.Option(None, "--config", metavar="NAME", help="With --training: the experiment "
                                                                              "to train with [default: the best]."),
    training_run: GoalOptions = GOAL,
) -> None:
    """Predict a sweep before it runs: makespan, GPU-hours, utilisation and each experiment's start, on the
    scheduler and policies `run` uses, with a simulated clock. Nothing is launched or written (but --plot). With
    --training DIR: the training run with a config that sweep measured, its time and cost."""
    notes: list[str] = []
    try:
        wanted = training_run.goal()
        if training is not None:
            if specs:
                raise UserError("--training plans a training run from a sweep already run: no sweep files")
            if backend.get("slurm"):  # the one backend flag that sizes nodes as --training does
                raise UserError("--slurm plans a sweep in an allocation; --training plans the training run on "
                                "--nodes x --gpus-per-node")
            typer.echo(autotuner.render_training_plan(training, wanted, config, fmt.value, nodes, gpus_per_node),
                       nl=False)
            return
        if config is not None or wanted != autotuner.Goal():
            raise UserError("--config and the training run's options go with --training DIR")
        if not specs:
            raise UserError("missing sweep files (or --training DIR): autotune plan SWEEP.hjson ...")

        seconds(duration, "--duration", positive=True)
        queues = policy_names(policy, "--policy", autotuner.QUEUES)
        placements = policy_names(placement, "--placement", autotuner.PLACEMENTS)
        sweep = autotuner.load_sweep([p.resolve() for p in specs], script=script, gpu_type=gpu_type,
                                     gpu_mixed=gpu_mixed)
        if plot is not None:
            autotuner.check_output(plot, "--plot", [*sweep.paths(), *specs, *inputs("plan", backend),
                                                    past / "ledger.sqlite" if past is not None else None],
                                   replaced=True)
        sized = {**backend, "nodes": nodes, "gpus_per_node": gpus_per_node}  # the allocation planned for
        autotuner.check_options("plan", sized)
        cluster = autotuner.planned_cluster(sized, sweep, notes.append)
        autotuner.check_gpu_needs(sweep, cluster)
        predicted = autotuner.plan_sweep(
            sweep.experiments, cluster.slots, past=past, default_seconds=duration, queues=queues,
            placements=placements, spread=spread, samples=samples, seed=seed,
            timeout=autotuner.timeout_seconds(timeout), types=cluster.host_types, sizes=cluster.memory,
            devices=cluster.devices)
        text = autotuner.render_plan(predicted, fmt.value, screen())
        drawn = None
        if plot is not None:
            with collecting():
                drawn = autotuner.write_plan_plot(predicted, plot)
    except UserError as e:
        raise fail(e) from None
    for line in notes:
        note(line)
    try:
        typer.echo(text, nl=False)
        if drawn is not None and fmt == Brief.table:
            typer.echo(f"slot timeline: {drawn}")
    except OSError:
        drop_stdout()
