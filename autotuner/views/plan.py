"""What `autotune plan` prints: each policy's predicted makespan (P10/P50/P90), GPU-hours and utilisation
against the lower bound, then when each experiment is expected to start and end; or all of it as JSON; and
the slot timeline of the plan, drawn as the report draws a sweep's."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ..errors import UserError
from ..files import write_atomic
from ..jsonvalues import JSONObject
from ..ledger.store import Attempt
from ..planning.durations import SureSteps
from ..planning.plan import RUN_BUDGET, Plan, PolicyPlan
from ..planning.simulate import Played
from ..states import State
from .panel import seconds
from .plots import _png, _require_matplotlib, timeline_figure
from .snapshot import format_slots
from .tables import PLAIN, Column, Output, render_table

SCHEDULE_ROWS = 40  # experiments listed in the table format (JSON lists every one)


def _policy_json(plan: Plan, p: PolicyPlan) -> JSONObject:
    t = p.expected
    return {"policy": p.queue, "placement": p.placement,
            "makespan_s": {"p10": p.percentile(10), "p50": p.percentile(50), "p90": p.percentile(90),
                           "at_estimates": t.makespan},
            "gpu_hours": t.slot_seconds / 3600, "utilisation": t.utilisation,
            "vs_lower_bound": t.makespan / plan.lower_bound if plan.lower_bound else None,
            "timed_out": sum(1 for r in t.played if r.state == State.TIMED_OUT),
            "experiments": [{"name": r.name, "start_s": r.start, "end_s": r.end,
                             "slots": {h: list(ids) for h, ids in r.slots.items()}, "state": str(r.state)}
                            for r in _in_order(plan, p)]}


def plan_json(plan: Plan) -> JSONObject:
    return {"experiments": len(plan.experiments), "slots": plan.slot_count, "hosts": len(plan.slots),
            "durations": plan.durations.counts(), "spread": plan.spread, "samples": plan.samples,
            "samples_asked": plan.samples_asked, "learned_memory": plan.learned_memory,
            "timeout_s": plan.timeout, "work_slot_s": plan.work, "longest_s": plan.longest,
            "lower_bound_s": plan.lower_bound, "plans": [_policy_json(plan, p) for p in plan.policies],
            "until_sure": dataclasses.asdict(plan.durations.until_sure) if plan.durations.until_sure else None}


def _until_sure(sure: SureSteps | None) -> str:
    """The head's word on the runs measured until sure: the steps each is expected to make, as a range."""
    if sure is None:
        return ""
    if sure.spread is None:
        return f"; measured until sure: up to {sure.most} steps a run (no earlier run measured the step spread)"
    return (f"; measured until sure: {sure.fewest} to {sure.most} steps a run, {sure.median} at the earlier runs' "
            f"median step spread ({sure.spread:.1%})")


def render_plan(plan: Plan, fmt: str = "table", output: Output = PLAIN) -> str:
    if fmt not in ("table", "json"):
        raise UserError(f"unknown --format {fmt!r}; choose table or json")
    if fmt == "json":
        return json.dumps(plan_json(plan), indent=2) + "\n"
    origins = ", ".join(f"{n} {o}" for o, n in sorted(plan.durations.counts().items(), key=lambda kv: -kv[1]))
    head = (f"plan: {len(plan.experiments)} experiments on {plan.slot_count} slot(s) of {len(plan.slots)} host(s); "
            f"durations: {origins}" + (f"; spread {plan.spread:g}, {plan.samples} draws" if plan.spread else
                                       f"; measured spreads, {plan.samples} draws" if plan.samples > 1 else "")
            + (f" (of the {plan.samples_asked} asked: a plan plays at most {RUN_BUDGET:,} runs)"
               if (plan.spread or plan.samples > 1) and plan.samples < plan.samples_asked else "")
            + (f"; GPU memory needs: {plan.learned_memory} learned" if plan.learned_memory else "")
            + _until_sure(plan.durations.until_sure))
    bound = (f"lower bound {seconds(plan.lower_bound)}: max(work {plan.work / 3600:,.2f} slot-hours / "
             f"{plan.slot_count} slots, longest experiment {seconds(plan.longest)})")
    columns = [Column("policy"), Column("placement"), Column("makespan P10", True), Column("P50", True),
               Column("P90", True), Column("GPU-hours", True), Column("utilisation", True),
               Column("x lower bound", True)]
    rows = [(p.queue, p.placement, seconds(p.percentile(10)), seconds(p.percentile(50)), seconds(p.percentile(90)),
             f"{p.expected.slot_seconds / 3600:,.2f}", f"{p.expected.utilisation:.0%}",
             f"{p.expected.makespan / plan.lower_bound:.2f}" if plan.lower_bound else "-") for p in plan.policies]
    first = plan.policies[0]
    timed_out = sum(1 for r in first.expected.played if r.state == State.TIMED_OUT)
    notes = [f"{timed_out} experiment(s) are expected to run past their timeout and be ended there"] if timed_out \
        else []
    text = head + "\n" + bound + "\n" + render_table(columns, rows, notes=notes, output=output)
    played = _in_order(plan, first)
    schedule = [(r.name, seconds(r.start), seconds(r.end), format_slots(r.slots, sep=" "))
                for r in played[:SCHEDULE_ROWS]]
    more = [f"... {len(played) - SCHEDULE_ROWS} more (--format json lists every one)"] \
        if len(played) > SCHEDULE_ROWS else []
    return (text + f"expected schedule ({first.queue}, {first.placement}, at the estimates):\n"
            + render_table([Column("experiment", whole=True), Column("start", True), Column("end", True),
                            Column("slots")], schedule, notes=more, output=output))


def _in_order(plan: Plan, p: PolicyPlan) -> list[Played]:
    """By start, then in the sweep's order."""
    index = {e.name: i for i, e in enumerate(plan.experiments)}
    return sorted(p.expected.played, key=lambda r: (r.start, index.get(r.name, 0)))


def write_plan_plot(plan: Plan, path: Path) -> Path:
    """The first policy's expected schedule as the report's slot timeline, into `path` (PNG)."""
    _require_matplotlib()
    first = plan.policies[0]
    attempts = [Attempt(r.name, 1, r.state, 0.0, started_at=r.start, finished_at=r.end,
                        slots={h: list(ids) for h, ids in r.slots.items()}) for r in first.expected.played]
    figure = timeline_figure(f"plan ({first.queue}, {first.placement})",
                             {h: list(ids) for h, ids in plan.slots.items()}, attempts, first.expected.makespan,
                             xlabel="seconds from the start (predicted)")
    try:
        write_atomic(path, _png(figure))
    except OSError as e:
        raise UserError(f"cannot write the plot: {e.strerror or e}", path) from None
    return path
