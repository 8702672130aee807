"""Sweeps on GPU types, end to end with stand-in launchers: a local hostfile of two host names of this machine
(`localhost` and `127.0.0.1`, each run directly, no ssh) stating two GPU types; results, report, outcome files
and compare per type; pins; resume with the recorded types; the memory placement through the runner with a
FakeNvml standing in for this machine's GPUs; `autotune plan` with types and `--placement memory`; the type
column of `autotune hosts`."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_inventory import FakeDevice, FakeNvml

import autotuner
from autotuner.backends.ssh.probe import HostReport
from autotuner.gpu.nvml import Gpu
from autotuner.ledger.store import Ledger
from autotuner.planning.learned import need_of_peak
from autotuner.spec.hostfile import parse_hostfile

from cli_rig import SLEEP_THEN_SUCCEED, autotune, env, expected_throughput, write_launcher
from helpers import render_hosts

GiB = 1 << 30
TWO_TYPES = "localhost slots=2 accelerator=cpu gpu=A100-80GB\n127.0.0.1 slots=2 accelerator=cpu gpu=H100-80GB\n"
TYPE_OF_HOST = {"localhost": "A100-80GB", "127.0.0.1": "H100-80GB"}


def setup(directory: Path, extra: str = "", hosts: str = TWO_TYPES, count: int = 8) -> tuple[Path, Path, str]:
    """A sweep file of `count` experiments, a hostfile and a stand-in launcher, in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train.py").touch()
    spec = directory / "sweep.hjson"
    spec.write_text("{\n  name: s\n  script: train.py\n" + extra + "  ds_config: {train_micro_batch_size_per_gpu: 1}\n"
                    f"  space: {{x: {list(range(1, count + 1))}}}\n}}\n")
    hostfile = directory / "hosts"
    hostfile.write_text(hosts)
    return spec, hostfile, write_launcher(directory, SLEEP_THEN_SUCCEED)


def run_env(directory: Path) -> dict[str, str]:
    return env(LAUNCH_LOG=directory / "launches.log", STANDIN_SECONDS=0.05)


def recorded(results: Path):
    with Ledger.open(results) as ledger:
        return ledger.meta(), {a.name: a for a in ledger.latest()}


@pytest.fixture(scope="module")
def two_sweeps(tmp_path_factory):
    """One sweep over both types, and the same sweep pinned to H100-80GB (`--gpu-type`)."""
    base = tmp_path_factory.mktemp("types")
    spec, hosts, launcher = setup(base)
    mixed, pinned = base / "both", base / "pinned"
    for results, more in ((mixed, []), (pinned, ["--gpu-type", "H100-80GB"])):
        out = autotune("run", spec, "-H", hosts, "--launcher", launcher, "-o", results, "-q", *more,
                       environ=run_env(base))
        assert out.returncode == 0, out.stderr
    return mixed, pinned


def best_per_type(attempts) -> dict[str, str]:
    best: dict[str, str] = {}
    for a in sorted(attempts.values(), key=lambda a: -expected_throughput(a.name)):
        (host,) = a.slots
        best.setdefault(TYPE_OF_HOST[host], a.name)
    return best


