from dataclasses import dataclass

import pytest

from autotuner.core import BackfillQueue, BestFit, Reservation, SlotPool


@dataclass(frozen=True)
class Job:
    name: str
    num_nodes: int = 1
    num_gpus: int = 1


def test_pool_takes_and_gives_back_whole_reservations():
    pool = SlotPool({"a": [0, 1], "b": [0, 1, 2, 3]})
    r = Reservation.of({"a": [1], "b": [0, 3]})
    pool.take(r)
    assert pool.free() == {"a": frozenset({0}), "b": frozenset({1, 2})}
    with pytest.raises(ValueError):
        pool.take(Reservation.of({"a": [0, 1]}))  # slot 1 is taken: nothing of it is taken
    assert pool.free()["a"] == frozenset({0})
    pool.give_back(r)
    assert pool.free() == {"a": frozenset({0, 1}), "b": frozenset({0, 1, 2, 3})}


def test_down_hosts_are_not_offered():
    pool = SlotPool({"a": [0], "b": [0]})
    pool.mark_down("a")
    assert list(pool.free()) == ["b"]
    assert pool.could_fit(2, 1) and not pool.could_fit(2, 1, up_only=True)
    pool.mark_up("a")
    assert list(pool.free()) == ["a", "b"]


def test_best_fit_packs_into_the_fullest_host_that_fits():
    free = {"a": frozenset({0, 1, 2, 3}), "b": frozenset({2, 3}), "c": frozenset({1})}
    assert BestFit().place(free, 1, 1).as_dict() == {"c": [1]}
    assert BestFit().place(free, 1, 2).as_dict() == {"b": [2, 3]}
    assert BestFit().place(free, 2, 2).as_dict() == {"a": [0, 1], "b": [2, 3]}
    assert BestFit().place(free, 1, 5) is None
    assert BestFit().place(free, 3, 2) is None


def test_mixed_slot_counts_are_all_usable():
    pool = SlotPool({"big": range(8), "small": range(2)})
    queue = BackfillQueue(max_bypass=100)
    for i in range(10):
        queue.push(Job(f"j{i}"))
    started = queue.select(pool, BestFit())
    assert len(started) == 10 and sum(map(len, pool.free().values())) == 0


def test_backfill_uses_slots_a_large_waiting_experiment_cannot():
    pool = SlotPool({"a": range(4)})
    pool.take(Reservation.of({"a": [0, 1]}))  # something is running
    queue = BackfillQueue(max_bypass=5)
    queue.push(Job("large", num_gpus=4))
    queue.push(Job("small1"))
    queue.push(Job("small2"))
    started = [job.name for job, _ in queue.select(pool, BestFit())]
    assert started == ["small1", "small2"]
    assert [j.name for j in queue] == ["large"]


def test_a_waiting_experiment_is_not_starved():
    """Once overtaken max_bypass times, what frees up is held for it."""
    pool = SlotPool({"a": range(2)})
    queue = BackfillQueue(max_bypass=2)
    queue.push(Job("large", num_gpus=2))
    for i in range(10):
        queue.push(Job(f"small{i}"))
    pool.take(Reservation.of({"a": [0]}))  # a running experiment holds slot 0
    first = queue.select(pool, BestFit())
    assert [j.name for j, _ in first] == ["small0"]  # overtaken once
    pool.give_back(first[0][1])
    second = queue.select(pool, BestFit())
    assert [j.name for j, _ in second] == ["small1"]  # overtaken twice: the limit
    pool.give_back(Reservation.of({"a": [0]}))  # the original run ends; slot 0 is free, slot 1 is small1's
    assert queue.select(pool, BestFit()) == []  # slot 0 is held for large, not given to small2
    pool.give_back(second[0][1])
    third = queue.select(pool, BestFit())
    assert [j.name for j, _ in third] == ["large"]


def test_remove_and_push_front():
    queue = BackfillQueue(max_bypass=1)
    for name in ("a", "b", "c"):
        queue.push(Job(name))
    assert [j.name for j in queue.remove(lambda j: j.name == "b")] == ["b"]
    queue.push_front(Job("z"))
    assert [j.name for j in queue] == ["z", "a", "c"]
