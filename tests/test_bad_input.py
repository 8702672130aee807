"""Bad input as a new user gives it, through the real `autotune` CLI: exit 2, one line on stderr naming the file
(and the line where there is one) and the problem, no traceback, nothing created in the results directory.

One section per class of issue 8: inputs that would eat the machine, names that would collide or break later,
errors that would not say where or what, and DeepSpeed's own experiment files (their hostfile, a timeout).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autotuner import limits
from autotuner.errors import UserError, read_user_file
from autotuner.spec import is_safe_name
from autotuner.spec.load import load_sweep

from cli_rig import PREAMBLE, WRITE_METRICS, autotune, env, latest, write_launcher

GOOD_BASE = "{train_micro_batch_size_per_gpu: 1}"


def sweep(tmp_path: Path, body: str, name: str = "sweep.hjson") -> Path:
    """A sweep file (with its script) whose body is `body`; the script is train.py beside it."""
    (tmp_path / "train.py").touch()
    path = tmp_path / name
    path.write_text(body)
    return path


def run(tmp_path: Path, *args: object, slots: object = 1) -> subprocess.CompletedProcess:
    more = ("--slots", slots) if slots is not None else ()
    return autotune("run", *args, *more, "-o", tmp_path / "results", timeout=60)


def refused(result: subprocess.CompletedProcess, where: object, *fragments: str, tmp_path: Path | None = None) -> str:
    """Exit 2, exactly one short stderr line `autotune: error: WHERE...`, no traceback, no results directory."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith(f"autotune: error: {where}"), line
    assert len(line) < 500, line
    for fragment in fragments:
        assert fragment in line, line
    if tmp_path is not None:
        assert not (tmp_path / "results").exists()
    return line


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), start=1) if text in line)


# --- inputs that would eat the machine -----------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["spec", "--hostfile"])
def test_a_device_or_a_pipe_is_refused_not_read(tmp_path, option):
    good = sweep(tmp_path, f"script: train.py\nds_config: {GOOD_BASE}\n")
    fifo = tmp_path / "pipe.hjson"
    os.mkfifo(fifo)  # nobody writes: reading it would wait forever
    for special, kind in (("/dev/zero", "a device"), (fifo, "a pipe")):
        args = (special,) if option == "spec" else (good, "--hostfile", special)
        result = run(tmp_path, *args, slots=None if option == "--hostfile" else 1)
        refused(result, special, f"is {kind}, not a regular file", tmp_path=tmp_path)


@pytest.mark.parametrize("what", ["experiment file", "hostfile"])
def test_a_file_past_the_size_limit_is_refused_naming_the_limit(tmp_path, what):
    huge = tmp_path / "huge.hjson"
    with open(huge, "wb") as f:
        f.truncate(4 << 30)  # 4 GiB, sparse: costs nothing on disk, all of memory if read whole
    if what == "hostfile":
        result = run(tmp_path, sweep(tmp_path, f"script: train.py\nds_config: {GOOD_BASE}\n"), "--hostfile", huge,
                     slots=None)
    else:
        result = run(tmp_path, huge)
    article = "an" if what == "experiment file" else "a"
    refused(result, huge, f"{what} is larger than 1 MiB, the limit for {article} {what}", tmp_path=tmp_path)


def test_a_ds_config_file_past_the_size_limit_is_refused(tmp_path):
    big = tmp_path / "ds.json"
    big.write_text(json.dumps({"x": "y" * (limits.FILE_BYTES + 10)}))
    path = sweep(tmp_path, "script: train.py\nds_config: ds.json\n")
    refused(run(tmp_path, path), big, "larger than 1 MiB", tmp_path=tmp_path)


def test_read_user_file_reads_at_most_the_limit(tmp_path):
    path = tmp_path / "f"
    path.write_text("x" * 101)
    assert read_user_file(path, "thing", limit=101) == "x" * 101
    with pytest.raises(UserError, match="thing is larger than 100 bytes, the limit for a thing"):
        read_user_file(path, "thing", limit=100)
    with pytest.raises(UserError, match="is a directory"):
        read_user_file(tmp_path, "thing")