def test_a_sweep_on_two_types_ranks_and_keeps_its_best_per_type(two_sweeps):
    results, _ = two_sweeps
    meta, attempts = recorded(results)
    assert meta.gpu_types == TYPE_OF_HOST and meta.gpu_memory == {h: 80 * 10**9 for h in TYPE_OF_HOST}
    assert {TYPE_OF_HOST[h] for a in attempts.values() for h in a.slots} == {"A100-80GB", "H100-80GB"}
    best = best_per_type(attempts)
    report = json.loads(autotune("report", results, "--format", "json").stdout)
    assert report["best_by_type"] == best and report["best"] == best["A100-80GB"]  # the hostfile's first type
    rows = report["experiments"]
    in_hostfile_order = list(dict.fromkeys(TYPE_OF_HOST.values()))  # the report ranks type by type, in this order
    assert [r["gpu_type"] for r in rows] == sorted((r["gpu_type"] for r in rows), key=in_hostfile_order.index)
    for gpu_type, name in best.items():
        ranked = [r for r in rows if r["gpu_type"] == gpu_type]
        assert [r["rank"] for r in ranked] == list(range(1, len(ranked) + 1))
        assert [r["name"] for r in ranked if r["best"]] == [name] == [ranked[0]["name"]]
        assert [r["metric"] for r in ranked] == sorted((r["metric"] for r in ranked), reverse=True)
        config = json.loads((results / f"ds_config_optimal.{gpu_type}.json").read_text())
        assert config["x"] == int(name.rsplit("x", 1)[1])
        command = (results / f"cmd_optimal.{gpu_type}.txt").read_text()
        assert f"ds_config_optimal.{gpu_type}.json" in command
        assert report["optimal_by_type"][gpu_type]["config"] == config
    first = (results / "ds_config_optimal.A100-80GB.json").read_text()
    assert (results / "ds_config_optimal.json").read_text() == first
    summary = (results / "summary.txt").read_text()  # DeepSpeed's shape: the overall best; per type: the report
    assert "| global " in summary
    table = autotune("report", results).stdout
    assert "GPU type" in table and "ranked per GPU type" in table and "best config of H100-80GB" in table
    assert autotune("report", results, "--format", "csv").stdout.startswith("rank,best,name,gpu_type,state,x,")
    # like any report: every swept parameter and every metric, per row
    assert all(r["parameters"]["x"] == int(r["name"].rsplit("x", 1)[1]) and "throughput" in r["metrics"]
               for r in rows if r["state"] == "succeeded")
    assert "| GPU type |" in autotune("report", results, "--format", "md").stdout


def test_a_sweep_pinned_to_one_type_runs_there_and_reads_as_ever(two_sweeps):
    _, results = two_sweeps
    _, attempts = recorded(results)
    assert {h for a in attempts.values() for h in a.slots} == {"127.0.0.1"}
    with Ledger.open(results) as ledger:
        assert {(e.gpu_type, e.gpu_mixed) for e in ledger.experiments()} == {("H100-80GB", False)}
    report = json.loads(autotune("report", results, "--format", "json").stdout)
    assert "best_by_type" not in report and all("gpu_type" not in r for r in report["experiments"])
    assert autotune("report", results, "--format", "csv").stdout.startswith("rank,best,name,state,")
    assert sorted(p.name for p in results.glob("*optimal*")) == ["cmd_optimal.txt", "ds_config_optimal.json"]
    assert "GPU type" not in autotune("report", results).stdout
    again = autotune("resume", results, "-q")  # --gpu-type was recorded: the spec reads the same again
    assert again.returncode == 0 and "changed" not in again.stderr, again.stderr


def test_compare_pairs_an_experiment_only_with_itself_on_the_same_type(two_sweeps):
    both, pinned = two_sweeps
    _, attempts = recorded(both)
    on_h = sorted(n for n, a in attempts.items() if "127.0.0.1" in a.slots)
    on_a = sorted(n for n, a in attempts.items() if "localhost" in a.slots)
    data = json.loads(autotune("compare", both, pinned, "--format", "json").stdout)
    assert sorted(r["name"] for r in data["experiments"]) == on_h
    assert {r["gpu_type"] for r in data["experiments"]} == {"H100-80GB"}
    assert sorted(data["only_a"]) == [f"{n} (A100-80GB)" for n in on_a]
    assert sorted(data["only_b"]) == [f"{n} (H100-80GB)" for n in on_a]
    assert "paired per GPU type" in autotune("compare", both, pinned).stdout


def test_resume_places_by_the_types_recorded_when_the_sweep_was_prepared(tmp_path):
    """The hostfile is gone by the time the sweep runs: only the ledger's record can keep experiments apart."""
    spec, hosts, launcher = setup(tmp_path, count=4, extra="  num_nodes: 1\n  gpu_type: H100-80GB\n")
    sweep = autotuner.load_sweep([spec])
    directory = autotuner.prepare(sweep, autotuner.load_cluster(hosts), tmp_path / "r",
                                  launcher=launcher.split())
    hosts.unlink()
    out = autotune("resume", directory, "-q", environ=run_env(tmp_path))
    assert out.returncode == 0, out.stderr
    _, attempts = recorded(directory)
    assert {h for a in attempts.values() for h in a.slots} == {"127.0.0.1"}


