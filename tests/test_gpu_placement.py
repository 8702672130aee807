"""Placement by GPU type and by GPU memory in the pure core: the placements on their own, the queue, and the
scheduler driven by scripted `step`s (no threads, no clock, no processes). Free memory comes from a FakeNvml
read through the inventory module, as the runner reads this machine's."""
from __future__ import annotations

import itertools
import random
from dataclasses import replace
from pathlib import Path

from test_inventory import FakeDevice, FakeNvml

from autotuner.core import BackfillQueue, Finished, MemoryRecord, Queued, Reservation, Scheduler, SlotPool
from autotuner.core.outcome import Outcome
from autotuner.core.placement import ByType, GpuMemory, Pack, Spread, placement_named
from autotuner.gpu.nvml import FreeMemoryReader
from autotuner.gpu.types import headroom
from autotuner.states import Reason, State

from helpers import experiment

GiB = 1 << 30
OK = Outcome(State.SUCCEEDED, metrics={"throughput": 1.0})
# Hosts in hostfile order: two of type A with one slot each, two of type H with one slot each.
FOUR = {"a0": [0], "a1": [0], "h0": [0], "h1": [0]}
TYPES = {"a0": "A", "a1": "A", "h0": "H", "h1": "H"}


def core(exps, slots, placement, **options):
    s = Scheduler(MemoryRecord(), SlotPool(slots), "sid", Path("/r"), "throughput", placement=placement, **options)
    s.record.add_experiments(exps, 0.0)
    s.submit(Queued(e, 1) for e in exps)
    return s


def started(actions):
    return {r.experiment.name: r for r in actions.start}


def types_of(run, types=TYPES):
    return {types[h] for h in run.reservation.hosts}


def gpu(name="NVIDIA A100-SXM4-80GB", free=79 * GiB):
    return FakeDevice(name, 80 * GiB, free, "GPU-x")


# --- types ----------------------------------------------------------------------------------------------------
def test_an_experiment_never_spans_types_it_waits_for_one_type_to_hold_it():
    exps = [experiment("single"), experiment("pair", num_nodes=2), experiment("pair2", num_nodes=2)]
    s = core(exps, FOUR, placement_named("pack", TYPES))
    first = started(s.step([], 0.0))
    # single takes a0 (type A comes first); pair may not have a1 + h0 (two types): it takes both H hosts; pair2
    # waits for a0 rather than take a1 with an H host.
    assert {n: r.reservation.hosts for n, r in first.items()} == {"single": ("a0",), "pair": ("h0", "h1")}
    assert s.waiting()[0].experiment.name == "pair2"
    then = started(s.step([Finished(first["single"], OK, 1.0)], 1.0))
    assert then["pair2"].reservation.hosts == ("a0", "a1") and types_of(then["pair2"]) == {"A"}


def test_without_the_type_wrapper_pack_would_span_types():
    """The same cluster without types: the 2-node experiment takes a1 and h0 at once (what ByType prevents)."""
    exps = [experiment("single"), experiment("pair", num_nodes=2)]
    s = core(exps, FOUR, placement_named("pack", {h: None for h in FOUR}))
    assert started(s.step([], 0.0))["pair"].reservation.hosts == ("a1", "h0")


def test_types_are_tried_in_hostfile_order_and_the_first_that_fits_wins():
    slots = {"h0": [0, 1], "a0": [0, 1, 2, 3]}
    s = core([experiment("one"), experiment("four", num_gpus=4), experiment("two", num_gpus=2)], slots,
             placement_named("pack", {"h0": "H", "a0": "A"}))
    runs = started(s.step([], 0.0))
    assert runs["one"].reservation.hosts == ("h0",)  # H comes first in the hostfile, though A is larger
    assert runs["four"].reservation.hosts == ("a0",)  # H cannot hold 4: the next type does
    assert "two" not in runs  # h0 has one slot left, a0 none: it waits rather than mix


def test_a_pinned_experiment_runs_only_on_its_type_and_a_mixed_one_may_span():
    pinned = replace(experiment("pinned", num_nodes=2), gpu_type="H")
    mixed = replace(experiment("mixed", num_nodes=2), gpu_mixed=True)
    s = core([pinned, mixed], FOUR, placement_named("spread", TYPES))
    runs = started(s.step([], 0.0))
    assert runs["pinned"].reservation.hosts == ("h0", "h1")  # the A hosts were free and came first
    assert runs["mixed"].reservation.hosts == ("a0", "a1")
    s2 = core([experiment("busy"), replace(experiment("m", num_nodes=3), gpu_mixed=True)], FOUR,
              placement_named("pack", TYPES))
    assert types_of(started(s2.step([], 0.0))["m"]) == {"A", "H"}


