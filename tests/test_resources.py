from dataclasses import dataclass

import pytest

from autotuner.core import BackfillQueue, Pack, Reservation, SlotPool, Spread, fifo


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


def pool_with_free(free):
    """A pool of 4 slots per host with only `free` (host -> ids) free."""
    pool = SlotPool({h: range(4) for h in free})
    pool.take(Reservation.of({h: set(range(4)) - set(ids) for h, ids in free.items()}))
    return pool


def test_pack_puts_each_node_on_the_fullest_host_that_fits():
    pool = pool_with_free({"a": {0, 1, 2, 3}, "b": {2, 3}, "c": {1}})
    assert Pack().place(pool, Job("x", 1, 1)).as_dict() == {"c": [1]}
    assert Pack().place(pool, Job("x", 1, 2)).as_dict() == {"b": [2, 3]}
    assert Pack().place(pool, Job("x", 2, 2)).as_dict() == {"a": [0, 1], "b": [2, 3]}
    assert Pack().place(pool, Job("x", 1, 5)) is None
    assert Pack().place(pool, Job("x", 3, 2)) is None


def test_spread_puts_each_node_on_the_emptiest_host_and_lists_hosts_in_hostfile_order():
    pool = pool_with_free({"a": {3}, "b": {0, 1, 2, 3}, "c": {1, 2}})
    assert Spread().place(pool, Job("x", 1, 1)).as_dict() == {"b": [0]}
    assert Spread().place(pool, Job("x", 2, 1)).as_dict() == {"b": [0], "c": [1]}
    assert Spread().place(pool, Job("x", 3, 2)) is None


def test_the_free_index_follows_takes_give_backs_and_hosts_going_down():
    pool = SlotPool({"a": range(2), "b": range(4), "c": range(4)})
    assert list(pool.fitting(1)) == ["a", "b", "c"] and pool.free_count() == 10
    pool.take(Reservation.of({"c": [0, 1, 2]}))
    assert list(pool.fitting(1)) == ["c", "a", "b"]  # fewest free first, then hostfile order
    assert list(pool.fitting(2, fewest_first=False)) == ["b", "a"]
    assert pool.count_fitting(2) == 2 and pool.free_count() == 7
    pool.mark_down("b")
    assert list(pool.fitting(1)) == ["c", "a"] and pool.free_count() == 3
    pool.give_back(Reservation.of({"c": [0, 1, 2]}))
    assert list(pool.fitting(3)) == ["c"]
    pool.mark_up("b")
    assert list(pool.fitting(3)) == ["b", "c"] and pool.any_free()


def test_mixed_slot_counts_are_all_usable():
    pool = SlotPool({"big": range(8), "small": range(2)})
    queue = BackfillQueue(max_bypass=100)
    for i in range(10):
        queue.push(Job(f"j{i}"))
    started = queue.select(pool, Pack())
    assert len(started) == 10 and sum(map(len, pool.free().values())) == 0


def test_backfill_uses_slots_a_large_waiting_experiment_cannot():
    pool = SlotPool({"a": range(4)})
    pool.take(Reservation.of({"a": [0, 1]}))  # something is running
    queue = BackfillQueue(max_bypass=5)
    queue.push(Job("large", num_gpus=4))
    queue.push(Job("small1"))
    queue.push(Job("small2"))
    started = [job.name for job, _ in queue.select(pool, Pack())]
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
    first = queue.select(pool, Pack())
    assert [j.name for j, _ in first] == ["small0"]  # overtaken once
    pool.give_back(first[0][1])
    second = queue.select(pool, Pack())
    assert [j.name for j, _ in second] == ["small1"]  # overtaken twice: the limit
    pool.give_back(Reservation.of({"a": [0]}))  # the original run ends; slot 0 is free, slot 1 is small1's
    assert queue.select(pool, Pack()) == []  # slot 0 is held for large, not given to small2
    pool.give_back(second[0][1])
    third = queue.select(pool, Pack())
    assert [j.name for j, _ in third] == ["large"]


def test_remove_and_push_front():
    queue = BackfillQueue(max_bypass=1)
    for name in ("a", "b", "c"):
        queue.push(Job(name))
    assert [j.name for j in queue.remove(lambda j: j.name == "b")] == ["b"]
    queue.push_front(Job("z"))
    assert [j.name for j in queue] == ["z", "a", "c"]


def test_fifo_lets_nothing_overtake_the_oldest():
    pool = SlotPool({"a": range(2)})
    pool.take(Reservation.of({"a": [0]}))
    queue = fifo()
    queue.push(Job("large", num_gpus=2))
    queue.push(Job("small"))
    assert queue.select(pool, Pack()) == []
    pool.give_back(Reservation.of({"a": [0]}))
    assert [j.name for j, _ in queue.select(pool, Pack())] == ["large"]


def test_a_pass_costs_one_look_per_kind_not_per_waiting_item():
    """100,000 waiting experiments of a kind that does not fit: a pass looks at the kind once (in the free
    index, without even trying the placement) and never at the 99,999 behind its head."""
    tried = []

    class Counting(Pack):
        def place(self, pool, demand):
            tried.append(demand.name)
            return super().place(pool, demand)

    pool = SlotPool({"a": range(4)})
    queue = BackfillQueue(max_bypass=10**9)
    for i in range(100_000):
        queue.push(Job(f"big{i}", num_gpus=4))
    queue.push(Job("small"))
    pool.take(Reservation.of({"a": [0]}))
    started = queue.select(pool, Counting())
    assert [j.name for j, _ in started] == ["small"] and tried == ["small"]
    assert len(queue) == 100_000 and next(iter(queue)).name == "big0"