@pytest.mark.parametrize(("extra", "more", "message"), [
    ("", ["--gpu-type", "V100"], "autotune: error: --gpu-type V100: the cluster has no GPU of that type "
                                 "(GPU types: A100-80GB, H100-80GB)"),
    ("  gpu_type: V100\n", [], "sweep.hjson:4: experiment s_x1 is pinned to GPU type V100, which the cluster lacks"),
    ("  num_nodes: 2\n", [], "sweep.hjson:4: experiment s_x1 needs 2 node(s) with 1 slot(s) each of one GPU type"),
    ('  gpu_memory: "2TB"\n', [], "sweep.hjson:4: experiment s_x1 needs 1862.6 GiB on each GPU"),
    ("", ["--placement", "best"], "--placement 'best': choose from pack, spread, memory"),
])
def test_what_the_cluster_cannot_give_is_one_line_and_nothing_is_created(tmp_path, extra, more, message):
    spec, hosts, launcher = setup(tmp_path, extra=extra)
    out = autotune("run", spec, "-H", hosts, "--launcher", launcher, "-o", tmp_path / "r", *more,
                   environ=run_env(tmp_path))
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and message in lines[0], out.stderr
    assert not (tmp_path / "r").exists() and not (tmp_path / "launches.log").exists()


# --- GPU memory -------------------------------------------------------------------------------------------------
def busy_gpu_0() -> FakeNvml:
    """This machine as NVML shows it: two A100s, GPU 0 mostly held by another user's process."""
    return FakeNvml([FakeDevice("NVIDIA A100-SXM4-80GB", 80 * GiB, 20 * GiB, "GPU-0"),
                     FakeDevice("NVIDIA A100-SXM4-80GB", 80 * GiB, 79 * GiB, "GPU-1")])


# Fails the first launch of s_x2 (a failure that is not retried), succeeds otherwise.
FAIL_X2_ONCE = SLEEP_THEN_SUCCEED.replace(
    'sleep "${STANDIN_SECONDS:-0.1}"\n',
    'sleep "${STANDIN_SECONDS:-0.1}"\n'
    'if [ "$name" = s_x2 ] && mkdir "$LAUNCH_LOG.failed" 2>/dev/null; then exit 1; fi\n')


def test_the_memory_placement_runs_each_experiment_on_a_gpu_with_room_and_resume_keeps_it(tmp_path, monkeypatch):
    """Runs that need 30 GiB all go to GPU 1 (pack would take GPU 0 first); the placement is recorded, so the
    failed run that `resume --retry-failed` runs again goes there too."""
    nvml = busy_gpu_0()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)  # what inventory imports: the runner's reads come here
    for name, value in run_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    spec, _, _ = setup(tmp_path, count=3, extra='  gpu_memory: "30GiB"\n')
    launcher = write_launcher(tmp_path, FAIL_X2_ONCE, "failing.sh")
    sweep = autotuner.load_sweep([spec])
    cluster = autotuner.load_cluster()  # this machine: the fake's two A100s
    assert cluster.types == {"localhost": "A100-SXM4-80GB"} and cluster.slots == {"localhost": (0, 1)}
    directory = autotuner.prepare(sweep, cluster, tmp_path / "r", launcher=launcher.split())
    result = autotuner.execute(directory, autotuner.Options(placement="memory", grace=1.0))
    meta, attempts = recorded(directory)
    assert result.exit_code == 1 and attempts["s_x2"].state == "failed"
    assert meta.placement == "memory" and {n: a.slots for n, a in attempts.items()} == {
        f"s_x{i}": {"localhost": [1]} for i in (1, 2, 3)}
    again = autotuner.resume(directory, retry_failed=True)
    _, attempts = recorded(directory)
    assert again.exit_code == 0 and (attempts["s_x2"].attempt, attempts["s_x2"].slots) == (2, {"localhost": [1]})
    assert nvml.calls.count("init") == nvml.calls.count("shutdown") >= 2  # one NVML session per runner


def test_with_pack_the_same_sweep_takes_the_busy_gpu(tmp_path, monkeypatch):
    """The control: the placement, not the sweep, kept the runs above off GPU 0."""
    monkeypatch.setitem(sys.modules, "pynvml", busy_gpu_0())
    for name, value in run_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    spec, _, launcher = setup(tmp_path, count=2, extra='  gpu_memory: "30GiB"\n')
    directory = autotuner.prepare(autotuner.load_sweep([spec]), autotuner.load_cluster(), tmp_path / "r",
                                  launcher=launcher.split())
    assert autotuner.execute(directory, autotuner.Options(grace=1.0)).exit_code == 0
    _, attempts = recorded(directory)
    assert 0 in {a.slots["localhost"][0] for a in attempts.values()}


