"""CPU slots bound to disjoint cores (autotuner/backends/local/cores.py): the shares by hand, and real runs on two
CPU slots of this machine, each started under its slots' cores with OMP_NUM_THREADS sized to them (a stand-in launcher
records what the kernel says it may run on: /proc/self/status)."""
import os
from pathlib import Path

import autotuner
from autotuner.backends.local.cores import bound, core_list, shares, slot_cores


def test_each_slot_gets_its_own_share_of_the_cores():
    cores = [0, 1, 2, 3, 4, 5, 6, 7]
    assert [slot_cores(i, 4, cores) for i in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [slot_cores(i, 3, cores) for i in range(3)] == [[0, 1], [2, 3, 4], [5, 6, 7]]
    assert [slot_cores(i, 3, [0, 1]) for i in range(3)] == [[0], [0], [1]] and shares(3, [0, 1])
    assert core_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8" and core_list([3]) == "3"
    argv, env = bound(["deepspeed", "train.py"], {"X": "1"}, [2, 3], 4, cores)
    assert argv == ["taskset", "-c", "4-7", "deepspeed", "train.py"] and env == {"OMP_NUM_THREADS": "2", "X": "1"}
    assert bound(["d"], {"OMP_NUM_THREADS": "7"}, [0], 4, cores)[1]["OMP_NUM_THREADS"] == "7"  # the user's wins


STANDIN = """#!/bin/sh
# one write per run: two runs appending piecewise to the shared log could interleave their halves
printf '%s %s\\n' "$(grep Cpus_allowed_list /proc/self/status | cut -f2)" "$OMP_NUM_THREADS" >> "$CORES_LOG"
sleep 0.5
printf '{"throughput": 1.0}' > "$AUTOTUNE_METRICS_PATH"
"""


def test_two_cpu_runs_at_once_run_on_disjoint_cores(tmp_path, monkeypatch):
    (tmp_path / "launcher.sh").write_text(STANDIN)
    (tmp_path / "train.py").write_text("# stand-in: the launcher never runs it\n")
    monkeypatch.setenv("CORES_LOG", str(tmp_path / "cores.log"))
    experiments = tuple(autotuner.Experiment(name=f"e{i}", num_gpus=1, num_nodes=1, script=str(tmp_path / "train.py"),
                                             ds_config={"train_micro_batch_size_per_gpu": 1}, source="test")
                        for i in range(2))
    sweep = autotuner.Sweep(name="cores", experiments=experiments, metric=autotuner.metric_named("throughput"),
                            source="test")
    directory = autotuner.prepare(sweep, autotuner.load_cluster(slots=2), tmp_path / "res",
                                  launcher=["sh", str(tmp_path / "launcher.sh")])
    snap = autotuner.execute(directory, autotuner.Options(grace=1.0)).snapshot
    assert snap.counts() == {"succeeded": 2}
    usable = sorted(os.sched_getaffinity(0))
    seen = [line.split() for line in Path(tmp_path / "cores.log").read_text().splitlines()]
    assert len(seen) == 2
    lists = [set(slot_cores(i, 2, usable)) for i in range(2)]
    expected = {core_list(sorted(cores)) for cores in lists}
    assert {cores for cores, _ in seen} == expected
    assert {threads for _, threads in seen} == {str(max(1, len(usable) // 2))}
    if len(usable) >= 2:  # disjoint while there are cores enough: neither run measures the other
        assert not lists[0] & lists[1]