def test_the_queue_keeps_pinned_and_unpinned_experiments_of_one_shape_apart():
    """Items of one kind must fit or not alike: a pinned one waiting for its busy type must not hold back the
    unpinned one behind it (with one kind per shape, the pass would skip it as the same kind)."""
    pool = SlotPool(FOUR)
    pool.take(Reservation.of({"h0": [0], "h1": [0]}))
    queue: BackfillQueue[Queued] = BackfillQueue(max_bypass=10)
    queue.push(Queued(replace(experiment("on-h"), gpu_type="H"), 1))
    queue.push(Queued(experiment("anywhere"), 1))
    chosen = queue.select(pool, placement_named("pack", TYPES))
    assert [(q.experiment.name, r.hosts) for q, r in chosen] == [("anywhere", ("a0",))]
    assert [q.experiment.name for q in queue] == ["on-h"]


def test_a_pin_to_a_type_whose_hosts_are_down_holds_nothing_back_and_fails_when_nothing_runs():
    pinned = replace(experiment("on-h"), gpu_type="H")
    s = core([pinned, experiment("a"), experiment("b")], FOUR, placement_named("pack", TYPES),
             queue=BackfillQueue(0))  # strict order: a head that could run blocks everything behind it
    s.pool.mark_down("h0")
    s.pool.mark_down("h1")
    runs = started(s.step([], 0.0))
    assert set(runs) == {"a", "b"}  # on-h needs hosts that are down: it did not block them
    s.step([Finished(runs["a"], OK, 1.0), Finished(runs["b"], OK, 1.0)], 1.0)
    assert s.done and s.record.finished[("on-h", 1)] == (State.FAILED, 1.0)


def test_the_failure_of_an_unplaceable_pinned_experiment_says_its_type():
    s = core([replace(experiment("on-h"), gpu_type="H")], FOUR, placement_named("pack", TYPES))
    s.pool.mark_down("h0")
    s.pool.mark_down("h1")
    actions = s.step([], 0.0)
    (note,) = [n for n in actions.notes if n.what == "finished"]
    assert note.outcome.reason == Reason.PLACEMENT
    assert note.outcome.detail == "needs 1 node(s) x 1 slot(s) of GPU type H; not enough hosts are up"


# --- memory ---------------------------------------------------------------------------------------------------
def local_reader(nvml):
    reader = FreeMemoryReader(nvml)
    return lambda host: reader.read() if host == "localhost" else None


def test_memory_placement_uses_only_gpus_with_room_other_users_counting():
    """GPU 1 of this machine is mostly held by another user's process (NVML's free says so): runs needing 30 GiB
    go on GPU 0 one after another; a run that states no need takes GPU 1 meanwhile."""
    nvml = FakeNvml([gpu(free=79 * GiB), gpu(free=20 * GiB)])
    big = [replace(experiment(f"big{i}"), gpu_memory=30 * GiB) for i in range(2)]
    s = core([*big, experiment("small")], {"localhost": [0, 1]}, placement_named("memory", measure=local_reader(nvml)))
    first = started(s.step([], 0.0))
    assert {n: r.reservation.as_dict() for n, r in first.items()} == {"big0": {"localhost": [0]},
                                                                      "small": {"localhost": [1]}}
    nvml.devices[0].free = 45 * GiB  # big0 allocated its memory: GPU 0 is still held by it in the pool anyway
    then = started(s.step([Finished(first["small"], OK, 1.0)], 1.0))
    assert then == {}  # GPU 1 is free in the pool, but 20 GiB less the headroom cannot hold 30 GiB
    nvml.devices[0].free = 79 * GiB
    then = started(s.step([Finished(first["big0"], OK, 2.0)], 2.0))
    assert then["big1"].reservation.as_dict() == {"localhost": [0]}


def test_when_nothing_runs_and_no_gpu_has_room_the_experiment_fails_instead_of_hanging():
    nvml = FakeNvml([gpu(free=10 * GiB), gpu(free=12 * GiB)])
    s = core([replace(experiment("big"), gpu_memory=30 * GiB), experiment("small")], {"localhost": [0, 1]},
             placement_named("memory", measure=local_reader(nvml)))
    runs = started(s.step([], 0.0))
    assert set(runs) == {"small"}  # big holds nothing back
    actions = s.step([Finished(runs["small"], OK, 1.0)], 1.0)
    (note,) = [n for n in actions.notes if n.what == "finished" and n.subject.experiment.name == "big"]
    assert (note.outcome.state, note.outcome.reason) == (State.FAILED, Reason.PLACEMENT)
    assert note.outcome.detail == ("needs 1 node(s) x 1 slot(s) with 30 GiB free on each GPU; no hosts that are "
                                   "up have that much room")
    assert s.done