# --- learned memory ---------------------------------------------------------------------------------------------
# A stand-in that tells the FakeNvml which GPUs it runs on (its --include) and its pid; fails s_x1's first launch.
# gpu.pid appears whole (written aside, then renamed): the reader polls it, and a loaded machine let it read the
# file between the shell's truncating and writing it (an empty line, which killed the peak reader's thread).
HOLD_GPU = SLEEP_THEN_SUCCEED.replace(
    'sleep "${STANDIN_SECONDS:-0.1}"\n',
    'prev=; for a; do [ "$prev" = --include ] && gpus=${a#*:}; prev=$a; done\n'
    'here=$(dirname "$AUTOTUNE_METRICS_PATH")\n'
    'echo "$$ $gpus" > "$here/gpu.pid.part" && mv "$here/gpu.pid.part" "$here/gpu.pid"\n'
    'sleep "${STANDIN_SECONDS:-0.1}"\n'
    'if [ "$name" = s_x1 ] && mkdir "$LAUNCH_LOG.failed" 2>/dev/null; then exit 1; fi\n')
HOLDS = {"s_x1": 30 * GiB, "s_x2": 12 * GiB, "s_x3": 8 * GiB}  # what each stand-in run holds on its GPU


def holding(results: list[Path]) -> FakeNvml:
    """busy_gpu_0, whose process lists show the stand-in runs of the sweeps in `results` holding HOLDS."""
    nvml = busy_gpu_0()

    def processes(index: int) -> list[tuple[int, int | None]]:
        found = []
        for pid_file in (p for r in results for p in r.glob("*/gpu.pid")):
            pid, gpus = pid_file.read_text().split()
            if str(index) in gpus.split(","):
                found.append((int(pid), HOLDS[pid_file.parent.name]))
        return found

    for index, device in enumerate(nvml.devices):
        device.processes = lambda index=index: processes(index)
    return nvml


def test_peak_memory_is_recorded_shown_and_learned_by_a_retry_a_later_sweep_and_plan(tmp_path, monkeypatch):
    """Nothing states gpu_memory. The first sweep (memory placement) runs s_x1 on GPU 0, the busy one, where it
    holds 30 GiB and fails; its peak is recorded and shown. Its retry needs 33 GiB (the peak and 10%): GPU 1.
    A second sweep learns the needs from the first (`--from`) and runs s_x1 on GPU 1 from the start; the others,
    small enough, on GPU 0. `plan --from` keeps s_x1 off the 24 GB host."""
    import autotuner.backends.local.peaks

    monkeypatch.setattr(autotuner.backends.local.peaks, "PERIOD", 0.05)
    first, second = tmp_path / "first", tmp_path / "second"
    nvml = holding([first, second])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    for name, value in env(LAUNCH_LOG=tmp_path / "launches.log", STANDIN_SECONDS=0.5).items():
        monkeypatch.setenv(name, value)
    spec, _, _ = setup(tmp_path, count=3)
    launcher = write_launcher(tmp_path, HOLD_GPU, "holding.sh").split()
    sweep = autotuner.load_sweep([spec])
    options = autotuner.Options(placement="memory", grace=1.0, retries=0)
    autotuner.prepare(sweep, autotuner.load_cluster(), first, launcher=launcher)
    assert autotuner.execute(first, options).exit_code == 1
    with Ledger.open(first) as ledger:
        ran = {(a.name, a.attempt): a.peak_memory for a in ledger.attempts()}
        assert ledger.attempts("s_x1")[0].slots == {"localhost": [0]}  # no need stated: best fit, GPU 0 first
    assert ran == {(name, 1): held for name, held in HOLDS.items()}

    report = json.loads(autotune("report", first, "--format", "json").stdout)
    assert {r["name"]: r["peak_memory"] for r in report["experiments"]} == HOLDS
    table = autotune("report", first).stdout
    assert "peak mem" in table and "30 GiB" in table and "12 GiB" in table
    assert "peak_memory" in autotune("report", first, "--format", "csv").stdout.splitlines()[0]
    assert autotune("report", first, "--html", tmp_path / "r.html").returncode == 0
    page = (tmp_path / "r.html").read_text()
    assert "peak mem" in page and f'data-v="{30 * GiB}">30 GiB' in page

    assert autotuner.resume(first, retry_failed=True).exit_code == 0
    with Ledger.open(first) as ledger:
        retried = ledger.attempts("s_x1")[-1]
    assert (retried.attempt, retried.slots, retried.peak_memory) == (2, {"localhost": [1]}, 30 * GiB)

    autotuner.prepare(sweep, autotuner.load_cluster(), second, launcher=launcher, memory_from=first)
    assert autotuner.execute(second, options).exit_code == 0
    meta, attempts = recorded(second)
    assert meta.learned_memory == {n: need_of_peak(h) for n, h in HOLDS.items()}
    assert need_of_peak(30 * GiB) == 33 * GiB and need_of_peak(12 * GiB) == 13.25 * GiB  # 10%, up to 256 MiB
    with Ledger.open(second) as ledger:
        assert ledger.peaks() == HOLDS  # measured again
    # s_x1 (33 GiB) only fits on GPU 1; s_x2 (13.2 GiB), placed beside it, fits in GPU 0's 16 GiB free
    assert (attempts["s_x1"].slots, attempts["s_x2"].slots) == ({"localhost": [1]}, {"localhost": [0]})
    assert json.loads((second / "s_x1" / "exp.json").read_text())["gpu_memory"] == 33 * GiB  # placed by
    with Ledger.open(second) as ledger:
        assert all(e.gpu_memory is None for e in ledger.experiments())  # the specs as written
    assert nvml.calls.count("init") == nvml.calls.count("shutdown")

    hosts = tmp_path / "plan-hosts"
    hosts.write_text(PLAN_HOSTS)
    out = autotune("plan", spec, "-H", hosts, "--placement", "memory", "--from", first, "--format", "json")
    assert out.returncode == 0, out.stderr
    planned = json.loads(out.stdout)
    assert planned["learned_memory"] == 3
    placed = {e["name"]: sorted(e["slots"]) for e in planned["plans"][0]["experiments"]}
    assert placed["s_x1"] == ["a0"] and placed["s_x2"] == placed["s_x3"] == ["r0"]
    without = json.loads(autotune("plan", spec, "-H", hosts, "--placement", "memory", "--format", "json").stdout)
    assert {e["name"]: sorted(e["slots"]) for e in without["plans"][0]["experiments"]}["s_x1"] == ["r0"]


