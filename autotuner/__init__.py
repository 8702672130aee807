"""autotuner: run a space of DeepSpeed configurations across GPU slots and keep the fastest.

The Python API that the `autotune` command is a thin face of::

    import autotuner

    sweep = autotuner.load_sweep(["sweep.hjson"])            # or Sweep(...) of Experiment(...) made in Python
    cluster = autotuner.load_cluster(slots=2)                # or load_cluster(Path("hostfile"), include=...)
    directory = autotuner.prepare(sweep, cluster)            # results/NAME-TIME: checked, created; nothing runs
    result = autotuner.execute(directory, autotuner.Options(retries=2))
    print(result.snapshot.best, result.exit_code)

    autotuner.run(sweep, cluster)                            # prepare + execute
    autotuner.resume(directory, retry_failed=True)           # finish it; nothing that succeeded runs again
    autotuner.cancel(directory, ["name"])                    # from any process, while it runs or not
    autotuner.snapshot(directory)                            # where it stands, safe while it runs
    results = autotuner.load(directory)                      # one record per experiment: parameters, metrics
    results.to_dataframe()                                   # the same as a pandas DataFrame (pandas needed)
    autotuner.hosts_check(Path("hostfile"))                  # every host reachable? GPUs, versions, load
    autotuner.plan_sweep(sweep.experiments, cluster.slots)   # predicted on a simulated clock; nothing runs

Bad input is a `UserError` (one line, located at its file and line where it has one). The library logs to
`logging.getLogger("autotuner")` and prints nothing; notes meant for the user go to `Options.log`.

Importing this package is cheap (no SSH stack, terminal UI, matplotlib or torch): every name but `UserError`,
`State` and `Reason` is imported when first used.
"""
from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import UserError
from .states import Reason, State

__version__ = "0.1.0"  # the one place: pyproject.toml reads it from here

if TYPE_CHECKING:  # what the lazy names below are, for type checkers
    from .backends.base import HostsCheck, Withdrawn
    from .backends.cluster import Cluster, check_gpu_needs
    from .backends.hosts.hosts import Ssh
    from .backends.registry import check as check_options
    from .backends.registry import cluster_for, hosts_check
    from .backends.registry import held as hold
    from .backends.registry import planned as planned_cluster
    from .backends.slurm.allocation import Allocation, SlurmError
    from .backends.slurm.ask import SlurmAsk
    from .core import PLACEMENTS
    from .dashboard import serve as serve_dashboard
    from .planning.learned import peaks_by_digest as measured_peaks
    from .planning.plan import QUEUES, Plan, plan_sweep
    from .spec import Experiment, Sweep
    from .spec.load import load_sweep
    from .spec.metrics import KNOWN, Metric, metric_named
    from .spec.outputs import check_output, check_results_directory
    from .sweep.cancel import Cancellation, cancel
    from .sweep.create import default_directory, prepare, prepare_tune
    from .sweep.resume import ResumePlan, SpecChanges, resume_plan, spec_changes, timeout_seconds
    from .sweep.run import Options, Result, Stopped, execute
    from .sweep.verdict import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, FailOn
    from .tune.goal import Goal
    from .tune.goal import from_options as training_goal
    from .tune.request import TuneRequest, read_tune
    from .tune.untilsure import asked as until_sure
    from .tune.worlds import counts as world_counts
    from .views.compare import render_compare
    from .views.events import check_events_path
    from .views.hosts import render_hosts_check
    from .views.html import write_html
    from .views.live import watching
    from .views.plan import render_plan, write_plan_plot
    from .views.plots import write_plots
    from .views.records import ExperimentRecord, SweepResults
    from .views.records import load_results as load
    from .views.report import render_report
    from .views.snapshot import Snapshot
    from .views.snapshot import load as snapshot
    from .views.status import render_result, render_status
    from .views.summary import OPTIMAL_COMMAND
    from .views.tables import Output
    from .views.training import render_training_plan

logging.getLogger(__name__).addHandler(logging.NullHandler())  # silent unless the application configures logging