def test_slots_are_bounded_before_any_is_built(tmp_path):
    path = sweep(tmp_path, f"script: train.py\nds_config: {GOOD_BASE}\n")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("a slots=2\nb slots=1000000000\n")
    refused(run(tmp_path, path, "--hostfile", hostfile, slots=None), f"{hostfile}:2",
            "more than 1024, the most slots one host may have", tmp_path=tmp_path)
    hostfile.write_text("a slots=1\nb slots=" + "9" * 5000 + "\n")  # past int()'s digit limit
    refused(run(tmp_path, path, "--hostfile", hostfile, slots=None), f"{hostfile}:2", "1024", tmp_path=tmp_path)
    hostfile.write_text("".join(f"node{i} slots=1024\n" for i in range(70)))
    refused(run(tmp_path, path, "--hostfile", hostfile, slots=None), f"{hostfile}:65", f"{limits.SLOTS}",
            tmp_path=tmp_path)
    result = run(tmp_path, path, slots=1000000000)
    assert result.returncode == 2 and "--slots 1000000000 is more than 1024" in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1 and not (tmp_path / "results").exists()


def test_a_grid_too_large_is_refused_before_it_is_expanded(tmp_path):
    keys = ", ".join(f"k{i}: [{', '.join(map(str, range(10)))}]" for i in range(7))  # 10^7 points
    path = sweep(tmp_path, f"script: train.py\nds_config: {GOOD_BASE}\nspace: {{\n  {keys}\n}}\n")
    refused(run(tmp_path, path), f"{path}:3", "makes 10,000,000 experiments", "100,000, the limit for one sweep",
            tmp_path=tmp_path)
    keys = ", ".join(f"k{i}: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]" for i in range(99))  # 10^99 points
    path.write_text(f"script: train.py\nspace: {{\n  {keys}\n}}\n")
    refused(run(tmp_path, path), f"{path}:2", "about 10^99 experiments", tmp_path=tmp_path)


def test_too_many_space_keys_and_too_deep_nesting(tmp_path):
    keys = ", ".join(f"k{i}: [1]" for i in range(limits.SPACE_KEYS + 1))
    path = sweep(tmp_path, f"script: train.py\nspace: {{\n  {keys}\n}}\n")
    refused(run(tmp_path, path), f"{path}:2", "space has 101 keys, more than 100, the limit", tmp_path=tmp_path)
    path.write_text('{"script": "train.py", "ds_config": ' + '{"a": ' * 70 + "1" + "}" * 70 + "}")
    refused(run(tmp_path, path), path, "deeper than 64 levels", tmp_path=tmp_path)
    path.write_text("[" * 100000)
    refused(run(tmp_path, path), path, "nested too deeply", tmp_path=tmp_path)


def test_a_large_ds_config_times_a_grid_is_refused(tmp_path):
    (tmp_path / "ds.json").write_text(json.dumps({"pad": "x" * 900_000}))
    values = ", ".join(map(str, range(200)))  # 200 copies of 900 KB: 180 MB
    path = sweep(tmp_path, f"script: train.py\nds_config: ds.json\nspace: {{\n  a: [{values}]\n}}\n")
    refused(run(tmp_path, path), f"{path}:3", "the space makes 200 experiments", "128 MiB", tmp_path=tmp_path)