# Reports its own peak in its metrics file, as a script may (torch.cuda.max_memory_reserved()): 30 GiB for s_x1.
REPORTS_PEAK = SLEEP_THEN_SUCCEED.replace(
    '"latency": 1.0}', '"latency": 1.0, "peak_memory": %s}').replace(
    '"$((ck % 100000 + 1))"', '"$((ck % 100000 + 1))" "$(if [ "$name" = s_x1 ]; then echo 32212254720; '
                              'else echo 2147483648; fi)"')


def test_a_peak_the_script_reports_is_recorded_and_keeps_a_big_run_off_the_small_gpu_host(tmp_path):
    """No NVML sees these runs (CPU slots): the script's own figure is the peak. A later sweep on a hostfile of a
    24 GB host and an 80 GB one learns it (`--from`): s_x1 needs 33 GiB and runs on the 80 GB host, which is not
    the first type tried; the others, small, on the 24 GB one."""
    spec, _, _ = setup(tmp_path, count=3)
    launcher = write_launcher(tmp_path, REPORTS_PEAK, "reports.sh")
    first = tmp_path / "first"
    assert autotune("run", spec, "--slots", "2", "--launcher", launcher, "-o", first, "-q",
                    environ=run_env(tmp_path)).returncode == 0
    with Ledger.open(first) as ledger:
        assert ledger.peaks() == {"s_x1": 30 * GiB, "s_x2": 2 * GiB, "s_x3": 2 * GiB}
    hosts = tmp_path / "sizes"
    hosts.write_text("localhost slots=2 accelerator=cpu gpu=RTX-24GB\n"
                     "127.0.0.1 slots=2 accelerator=cpu gpu=A100-80GB\n")
    ran = {}
    for learn in ([], ["--from", first]):
        results = tmp_path / f"second{len(learn)}"
        out = autotune("run", spec, "-H", hosts, "--launcher", launcher, "-o", results, "-q", "--placement", "memory",
                       *learn, environ=run_env(tmp_path))
        assert out.returncode == 0, out.stderr
        ran[bool(learn)] = {n: sorted(a.slots) for n, a in recorded(results)[1].items()}
    assert ran[False] == {"s_x1": ["localhost"], "s_x2": ["localhost"], "s_x3": ["127.0.0.1"]}  # the first type
    assert ran[True] == {"s_x1": ["127.0.0.1"], "s_x2": ["localhost"], "s_x3": ["localhost"]}