# Name -> (module, attribute): imported on first use.
_LAZY = {
    # Running inside Slurm (`run(sweep, SlurmAsk(...))`): the allocation asked for, and what Slurm's failures raise.
    "SlurmAsk": (".backends.slurm.ask", "SlurmAsk"),
    "Allocation": (".backends.slurm.allocation", "Allocation"),
    "SlurmError": (".backends.slurm.allocation", "SlurmError"),
    # The backends' options, by name, routed to the backend that declares them (the command line's flags):
    # checked before a cluster is asked anything, what the command runs in held for it, what a plan plans for.
    "check_options": (".backends.registry", "check"),
    "hold": (".backends.registry", "held"),
    "planned_cluster": (".backends.registry", "planned"),
    "Withdrawn": (".backends.base", "Withdrawn"),
    "prepare": (".sweep.create", "prepare"),
    "prepare_tune": (".sweep.create", "prepare_tune"),
    "default_directory": (".sweep.create", "default_directory"),
    "cancel": (".sweep.cancel", "cancel"),
    "Cancellation": (".sweep.cancel", "Cancellation"),
    "load_sweep": (".spec.load", "load_sweep"),
    "Experiment": (".spec", "Experiment"),
    "Sweep": (".spec", "Sweep"),
    "Metric": (".spec.metrics", "Metric"),
    "metric_named": (".spec.metrics", "metric_named"),
    "KNOWN": (".spec.metrics", "KNOWN"),
    "Cluster": (".backends.cluster", "Cluster"),
    "check_gpu_needs": (".backends.cluster", "check_gpu_needs"),
    # `autotune hosts` of any cluster: the backend the options name, its hosts as a HostsCheck.
    "hosts_check": (".backends.registry", "hosts_check"),
    "cluster_for": (".backends.registry", "cluster_for"),
    "HostsCheck": (".backends.base", "HostsCheck"),
    "execute": (".sweep.run", "execute"),
    "Options": (".sweep.run", "Options"),
    "Result": (".sweep.run", "Result"),
    "Ssh": (".backends.hosts.hosts", "Ssh"),
    "Stopped": (".sweep.run", "Stopped"),
    "EXIT_OK": (".sweep.verdict", "EXIT_OK"),
    "EXIT_FAILED": (".sweep.verdict", "EXIT_FAILED"),
    "EXIT_USAGE": (".sweep.verdict", "EXIT_USAGE"),
    "EXIT_INTERRUPTED": (".sweep.verdict", "EXIT_INTERRUPTED"),
    "FailOn": (".sweep.verdict", "FailOn"),
    "resume_plan": (".sweep.resume", "resume_plan"),
    "ResumePlan": (".sweep.resume", "ResumePlan"),
    "spec_changes": (".sweep.resume", "spec_changes"),
    "SpecChanges": (".sweep.resume", "SpecChanges"),
    "timeout_seconds": (".sweep.resume", "timeout_seconds"),
    "OPTIMAL_COMMAND": (".views.summary", "OPTIMAL_COMMAND"),
    "plan_sweep": (".planning.plan", "plan_sweep"),
    "Plan": (".planning.plan", "Plan"),
    "QUEUES": (".planning.plan", "QUEUES"),
    "PLACEMENTS": (".core", "PLACEMENTS"),
    "snapshot": (".views.snapshot", "load"),
    "Snapshot": (".views.snapshot", "Snapshot"),
    # `load`, not a module's name: `autotuner.load` stays this function whatever is imported.
    "load": (".views.records", "load_results"),
    "SweepResults": (".views.records", "SweepResults"),
    "ExperimentRecord": (".views.records", "ExperimentRecord"),
    # What the `autotune` command prints and writes: the views, each on first use (rich, matplotlib only then).
    "render_status": (".views.status", "render_status"),
    "render_report": (".views.report", "render_report"),
    "render_hosts_check": (".views.hosts", "render_hosts_check"),
    "render_result": (".views.status", "render_result"),
    "Output": (".views.tables", "Output"),
    "render_compare": (".views.compare", "render_compare"),
    "render_plan": (".views.plan", "render_plan"),
    "write_plan_plot": (".views.plan", "write_plan_plot"),
    "write_plots": (".views.plots", "write_plots"),
    "write_html": (".views.html", "write_html"),
    "watching": (".views.live", "watching"),
    "check_events_path": (".views.events", "check_events_path"),
    "check_output": (".spec.outputs", "check_output"),
    "measured_peaks": (".planning.learned", "peaks_by_digest"),
    "check_results_directory": (".spec.outputs", "check_results_directory"),
    "read_tune": (".tune.request", "read_tune"),
    # The training run a tune is for (`tune` / `report --train-tokens ...`): read and checked, priced by report.
    "Goal": (".tune.goal", "Goal"),
    "training_goal": (".tune.goal", "from_options"),
    # `tune --tolerance 0.02 --max-measured-steps 40`: how long each run measures (untilsure.py).
    "until_sure": (".tune.untilsure", "asked"),
    # `tune --num_gpus 1,2,4`: the world sizes searched (worlds.py).
    "world_counts": (".tune.worlds", "counts"),
    # `autotune plan --training DIR`: the whole training run with a config a sweep measured (views/cost.py).
    "render_training_plan": (".views.training", "render_training_plan"),
    "TuneRequest": (".tune.request", "TuneRequest"),
    # `autotune dashboard`: the web stack (an optional extra) only when served.
    "serve_dashboard": (".dashboard", "serve"),
}

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "KNOWN",
    "OPTIMAL_COMMAND",
    "PLACEMENTS",
    "QUEUES",
    "Allocation",
    "Cancellation",
    "Cluster",
    "Experiment",
    "ExperimentRecord",
    "FailOn",
    "Goal",
    "HostsCheck",
    "Metric",
    "Options",
    "Output",
    "Plan",
    "Reason",
    "Result",
    "ResumePlan",
    "SlurmAsk",
    "SlurmError",
    "Snapshot",
    "SpecChanges",
    "Ssh",
    "State",
    "Stopped",
    "Sweep",
    "SweepResults",
    "TuneRequest",
    "UserError",
    "Withdrawn",
    "__version__",
    "cancel",
    "check_events_path",
    "check_gpu_needs",
    "check_options",
    "check_output",
    "check_results_directory",
    "cluster_for",
    "default_directory",
    "execute",
    "hold",
    "hosts_check",
    "load",
    "load_cluster",
    "load_sweep",
    "measured_peaks",
    "metric_named",
    "plan_sweep",
    "planned_cluster",
    "prepare",
    "prepare_tune",
    "read_tune",
    "render_compare",
    "render_hosts_check",
    "render_plan",
    "render_report",
    "render_result",
    "render_status",
    "render_training_plan",
    "resume",
    "resume_plan",
    "run",
    "serve_dashboard",
    "snapshot",
    "spec_changes",
    "timeout_seconds",
    "training_goal",
    "until_sure",
    "watching",
    "world_counts",
    "write_html",
    "write_plan_plot",
    "write_plots",
]


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module, __name__), attribute)
    globals()[name] = value  # once: later look-ups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def load_cluster(hostfile: str | Path | None = None, *, include: str = "", exclude: str = "",
                 slots: int | None = None, sweep: Sweep | None = None,
                 log: Callable[[str], None] | None = None, probe: Ssh | None = None) -> Cluster:
    """The slots a sweep may use: a DeepSpeed hostfile's (filtered by DeepSpeed's --include / --exclude syntax),
    or with none this machine's GPUs, or `slots` CPU slots of this machine.

    With `sweep`, a hostfile its DeepSpeed experiment files name is used when no `hostfile` (nor `slots`) is
    given; `log` (a callable taking a line) is told which, or why not.

    With `probe` (how to reach the hosts), the hostfile's other hosts are probed over SSH: one whose GPUs are
    in MIG mode has its MIG instances as slots (cluster.with_hosts_mig); `log` is told where its `slots=N`
    disagrees.
    """
    from .backends.hosts.hosts import hosts_cluster

    return hosts_cluster(hostfile, include=include, exclude=exclude, slots=slots, sweep=sweep, log=log, probe=probe)