def test_hosts_not_measured_are_judged_by_their_types_stated_size_and_unknown_ones_are_not_checked():
    sizes = {"small": 24 * 10**9, "large": 80 * 10**9}
    need = replace(experiment("need"), gpu_memory=30 * 10**9)
    memory = GpuMemory(sizes)
    pool = SlotPool({"small": [0, 1], "large": [0], "unknown": [0]})
    assert memory.place(pool, Queued(need, 1)).hosts == ("large",)
    pool.take(Reservation.of({"large": [0]}))
    assert memory.place(pool, Queued(need, 1)).hosts == ("unknown",)
    pool.take(Reservation.of({"unknown": [0]}))
    assert memory.place(pool, Queued(need, 1)) is None and memory.could_fit(pool, Queued(need, 1))
    assert not memory.could_fit(SlotPool({"small": [0, 1]}), Queued(need, 1))
    assert Pack().place(SlotPool({"small": [0, 1]}), Queued(need, 1)) is not None  # pack does not look


def test_a_type_too_small_for_the_need_is_skipped_by_any_placement_within_types():
    sizes = {"r0": 24 * 10**9, "a0": 80 * 10**9}
    need = Queued(replace(experiment("need"), gpu_memory=30 * 10**9), 1)
    for inner in (Pack(), Spread()):
        placement = ByType(inner, {"r0": "RTX-24GB", "a0": "A100-80GB"}, sizes)
        assert placement.place(SlotPool({"r0": [0, 1], "a0": [0]}), need).hosts == ("a0",)


def test_the_headroom_is_five_percent_of_the_gpu_and_at_least_one_gib():
    assert headroom(80 * GiB) == 4 * GiB and headroom(8 * GiB) == GiB
    measure = local_reader(FakeNvml([gpu(free=31 * GiB)]))
    pool = SlotPool({"localhost": [0]})

    def need(size):
        return Queued(replace(experiment("t"), gpu_memory=size), 1)

    unsized = placement_named("memory", measure=measure)  # the GPU's size unknown: 1 GiB is kept free
    assert unsized.place(pool, need(30 * GiB)) is not None and unsized.place(pool, need(30 * GiB + 1)) is None
    sized = placement_named("memory", sizes={"localhost": 80 * GiB}, measure=measure)  # 80 GiB: 4 GiB kept
    assert sized.place(pool, need(27 * GiB)) is not None and sized.place(pool, need(27 * GiB + 1)) is None


def test_placement_within_types_and_by_memory_is_monotone():
    """Fewer free slots, or less free memory, never makes an experiment fit that did not (the queue relies on
    it); and what `could_fit` rules out is never placed."""
    rng = random.Random(7)
    slots = {"a0": [0, 1], "a1": [0, 1, 2, 3], "h0": [0, 1], "localhost": [0, 1, 2]}
    types = {"a0": "A", "a1": "A", "h0": "H", "localhost": "H"}
    free = {0: 40 * GiB, 1: 10 * GiB, 2: 70 * GiB}
    sizes = {"a0": 80 * 10**9, "a1": 80 * 10**9, "h0": 24 * 10**9}
    placement = placement_named("memory", types, sizes, lambda h: free if h == "localhost" else None)
    ids = [(h, i) for h, hs in slots.items() for i in hs]
    demands = [Queued(replace(experiment(f"d{n}{g}{m}{t}"), num_nodes=n, num_gpus=g, gpu_memory=m, gpu_type=t), 1)
               for n, g, m, t in itertools.product([1, 2], [1, 2, 3], [None, 20 * GiB, 30 * GiB], [None, "H"])]
    for _ in range(200):
        more = SlotPool(slots)
        held = rng.sample(ids, rng.randrange(len(ids)))
        fewer = SlotPool(slots)
        for host, i in held:
            fewer.take(Reservation.of({host: [i]}))
        for host, i in held[: len(held) // 2]:
            more.take(Reservation.of({host: [i]}))
        for d in demands:
            on_fewer = placement.place(fewer, d)
            if on_fewer is not None:
                assert placement.place(more, d) is not None, (d, held)
                assert len({types[h] for h in on_fewer.hosts}) == 1
            if not placement.could_fit(more, d):
                assert placement.place(more, d) is None
    less = {0: 30 * GiB, 1: 10 * GiB, 2: 30 * GiB}
    poorer = placement_named("memory", types, sizes, lambda h: less if h == "localhost" else None)
    for d in demands:
        if poorer.place(SlotPool(slots), d) is not None:
            assert placement.place(SlotPool(slots), d) is not None