def test_several_inputs_add_up_to_the_limits(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "EXPERIMENTS", 10)
    (tmp_path / "train.py").touch()
    a = sweep(tmp_path, "script: train.py\nspace: {a: [1, 2, 3, 4, 5, 6]}\n", "a.hjson")
    b = sweep(tmp_path, "script: train.py\nspace: {b: [1, 2, 3, 4, 5]}\n", "b.hjson")
    assert len(load_sweep([a]).experiments) == 6
    with pytest.raises(UserError) as info:
        load_sweep([a, b])
    assert info.value.path == b and "with the rest of the sweep that is more than 10" in info.value.message
    exps = tmp_path / "exps"
    exps.mkdir()
    for i in range(11):
        (exps / f"e{i}.json").write_text(json.dumps({"name": f"e{i}", "ds_config": {}}))
    with pytest.raises(UserError) as info:
        load_sweep([exps], script=str(tmp_path / "train.py"))
    assert info.value.path == exps and "more experiment files than fit in one sweep (10" in info.value.message
    monkeypatch.setattr(limits, "EXPERIMENTS", 100)
    monkeypatch.setattr(limits, "SWEEP_BYTES", 300)
    with pytest.raises(UserError, match="files add up to more than 300 bytes"):
        load_sweep([exps], script=str(tmp_path / "train.py"))


# --- names that would collide or break later -----------------------------------------------------------------------


def test_space_values_and_keys_with_shell_characters_make_safe_distinct_names(tmp_path):
    path = sweep(tmp_path,
                 'script: train.py\nspace: {\n  "a;b c": ["$(touch x)", "a b", "a/b", "é", "../..", "ü"]\n}\n')
    names = [e.name for e in load_sweep([path]).experiments]
    assert len(set(names)) == 6 and all(is_safe_name(n) for n in names), names
    assert all(n.startswith("sweep_a-b-c") for n in names)


@pytest.mark.parametrize("name", ["a/b", "../x", "x y", "é", ".hidden", "$(reboot)", "x" * 121, 5])
def test_an_unsafe_explicit_name_is_located(tmp_path, name):
    path = tmp_path / "exp.json"
    path.write_text('{\n  "ds_config": {},\n  "name": ' + json.dumps(name) + "\n}\n")
    (tmp_path / "train.py").touch()
    refused(run(tmp_path, path, "--script", tmp_path / "train.py"), f"{path}:3:", "not safe as a directory name",
            tmp_path=tmp_path)


@pytest.mark.parametrize("name", ["summary.txt", "ledger.sqlite", "ledger.sqlite-wal", "ledger.sqlite-shm",
                                  "hostfile", "runner.lock", "ds_config_optimal.json", "cmd_optimal.txt",
                                  "report.html", "plot_metric.png", "plot_timeline.png", "attempt-3"])
def test_a_name_of_the_sweeps_own_files_is_refused(tmp_path, name):
    path = tmp_path / "exp.json"
    path.write_text('{\n  "ds_config": {},\n  "name": "' + name + '"\n}\n')
    (tmp_path / "train.py").touch()
    refused(run(tmp_path, path, "--script", tmp_path / "train.py"), f"{path}:3:",
            f"'{name}' is the name of one of the sweep's own files", tmp_path=tmp_path)


def test_reserved_names_from_a_sweep_name_or_a_file_name(tmp_path):
    path = sweep(tmp_path, "script: train.py\nname: summary.txt\n")
    refused(run(tmp_path, path), f"{path}:2:", "'summary.txt'", tmp_path=tmp_path)
    stem = tmp_path / "ledger.sqlite.json"
    stem.write_text('{"ds_config": {}}')
    refused(run(tmp_path, stem, "--script", tmp_path / "train.py"), f"{stem}: ", "(from the file name)",
            tmp_path=tmp_path)