def run(sweep: Sweep, cluster: Cluster | SlurmAsk | Mapping[str, object], directory: str | Path | None = None,
        options: Options | None = None, *, launcher: list[str] | None = None) -> Result:
    """`prepare` then `execute`: a new sweep run to its end (Ctrl-C stops it cleanly; `resume` finishes it).
    `cluster` may instead be the options that name one, as the backends take them (`cluster_for`'s keywords):
    a Slurm ask (`SlurmAsk(slurm=True, nodes=N, gpus_per_node=G)`, or `SlurmAsk(slurm=True)` inside an
    allocation), or a mapping (`{"ray": ""}`). The backend holds what it asks for for the run (an allocation),
    and gives it back when this returns or raises."""
    from .backends.cluster import Cluster
    from .backends.registry import cluster_for, held
    from .sweep.create import prepare
    from .sweep.run import Options, execute

    options = options or Options()
    if isinstance(cluster, Cluster):
        return execute(prepare(sweep, cluster, directory, launcher=launcher, timeout=options.timeout), options,
                       prepared=True)
    given: Mapping[str, object] = cluster if isinstance(cluster, Mapping) else asdict(cluster)
    with held({**options.backend, **given}, log=options.log) as running:
        ran = replace(options, backend=running)
        return execute(prepare(sweep, cluster_for(running), directory, launcher=launcher, timeout=ran.timeout),
                       ran, prepared=True)


def resume(directory: str | Path, options: Options | None = None, *, retry_failed: bool = False,
           only_new: bool = False, slurm: SlurmAsk | None = None) -> Result:
    """Finish an interrupted sweep: nothing that succeeded runs again; with `retry_failed`, failed and timed-out
    experiments run again. Its spec files are read again: a UserError if they changed, unless `only_new` (their
    new experiments are added). Without `options`, experiments keep the timeout the sweep was started with.
    The backend the sweep ran on holds what it needs until this returns: a sweep started in Slurm runs in this
    allocation, in its own while that still runs, or in a new one (`slurm`: `SlurmAsk(slurm=True, nodes=N,
    gpus_per_node=G)`; an allocation in `options.backend` is the caller's to hold)."""
    from .backends.registry import held
    from .sweep.resume import resume_plan
    from .sweep.run import Options, execute

    plan = resume_plan(directory, only_new=only_new)
    options = options or Options(timeout=plan.timeout)
    for note in plan.notes:
        options.log(note)
    given = {**options.backend, **(asdict(slurm) if slurm is not None else {})}
    with held(given, plan.recorded, log=options.log) as running:
        return execute(Path(directory), replace(options, backend=running), retry_failed=retry_failed,
                       new_experiments=plan.new_experiments)
