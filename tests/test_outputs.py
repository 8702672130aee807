"""Where a sweep writes, and what its runs hand back, when that is unusable: a results directory that cannot
be written, an --events file that cannot take a line, a metrics file that would crash or hang its reader, and a
run that ends before DeepSpeed wrote any metrics. Through the `autotune` CLI with stand-in launchers.

Tests run as root (CI does), and root ignores permission bits: a read-only place is a read-only tmpfs mount,
and a full disk a tiny tmpfs filled to the last page.
"""
from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from autotuner.states import State

from cli_rig import (
    PREAMBLE,
    SLEEP_THEN_SUCCEED,
    attempts,
    autotune,
    env,
    fill,
    launches,
    tmpfs,
    write_launcher,
    write_sweep,
)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("autotune: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@contextmanager
def full_disk(path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs with not one byte left."""
    with tmpfs(path, "size=64k") as mount:
        fill(mount / "filler")
        yield mount


class Rig:
    def __init__(self, tmp_path: Path, body: str = SLEEP_THEN_SUCCEED, values=(1, 2), extra: str = "",
                 metric: str | None = None):
        self.tmp = tmp_path
        self.spec = write_sweep(tmp_path, values, extra=extra)
        self.launcher = write_launcher(tmp_path, body)
        self.log = tmp_path / "launches.log"
        self.metric = metric

    def run(self, *args: object) -> subprocess.CompletedProcess:
        more = ["--metric", self.metric] if self.metric else []
        return autotune("run", self.spec, "--slots", 1, "--launcher", self.launcher, "-q", *more, *args,
                        environ=env(LAUNCH_LOG=self.log), cwd=self.tmp)


# --- results directories that cannot be used --------------------------------------------------------------
@pytest.mark.parametrize("results, error", [
    ("/proc/autotune-test/results", "cannot create the results directory"),
    ("/proc", "cannot write the results directory"),  # exists, takes no files
    ("/sys/kernel/autotune-test", "cannot create the results directory"),
    ("/sys/kernel", "cannot write the results directory"),
    ("afile/results", "cannot be a results directory"),
    ("made/" + "a" * 300, "cannot create the results directory: File name too long"),
    ("made/" + "/".join(["b" * 200] * 25), "cannot create the results directory: File name too long"),
], ids=["proc-new", "proc", "sys-new", "sys", "under-a-file", "name-too-long", "path-too-long"])
def test_a_results_directory_that_cannot_be_made_is_one_line_and_nothing_is_left(tmp_path, results, error):
    rig = Rig(tmp_path)
    (tmp_path / "afile").write_text("x")
    before = tree(tmp_path)
    assert_one_line_error(rig.run("--results", results), error)
    assert tree(tmp_path) == before  # not even the parent `made/` that mkdir -p made before failing
    assert launches(rig.log) == []


@pytest.mark.parametrize("where", ["mount", "mount/new/results"])
def test_a_read_only_results_directory_is_refused(tmp_path, where):
    rig = Rig(tmp_path)
    with tmpfs(tmp_path / "mount", "ro") as mount:
        assert_one_line_error(rig.run("--results", tmp_path / where), str(tmp_path / where), "Read-only file system")
        assert tree(mount) == set()
    assert launches(rig.log) == []


@pytest.mark.parametrize("where", ["disk", "disk/new/deeper/results"])
def test_a_results_directory_on_a_full_disk_is_refused_and_removed(tmp_path, where):
    rig = Rig(tmp_path)
    with full_disk(tmp_path / "disk") as disk:
        line = assert_one_line_error(rig.run("--results", tmp_path / where), str(tmp_path / where),
                                     "cannot write the results directory")
        assert "No space left on device" in line or "disk" in line
        assert tree(disk) == {"filler"}  # what the run made is gone again, the disk's own file stays
    assert launches(rig.log) == []


def test_a_full_disk_that_takes_the_hostfile_but_not_the_ledger(tmp_path):
    """The hostfile fits in the last free page, the ledger does not: both are gone again."""
    rig = Rig(tmp_path)
    with tmpfs(tmp_path / "disk", "size=64k") as disk:
        (disk / "filler").write_bytes(b"\0" * (60 * 1024))  # one 4 KiB page left
        assert_one_line_error(rig.run("--results", disk / "results"), "cannot write the results directory")
        assert tree(disk) == {"filler"}


def test_files_that_were_there_before_are_kept(tmp_path):
    """A results directory that exists is the user's: on a refusal only what the run made goes."""
    rig = Rig(tmp_path)
    with tmpfs(tmp_path / "disk", "size=64k") as disk:
        (disk / "results").mkdir()
        (disk / "results" / "notes.txt").write_text("mine\n")
        fill(disk / "filler")
        assert_one_line_error(rig.run("--results", disk / "results"), "cannot write the results directory")
        assert tree(disk / "results") == {"notes.txt"}


# --- --events files that cannot be written: refused before the results directory exists ------------------
@pytest.mark.parametrize("events, error", [
    ("/dev/full", "No space left on device"),
    ("adir", "is a directory"),
    ("/proc/autotune-events.jsonl", "cannot write the --events file"),
    ("afile/events.jsonl", "cannot write the --events file"),
    ("nodir/events.jsonl", "no such directory"),
], ids=["dev-full", "a-directory", "proc", "under-a-file", "no-directory"])
def test_an_events_file_that_cannot_be_written_is_refused_before_anything_is_made(tmp_path, events, error):
    rig = Rig(tmp_path)
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    before = tree(tmp_path)
    assert_one_line_error(rig.run("--results", tmp_path / "results", "--events", events), events, error)
    assert tree(tmp_path) == before
    assert launches(rig.log) == []


def test_an_events_file_on_a_read_only_mount_is_refused(tmp_path):
    rig = Rig(tmp_path)
    with tmpfs(tmp_path / "mount", "ro"):
        assert_one_line_error(rig.run("--results", tmp_path / "results", "--events", tmp_path / "mount/ev.jsonl"),
                              "Read-only file system")
    assert not (tmp_path / "results").exists() and launches(rig.log) == []


def test_an_events_file_on_a_full_disk_is_refused(tmp_path):
    rig = Rig(tmp_path)
    with full_disk(tmp_path / "disk") as disk:
        assert_one_line_error(rig.run("--results", tmp_path / "results", "--events", disk / "ev.jsonl"),
                              "No space left on device")
        assert tree(disk) == {"filler"}  # the probe's file is not left behind
    assert not (tmp_path / "results").exists() and launches(rig.log) == []


def test_the_write_probe_leaves_an_existing_events_file_as_it_was(tmp_path):
    rig = Rig(tmp_path)
    events = tmp_path / "events.jsonl"
    events.write_text("earlier line\n")
    result = rig.run("--results", tmp_path / "results", "--events", events)
    assert result.returncode == 0, result.stderr
    lines = events.read_text().splitlines()
    assert lines[0] == "earlier line" and all(line.startswith("{") for line in lines[1:]) and len(lines) == 5


def test_events_to_a_pipe_through_dev_stdout(tmp_path):
    rig = Rig(tmp_path)
    result = autotune("run", rig.spec, "--slots", 1, "--launcher", rig.launcher, "-q", "--results",
                      tmp_path / "results", "--events", "/dev/stdout", environ=env(LAUNCH_LOG=rig.log), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sum(line.startswith('{"event"') for line in result.stdout.splitlines()) == 4


# --- metrics files that would crash or hang the reader: a `metrics` failure, never retried ------------------
BAD_METRICS = PREAMBLE + """\
case "$(cat "$BAD/$name.kind")" in
  dir) mkdir "$AUTOTUNE_METRICS_PATH";;
  fifo) mkfifo "$AUTOTUNE_METRICS_PATH";;
  zero) ln -s /dev/zero "$AUTOTUNE_METRICS_PATH";;
  *) cp "$BAD/$name" "$AUTOTUNE_METRICS_PATH";;
esac
"""
BAD_FILES = {  # kind: (content, what the ledger's detail says)
    "deep": ("[" * 100_000 + "]" * 100_000, "nests 100000 levels deep"),
    "deep-value": ('{"throughput": 1, "x": ' + "{\"a\": " * 50_000 + "1" + "}" * 50_000 + "}", "levels deep"),
    "big": ('{"throughput": 1, "pad": "' + "x" * (2 * 1024 * 1024) + '"}', "larger than 1 MiB"),
    "nan": ('{"throughput": NaN}', "is NaN, not a finite number"),
    "inf": ('{"throughput": Infinity}', "is Infinity, not a finite number"),
    "huge": ('{"throughput": 1e400}', "is Infinity, not a finite number"),
    "digits": ('{"throughput": 1' + "0" * 10_000 + "}", "not JSON"),
    "list": ("[1, 2, 3]", "holds a JSON list, not an object"),
    "text": ('{"throughput": "fast"}', 'is "fast", not a finite number'),
    "garbage": (b"\x7fELF\x02\x01\x01\x00\xff\xfe" * 50, "not JSON"),
    "dir": (None, "a directory, not a regular file"),
    "fifo": (None, "a FIFO, not a regular file"),
    "zero": (None, "a device, not a regular file"),
}


def test_each_bad_metrics_file_is_a_metrics_failure_naming_the_file_launched_once(tmp_path):
    kinds = list(BAD_FILES)
    bad = tmp_path / "bad"
    bad.mkdir()
    for i, kind in enumerate(kinds):
        (bad / f"s_x{i}.kind").write_text(kind)
        content = BAD_FILES[kind][0]
        if content is not None:
            (bad / f"s_x{i}").write_bytes(content if isinstance(content, bytes) else content.encode())
    rig = Rig(tmp_path, BAD_METRICS, values=range(len(kinds)))
    result = autotune("run", rig.spec, "--slots", 2, "--launcher", rig.launcher, "-q", "--retries", 3,
                      "--results", tmp_path / "results", environ=env(LAUNCH_LOG=rig.log, BAD=bad), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    recorded = {a.name: a for a in attempts(tmp_path / "results")}
    assert len(attempts(tmp_path / "results")) == len(kinds)  # one attempt each: nothing was retried
    assert sorted(launches(rig.log)) == sorted((f"s_x{i}", 1) for i in range(len(kinds)))
    for i, kind in enumerate(kinds):
        attempt = recorded[f"s_x{i}"]
        where = str(tmp_path / "results" / f"s_x{i}" / "metrics.json")
        assert (attempt.state, attempt.reason) == (State.FAILED, "metrics"), (kind, attempt)
        assert attempt.detail.startswith(f"{where}: ") and BAD_FILES[kind][1] in attempt.detail, (kind, attempt)
        assert len(attempt.detail) < len(where) + 300, kind


# --- a run that ends before DeepSpeed's profile window: say so ----------------------------------------------
EXIT_WITHOUT_METRICS = PREAMBLE + "exit 0\n"


OWN_WINDOW = "  ds_config: {train_micro_batch_size_per_gpu: 1, autotuning: {end_profile_step: 9}}"


@pytest.mark.parametrize("extra, steps", [("", 5), (OWN_WINDOW, 9)],
                         ids=["default-window", "own-window"])
def test_exit_zero_before_the_profile_window_ends_says_so(tmp_path, extra, steps):
    rig = Rig(tmp_path, EXIT_WITHOUT_METRICS, values=[1], extra=extra)
    if extra:  # the sweep's own ds_config line is replaced by the one with an autotuning section
        rig.spec.write_text(rig.spec.read_text().replace("  ds_config: {train_micro_batch_size_per_gpu: 1}\n", ""))
    result = rig.run("--results", tmp_path / "results")
    assert result.returncode == 1, result.stderr
    [attempt] = attempts(tmp_path / "results")
    assert (attempt.state, attempt.reason) == (State.FAILED, "metrics")
    assert "metrics file missing" in attempt.detail
    assert "before DeepSpeed's profile window did" in attempt.detail
    assert f"end_profile_step ({steps})" in attempt.detail
    assert f"run more than {steps} optimizer steps" in attempt.detail
    assert "lower autotuning.end_profile_step" in attempt.detail


def test_exit_zero_without_a_custom_metric_names_the_variable(tmp_path):
    rig = Rig(tmp_path, EXIT_WITHOUT_METRICS, values=[1], metric="tokens:max")
    result = rig.run("--results", tmp_path / "results")
    assert result.returncode == 1, result.stderr
    [attempt] = attempts(tmp_path / "results")
    assert attempt.reason == "metrics" and "without writing its metric 'tokens' to $AUTOTUNE_METRICS_PATH" in \
        attempt.detail and "profile" not in attempt.detail


def test_a_good_run_still_succeeds(tmp_path):
    rig = Rig(tmp_path)
    result = rig.run("--results", tmp_path / "results")
    assert result.returncode == 0, result.stderr
    assert {a.state for a in attempts(tmp_path / "results")} == {State.SUCCEEDED}


# --- multi-node experiments on this machine's own names: probed over ssh before anything is launched ------
def multi_node_sweep(tmp_path: Path, nodes: list[int], steps: tuple[int, ...] = (1,)) -> Path:
    """Experiments m_n<nodes>_gas<steps>: every combination of the node counts and accumulation steps."""
    (tmp_path / "train.py").touch()
    path = tmp_path / "sweep.hjson"
    path.write_text(f"""{{
  name: m
  script: train.py
  ds_config: {{train_micro_batch_size_per_gpu: 1}}
  space: {{"num_nodes": {nodes}, "gradient_accumulation_steps": {list(steps)}}}
}}
""")
    return path


def test_a_multi_node_sweep_on_local_names_without_sshd_is_refused_before_launching(tmp_path, silent_ssh):
    hosts = tmp_path / "hostfile"
    hosts.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    log = tmp_path / "launches.log"
    result = autotune("run", multi_node_sweep(tmp_path, [2], (1, 2)), "-H", hosts, "--ssh-config", silent_ssh,
                      "--launcher", write_launcher(tmp_path, SLEEP_THEN_SUCCEED), "-q", "--results",
                      tmp_path / "results", environ=env(LAUNCH_LOG=log), cwd=tmp_path)
    line = assert_one_line_error(result, "no experiment can run", "host localhost", "over ssh")
    assert "autotune hosts" in line
    assert "results" not in line  # the sweep's own hostfile it refused at was withdrawn with its directory
    assert launches(log) == []
    assert not (tmp_path / "results").exists()  # refused: nothing written (tests/test_refusals_write_nothing.py)


def test_single_node_experiments_still_run_there_and_multi_node_ones_wait(tmp_path, silent_ssh):
    hosts = tmp_path / "hostfile"
    hosts.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    log = tmp_path / "launches.log"
    result = autotune("run", multi_node_sweep(tmp_path, [1, 2]), "-H", hosts, "--ssh-config", silent_ssh,
                      "--launcher", write_launcher(tmp_path, SLEEP_THEN_SUCCEED), "--results", tmp_path / "results",
                      environ=env(LAUNCH_LOG=log), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "1 multi-node experiment(s) left queued" in result.stderr and "host localhost" in result.stderr
    assert launches(log) == [("m_n1_gas1", 1)]  # the two-node one was never launched (to fail and be retried)
    assert {a.name: a.state for a in attempts(tmp_path / "results")} == {"m_n1_gas1": State.SUCCEEDED,
                                                                        "m_n2_gas1": State.QUEUED}


# --- summary.txt in DeepSpeed's shape ---------------------------------------------------------------------------
HEADERS = ["tuning_space", "num_experiments", "best_metric_val", "best_exp_name"]


@pytest.mark.parametrize(("rows", "recorded"), [
    ([("z0", 4, 1174.1234, "z0_gas1_tmbspg2"), ("z1", 12, 95.5, "zero_mbs_z1_mbs32_long_name"),
      ("global", 16, 1174.1234, "z0_gas1_tmbspg2")],
     "| tuning_space   |   num_experiments |   best_metric_val | best_exp_name               |\n"
     "|:---------------|------------------:|------------------:|:----------------------------|\n"
     "| z0             |                 4 |           1174.12 | z0_gas1_tmbspg2             |\n"
     "| z1             |                12 |             95.5  | zero_mbs_z1_mbs32_long_name |\n"
     "| global         |                16 |           1174.12 | z0_gas1_tmbspg2             |"),
    ([("z2", 3, 1234567.0, "a"), ("global", 3, 1234567.0, "a")],
     "| tuning_space   |   num_experiments |   best_metric_val | best_exp_name   |\n"
     "|:---------------|------------------:|------------------:|:----------------|\n"
     "| z2             |                 3 |       1.23457e+06 | a               |\n"
     "| global         |                 3 |       1.23457e+06 | a               |"),
    ([("z2", 3, 0.00012, "a"), ("global", 3, 12.0, "a")],
     "| tuning_space   |   num_experiments |   best_metric_val | best_exp_name   |\n"
     "|:---------------|------------------:|------------------:|:----------------|\n"
     "| z2             |                 3 |           0.00012 | a               |\n"
     "| global         |                 3 |          12       | a               |"),
])
def test_the_summary_table_is_laid_out_as_tabulate_lays_out_deepspeeds(rows, recorded):
    """`recorded`: what tabulate 0.10.0 printed for these rows with tablefmt="pipe" (as DeepSpeed calls it)."""
    from autotuner.views.summary import pipe_table

    assert pipe_table(HEADERS, rows) == recorded