def test_every_file_a_sweep_keeps_beside_its_experiments_is_reserved(tmp_path):
    from autotuner.ledger import lock
    from autotuner.ledger import store as ledger
    from autotuner.spec import RESERVED_NAMES
    from autotuner.sweep.create import HOSTFILE
    from autotuner.views import html, plots
    from autotuner.views import summary as results

    for name in (ledger.FILENAME, lock.LOCKFILE, HOSTFILE, results.SUMMARY, results.OPTIMAL_CONFIG,
                 results.OPTIMAL_COMMAND, html.REPORT_HTML, plots.METRIC_PNG, plots.TIMELINE_PNG):
        assert RESERVED_NAMES.fullmatch(name), name
    path = sweep(tmp_path, "name: s\nscript: train.py\nspace: {x: [1, 2]}\n")
    launcher = write_launcher(tmp_path, PREAMBLE + WRITE_METRICS)
    result = autotune("run", path, "--slots", 1, "--launcher", launcher, "-o", tmp_path / "results", "-q",
                      environ=env(LAUNCH_LOG=tmp_path / "log"))
    assert result.returncode == 0, result.stderr
    for entry in (tmp_path / "results").iterdir():
        assert entry.name in ("s_x1", "s_x2") or RESERVED_NAMES.fullmatch(entry.name) \
            or entry.name.startswith("."), entry.name


def test_two_experiments_of_one_name_are_located_naming_both(tmp_path):
    (tmp_path / "train.py").touch()
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text('{\n"name": "same", "ds_config": {}}')
    second.write_text('{\n\n"name": "same", "ds_config": {}}')
    refused(run(tmp_path, first, second, "--script", tmp_path / "train.py"), f"{second}:3",
            f"'same' is already used by {first}:2", tmp_path=tmp_path)


def test_a_long_name_is_not_echoed_whole(tmp_path):
    path = tmp_path / "exp.json"
    path.write_text(json.dumps({"name": "n" * 10_000, "ds_config": {}}))
    (tmp_path / "train.py").touch()
    line = refused(run(tmp_path, path, "--script", tmp_path / "train.py"), f"{path}:1", "...", tmp_path=tmp_path)
    assert "n" * 100 not in line


# --- errors that say where and what --------------------------------------------------------------------------------


def test_fit_errors_name_the_line_that_asks_for_too_much(tmp_path):
    path = sweep(tmp_path, f"script: train.py\nds_config: {GOOD_BASE}\nnum_gpus: 4\n")
    refused(run(tmp_path, path, slots=2), f"{path}:3:", "needs 1 node(s) with 4 slot(s)", tmp_path=tmp_path)
    path.write_text(f"script: train.py\nnum_nodes: 2\nds_config: {GOOD_BASE}\n")
    refused(run(tmp_path, path, slots=2), f"{path}:2:", "needs 2 node(s)",
            "a hostfile of more nodes (--hostfile) gives the sweep more", tmp_path=tmp_path)
    path.write_text(f"script: train.py\nds_config: {GOOD_BASE}\nspace: {{\n  x: [1]\n  num_gpus: [1, 8]\n}}\n")
    refused(run(tmp_path, path, slots=2), f"{path}:5:", "needs 1 node(s) with 8 slot(s)", tmp_path=tmp_path)
    exp = tmp_path / "exp.json"
    exp.write_text('{\n  "name": "e",\n  "ds_config": {},\n  "num_gpus": 3\n}\n')
    refused(run(tmp_path, exp, "--script", tmp_path / "train.py", slots=2), f"{exp}:4:", "with 3 slot(s)",
            tmp_path=tmp_path)


@pytest.mark.parametrize("value", ["1e30", "1e400", "-1", "1.5", "true", '"4"', "1" + "0" * 30, "2000"])
def test_a_bad_count_is_one_short_located_line(tmp_path, value):
    path = sweep(tmp_path, f"script: train.py\nds_config: {GOOD_BASE}\nnum_gpus: {value}\n")
    line = refused(run(tmp_path, path), f"{path}:3", tmp_path=tmp_path)
    assert not re.search(r"\d{16}", line), line


@pytest.mark.parametrize("body", ["", "  \n\t\n", "# only a comment\n// and another\n/* and a block */\n"])
def test_an_empty_spec_says_empty_file(tmp_path, body):
    path = sweep(tmp_path, body)
    refused(run(tmp_path, path), f"{path}: empty file", tmp_path=tmp_path)