def test_learning_from_a_sweep_that_measured_no_gpu_memory_is_one_line_and_nothing_is_created(tmp_path):
    spec, hosts, launcher = setup(tmp_path, count=2)
    cpu = tmp_path / "cpu"
    assert autotune("run", spec, "--slots", "2", "--launcher", launcher, "-o", cpu, "-q",
                    environ=run_env(tmp_path)).returncode == 0
    out = autotune("run", spec, "-H", hosts, "--launcher", launcher, "-o", tmp_path / "r", "--from", cpu,
                   environ=run_env(tmp_path))
    assert out.returncode == 2 and not (tmp_path / "r").exists()
    assert out.stderr.strip() == (f"autotune: error: {cpu}: --from: this sweep has no measured GPU memory to "
                                  "learn from"), out.stderr


# --- autotune plan ----------------------------------------------------------------------------------------------
PLAN_HOSTS = "r0 slots=2 gpu=RTX-24GB\na0 slots=2 gpu=A100-80GB\n"


def test_plan_keeps_experiments_on_one_type_and_the_memory_placement_on_gpus_that_hold_them(tmp_path):
    spec, hosts, _ = setup(tmp_path, hosts=PLAN_HOSTS, count=4, extra='  estimate: 10\n  gpu_memory: "30GB"\n')
    out = autotune("plan", spec, "-H", hosts, "--placement", "pack,memory", "--format", "json")
    assert out.returncode == 0, out.stderr
    plans = json.loads(out.stdout)["plans"]
    assert [p["placement"] for p in plans] == ["pack", "memory"]
    for p in plans:  # 24 GB GPUs cannot hold 30 GB: two at a time on a0, 20 s
        assert {h for e in p["experiments"] for h in e["slots"]} == {"a0"} and p["makespan_s"]["at_estimates"] == 20
    pinned = autotune("plan", spec, "-H", hosts, "--gpu-type", "RTX-24GB")
    assert pinned.returncode == 2 and "the GPUs it may use have 22.4 GiB" in pinned.stderr
    spec2, _, _ = setup(tmp_path / "two", hosts=PLAN_HOSTS, count=4, extra="  estimate: 10\n  num_gpus: 2\n")
    out = json.loads(autotune("plan", spec2, "-H", hosts, "--format", "json").stdout)
    assert [sorted(e["slots"]) for e in out["plans"][0]["experiments"]] == [["r0"], ["a0"], ["r0"], ["a0"]]


# --- autotune hosts ---------------------------------------------------------------------------------------------
def test_hosts_shows_each_hosts_type_and_a_stated_type_its_gpus_contradict():
    listed = parse_hostfile("w0 slots=1 gpu=A100-80GB\nw1 slots=1 gpu=A100-80GB\nw2 slots=1\nw3 slots=1\n")
    a100 = Gpu(0, "NVIDIA A100-SXM4-80GB", 80 * GiB, 70 * GiB, "u")
    h100 = Gpu(0, "NVIDIA H100 80GB HBM3", 80 * GiB, 70 * GiB, "u")
    reports = [HostReport("w0", True, gpus=[a100]), HostReport("w1", True, gpus=[h100]),
               HostReport("w2", True, gpus=[h100]), HostReport("w3", False, reason="refused")]
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[1:-1]]
            for line in render_hosts("t", listed, reports, "table").splitlines() if line.count("│") > 3}
    assert [rows[h][2] for h in ("w0", "w1", "w2", "w3")] == [
        "A100-80GB (found A100-SXM4-80GB)", "A100-80GB (found H100-80GB-HBM3)", "H100-80GB-HBM3", ""]
    data = json.loads(render_hosts("t", listed, reports, "json"))
    assert [(d["gpu_type"], d["gpu_type_found"]) for d in data] == [
        ("A100-80GB", "A100-SXM4-80GB"), ("A100-80GB", "H100-80GB-HBM3"), ("H100-80GB-HBM3", "H100-80GB-HBM3"),
        (None, None)]
    untyped = parse_hostfile("w2 slots=1\n")
    assert "type" not in render_hosts("t", untyped, [HostReport("w2", True)], "table").splitlines()[2]