@pytest.mark.parametrize("args, fragment", [
    (("--slots", "0"), "'--slots'"), (("--slots", "x"), "'--slots'"), (("--retries", "-1"), "'--retries'"),
    (("--timeout", "abc"), "'--timeout'"), (("--timeout", "-5"), "'--timeout'"), (("--timeout", "0"), "'--timeout'"),
    (("--timeout", "inf"), "'--timeout'"), (("--bogus",), "--bogus"), (("--timeout",), "--timeout"),
    (("--slots", "x" * 10_000), "'--slots'")])
def test_bad_options_are_one_line(tmp_path, args, fragment):
    path = sweep(tmp_path, f"script: train.py\nds_config: {GOOD_BASE}\n")
    result = autotune("run", path, "-o", tmp_path / "results", *args, timeout=60)
    refused(result, "", fragment, tmp_path=tmp_path)


@pytest.mark.parametrize("args", [("run",), ("nosuch",), ("resume",), ("resume", "d", "--timeout", "abc"),
                                  ("status", "d", "--bogus")])
def test_usage_errors_are_one_line(args):
    refused(autotune(*args, timeout=60), "", "--help")


def test_help_still_works():
    assert autotune("--help").returncode == 0
    result = autotune("run", "--help")
    assert result.returncode == 0 and "SECONDS|none" in result.stdout and "3600" in result.stdout
    bare = autotune()
    assert bare.returncode == 2 and "resume" in bare.stdout + bare.stderr and "Traceback" not in bare.stderr


def test_nul_characters_that_no_process_accepts_are_located(tmp_path):
    path = sweep(tmp_path, 'script: train.py\nargs: ["a\\u0000b"]\n')
    refused(run(tmp_path, path), f"{path}:2", "NUL", tmp_path=tmp_path)
    path.write_text('script: train.py\nenv: {\n  A: "x\\u0000"\n}\n')
    refused(run(tmp_path, path), f"{path}:3", "NUL", tmp_path=tmp_path)


# --- DeepSpeed's own experiment files: their hostfile, and a timeout ----------------------------------------------


def ds_exp(directory: Path, name: str, num_nodes: int = 1, hostfile: str | None = None) -> Path:
    data = {"name": name, "ds_config": {}, "num_gpus": 1, "num_nodes": num_nodes}
    if hostfile is not None:
        data["hostfile"] = hostfile
    path = directory / f"{name}.json"
    path.write_text(json.dumps(data, indent=1))
    return path


def test_the_hostfile_key_of_deepspeed_files_is_used(tmp_path):
    (tmp_path / "train.py").touch()
    (tmp_path / "hosts").write_text("worker-0 slots=1\nworker-1 slots=1\n")
    exp = ds_exp(tmp_path, "e", num_nodes=3, hostfile="hosts")
    # the hostfile's two nodes, not this machine's one: it was read
    result = autotune("run", exp, "--script", "train.py", "-o", tmp_path / "results", cwd=tmp_path)
    refused(result, f"{exp}:", "needs 3 node(s)", "the cluster has 2 node(s)", tmp_path=tmp_path)


def test_a_missing_hostfile_key_is_noted_and_the_error_suggests_hostfile(tmp_path):
    (tmp_path / "train.py").touch()
    exp = ds_exp(tmp_path, "e", num_nodes=2, hostfile="/job/hostfile")
    result = autotune("run", exp, "--script", "train.py", "--slots", 1, "-o", tmp_path / "results", cwd=tmp_path)
    refused(result, f"{exp}:", "needs 2 node(s)", "--hostfile", tmp_path=tmp_path)


def test_spec_hostfile_choices(tmp_path):
    from autotuner.backends.cluster import spec_hostfile

    (tmp_path / "train.py").touch()
    (tmp_path / "h1").write_text("a slots=1\n")
    (tmp_path / "h2").write_text("b slots=1\n")
    script = str(tmp_path / "train.py")
    one = load_sweep([ds_exp(tmp_path, "a", hostfile=str(tmp_path / "h1"))], script=script)
    path, note = spec_hostfile(one, None, None)
    assert path == tmp_path / "h1" and "using the hostfile" in note
    assert spec_hostfile(one, tmp_path / "mine", None) == (tmp_path / "mine", None)
    path, note = spec_hostfile(one, None, 2)
    assert path is None and "--slots runs on this machine" in note
    two = load_sweep([ds_exp(tmp_path, "a", hostfile=str(tmp_path / "h1")),
                      ds_exp(tmp_path, "b", hostfile=str(tmp_path / "h2"))], script=script)
    path, note = spec_hostfile(two, None, None)
    assert path is None and "different hostfiles" in note
    gone = load_sweep([ds_exp(tmp_path, "c", hostfile="/job/hostfile")], script=script)
    path, note = spec_hostfile(gone, None, None)
    assert path is None and "/job/hostfile" in note and "no such file" in note


# The CLI with a default timeout of 1 s instead of an hour, to see the default applied within a test.
SHORT_DEFAULT = "import sys; from autotuner import limits, cli; limits.DEFAULT_TIMEOUT = 1.0; cli.main(sys.argv[1:])"


def test_deepspeed_files_get_the_default_timeout_and_none_lifts_it(tmp_path):
    (tmp_path / "train.py").touch()
    exp = ds_exp(tmp_path, "e")
    launcher = write_launcher(tmp_path, PREAMBLE + 'sleep "$STANDIN_SECONDS"\n' + WRITE_METRICS)

    def autotune_short_default(*args, seconds):
        return subprocess.run([sys.executable, "-c", SHORT_DEFAULT, *map(str, args)], capture_output=True,
                              text=True, timeout=60, cwd=tmp_path,
                              env=env(LAUNCH_LOG=tmp_path / "log", STANDIN_SECONDS=seconds))

    out = tmp_path / "default"
    result = autotune_short_default("run", exp, "--script", "train.py", "--slots", 1, "--launcher", launcher,
                                    "--grace", 1, "-o", out, "-q", seconds=30)
    assert result.returncode == 1 and latest(out)["e"].state == "timed_out", result.stderr
    assert "ran past its timeout of 1 s" in latest(out)["e"].detail
    # `resume --timeout` applies to what the spec leaves open, the run's default included
    result = autotune_short_default("resume", out, "--retry-failed", "--timeout", "none", "-q", seconds=2)
    assert result.returncode == 0 and latest(out)["e"].state == "succeeded", result.stderr

    out = tmp_path / "none"
    result = autotune_short_default("run", exp, "--script", "train.py", "--slots", 1, "--launcher", launcher,
                                    "--timeout", "none", "-o", out, "-q", seconds=2)
    assert result.returncode == 0 and latest(out)["e"].state == "succeeded", result.stderr


def test_timeout_values():
    from autotuner import timeout_seconds

    assert timeout_seconds(None) == limits.DEFAULT_TIMEOUT == 3600
    assert timeout_seconds("none") is None and timeout_seconds(5.0) == 5.0


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_results_path_is_refused_not_taken_for_the_current_directory(tmp_path, value):
    path = sweep(tmp_path, "{\n  script: train.py\n  ds_config: {}\n}\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    result = autotune("run", path, "--slots", 1, "--results", value, timeout=60, cwd=tmp_path)
    refused(result, "--results", "empty path")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no ledger, hostfile or runner.lock here


# --- found by an outside review: each a class of its own -----------------------------------------------------------
OK_STANDIN = '#!/bin/sh\nprintf \'{"throughput": 1}\' > "$AUTOTUNE_METRICS_PATH"\n'


@pytest.mark.parametrize("option", [("--timeout", "3000000"), ("--timeout", "1e12"), ("--deadline", "1e300"),
                                    ("--deadline", "0"), ("--grace", "1e9")])
def test_seconds_past_what_the_os_can_wait_are_refused(tmp_path, option):
    """A timeout of 25 days or more overflowed the wait: every experiment launched, then failed, then was
    retried. Bounded up front (limits.SECONDS), and a deadline of 0 is not "no deadline"."""
    path = sweep(tmp_path, "{\n  script: train.py\n  ds_config: {}\n}\n")
    refused(run(tmp_path, path, *option), "", option[0], tmp_path=tmp_path)


def test_a_timeout_past_the_limit_in_a_sweep_file_is_located(tmp_path):
    path = sweep(tmp_path, "{\n  script: train.py\n  timeout: 1e300\n  ds_config: {}\n}\n")
    refused(run(tmp_path, path), f"{path}:3", "1,000,000 seconds", tmp_path=tmp_path)


def test_an_empty_metric_and_a_missing_launcher_are_refused(tmp_path):
    path = sweep(tmp_path, "{\n  script: train.py\n  ds_config: {}\n}\n")
    refused(run(tmp_path, path, "--metric", ""), "unknown metric ''", tmp_path=tmp_path)
    refused(run(tmp_path, path, "--launcher", "no-such-launcher-xyz"), "--launcher", "no such command",
            tmp_path=tmp_path)


def test_paths_too_long_are_one_short_line(tmp_path):
    long_spec = tmp_path / ("/".join(["abcdefgh"] * 1200) + ".hjson")
    line = refused(run(tmp_path, long_spec), "", "cannot read", tmp_path=tmp_path)
    assert "..." in line
    path = sweep(tmp_path, "{\n  script: train.py\n  ds_config: {}\n}\n")
    result = autotune("run", path, "--slots", 1, "-o", tmp_path / ("d/" * 3000), timeout=60)
    refused(result, "", "...")


def test_events_into_the_sweeps_own_files_or_a_fifo_nobody_reads_are_refused(tmp_path):
    path = sweep(tmp_path, "{\n  script: train.py\n  ds_config: {}\n}\n")
    launcher = write_launcher(tmp_path, OK_STANDIN)
    done = run(tmp_path, path, "--launcher", launcher, "-q")
    assert done.returncode == 0, done.stderr
    results = tmp_path / "results"
    before = sorted(p.name for p in results.iterdir())
    refused(autotune("resume", results, "--events", results / "ledger.sqlite"), results / "ledger.sqlite",
            "sweep's own files")
    assert sorted(p.name for p in results.iterdir()) == before
    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    refused(autotune("run", path, "--slots", 1, "--launcher", launcher, "-o", tmp_path / "other", "--events", fifo,
                     timeout=30), fifo, "nobody reads")
    assert not (tmp_path / "other").exists()


def test_html_into_a_missing_directory_is_one_line(tmp_path):
    path = sweep(tmp_path, "{\n  script: train.py\n  ds_config: {}\n}\n")
    assert run(tmp_path, path, "--launcher", write_launcher(tmp_path, OK_STANDIN), "-q").returncode == 0
    result = autotune("report", tmp_path / "results", "--html", tmp_path / "nodir" / "x.html")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"autotune: error: {tmp_path / 'nodir' / 'x.html'}")


def test_a_ledger_with_words_or_records_this_version_does_not_know_is_refused_before_the_lock(tmp_path):
    import sqlite3

    path = sweep(tmp_path, "{\n  script: train.py\n  ds_config: {}\n}\n")
    assert run(tmp_path, path, "--launcher", write_launcher(tmp_path, OK_STANDIN), "-q").returncode == 0
    results = tmp_path / "results"
    (results / "runner.lock").unlink()
    with sqlite3.connect(results / "ledger.sqlite") as db:
        db.execute("UPDATE attempts SET state = 'exploded'")
    refused(autotune("resume", results), results / "ledger.sqlite", "corrupt", "exploded")
    assert not (results / "runner.lock").exists()
    with sqlite3.connect(results / "ledger.sqlite") as db:
        db.execute("UPDATE attempts SET state = 'succeeded'")
        db.execute("""UPDATE meta SET value = '{"specs": 5}' WHERE key = 'reload'""")
    refused(autotune("resume", results), results / "ledger.sqlite", "corrupt", "reload")
