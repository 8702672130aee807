"""The command line as a user meets it: bad input is one line and exit 2, and nothing is launched."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotuner.views.report import render_report

from recorded import grid_sweep, record, two_nodes

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "benchmarks" / "standin.sh"


def autotune(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "autotuner.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)


def sweep_file(tmp_path, body: str, name="sweep.hjson") -> Path:
    (tmp_path / "train.py").write_text("# stand-in script\n")
    path = tmp_path / name
    path.write_text(body)
    return path


GOOD = """{
  script: train.py
  metric: throughput
  ds_config: {train_micro_batch_size_per_gpu: 1}
  space: {"zero_optimization.stage": [0, 1, 2]}
}
"""


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_help_imports_neither_torch_nor_deepspeed():
    code = ("import sys, autotuner.cli\n"
            "from typer.testing import CliRunner\n"
            "r = CliRunner().invoke(autotuner.cli.app, ['--help'])\n"
            "assert r.exit_code == 0 and 'resume' in r.output, r.output\n"
            "bad = [m for m in ('torch', 'deepspeed', 'paramiko', 'fabric', 'matplotlib', 'optuna',\n"
            "                        'ray')\n"
            "       if m in sys.modules]\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_import_autotuner_is_light_and_python_m_autotuner_is_the_command():
    # Every name of the face but UserError, State and Reason is imported on first use (prepare and cancel too).
    code = ("import sys, autotuner\n"
            "names = [autotuner.run, autotuner.resume, autotuner.UserError, autotuner.State]\n"
            "assert 'prepare' in autotuner._LAZY and 'cancel' in autotuner._LAZY\n"
            "heavy = ('typer', 'rich', 'fabric', 'paramiko', 'matplotlib', 'torch', 'hjson', 'autotuner.sweep.run',\n"
            "         'optuna')\n"
            "print(sorted(m for m in heavy if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    result = subprocess.run([sys.executable, "-m", "autotuner", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and "resume" in result.stdout, result


def test_status_and_report_load_only_the_views_they_print(tmp_path):
    """`autotune status` and `report` start fast on a large sweep: the live view, the HTML page, the comparison
    and the event log are not imported to print a table (they were, through the views package, on every read)."""
    code = ("import sys, autotuner\n"
            "autotuner.render_status, autotuner.render_report, autotuner.snapshot\n"
            "import autotuner.views as views\n"
            "views.render_status, views.load\n"
            "print(sorted(m for m in ('autotuner.views.live', 'autotuner.views.html', 'autotuner.views.compare',\n"
            "                         'autotuner.views.events', 'autotuner.views.plots') if m in sys.modules))\n"
            "print(sorted(n for n in views.__all__ if getattr(views, n) is None))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "[]"]


def test_public_api_names_resolve():
    import autotuner

    for name in autotuner.__all__:
        assert getattr(autotuner, name) is not None, name
    assert callable(autotuner.prepare) and callable(autotuner.cancel)  # not the modules of the same names


def test_debug_and_verbose_keep_user_errors_to_one_line(tmp_path):
    for flag in ("--debug", "--verbose"):
        assert_one_line_error(autotune(flag, "status", tmp_path / "nothing"), "no sweep here")


def test_malformed_hjson_names_file_line_and_column(tmp_path):
    path = sweep_file(tmp_path, "{\n  script: train.py\n  space: {\"a\": [1, 2}\n}\n")
    results = tmp_path / "results"
    assert_one_line_error(autotune("run", path, "--slots", "1", "-o", results), f"{path}:3:")
    assert not results.exists()


def test_unknown_key_names_its_line(tmp_path):
    path = sweep_file(tmp_path, "{\n  script: train.py\n  ds_config: {}\n  spaces: {}\n}\n")
    assert_one_line_error(autotune("run", path, "--slots", "1", "-o", tmp_path / "r"), f"{path}:4", "spaces")


def test_bad_hostfile_line(tmp_path):
    path = sweep_file(tmp_path, GOOD)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-0 slots=2\nworker-1 slots=two\n")
    assert_one_line_error(autotune("run", path, "-H", hostfile, "-o", tmp_path / "r"), f"{hostfile}:2")


def test_an_experiment_needing_more_slots_per_node_than_exist(tmp_path):
    path = sweep_file(tmp_path, GOOD.replace("metric: throughput", "metric: throughput\n  num_gpus: 4"))
    results = tmp_path / "r"
    assert_one_line_error(autotune("run", path, "--slots", "2", "-o", results), "needs 1 node(s) with 4 slot(s)")
    assert not results.exists()


def test_an_experiment_needing_more_nodes_than_exist(tmp_path):
    path = sweep_file(tmp_path, GOOD.replace("metric: throughput", "metric: throughput\n  num_nodes: 3"))
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-0 slots=2\nworker-1 slots=2\n")
    assert_one_line_error(autotune("run", path, "-H", hostfile, "-o", tmp_path / "r"), "needs 3 node(s)")


def test_bad_include_filter(tmp_path):
    path = sweep_file(tmp_path, GOOD)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-0 slots=2\n")
    assert_one_line_error(autotune("run", path, "-H", hostfile, "-i", "worker-9", "-o", tmp_path / "r"),
                          "--include", "worker-9")


def test_no_gpu_and_no_slots_says_what_to_do(tmp_path):
    assert_one_line_error(autotune("run", sweep_file(tmp_path, GOOD), "-o", tmp_path / "r"), "--slots")


def test_duplicate_experiment_names_refused(tmp_path):
    one = sweep_file(tmp_path, GOOD, "a.hjson")
    assert_one_line_error(autotune("run", one, one, "--slots", "1", "-o", tmp_path / "r"), "duplicate")


def test_a_results_directory_holding_a_sweep_is_not_touched(tmp_path):
    path = sweep_file(tmp_path, GOOD)
    results = tmp_path / "r"
    first = autotune("run", path, "--slots", "3", "--launcher", f"sh {STANDIN}", "-o", results, "-q")
    assert first.returncode == 0, first.stderr
    before = {p: p.stat().st_mtime_ns for p in results.rglob("*")}
    assert_one_line_error(autotune("run", path, "--slots", "3", "-o", results), "autotune resume")
    assert {p: p.stat().st_mtime_ns for p in results.rglob("*")} == before


def test_report_of_a_directory_without_a_sweep(tmp_path):
    assert_one_line_error(autotune("report", tmp_path), "no sweep here")


def test_run_prints_the_best_and_where_its_files_are(tmp_path):
    path = sweep_file(tmp_path, GOOD)
    results = tmp_path / "r"
    out = autotune("run", path, "--slots", "2", "--launcher", f"sh {STANDIN}", "-o", results)
    assert out.returncode == 0, out.stderr
    assert "3 experiments: 3 succeeded" in out.stdout
    assert f"config:  {results}/ds_config_optimal.json" in out.stdout
    assert f"command: {results}/cmd_optimal.txt" in out.stdout
    report = json.loads(autotune("report", results, "--format", "json").stdout)
    assert [r["state"] for r in report["experiments"]] == ["succeeded"] * 3
    assert sum(r["best"] for r in report["experiments"]) == 1


def snapshot_of(directory: Path) -> dict:
    return {p: (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None) for p in directory.rglob("*")}


def test_a_results_path_that_is_a_file_or_lies_under_one(tmp_path):
    path = sweep_file(tmp_path, GOOD)
    taken = tmp_path / "taken"
    taken.write_text("mine\n")
    before = snapshot_of(tmp_path)
    assert_one_line_error(autotune("run", path, "--slots", "1", "-o", taken), str(taken), "not a directory")
    assert_one_line_error(autotune("run", path, "--slots", "1", "-o", taken / "sub" / "r"),
                          str(taken / "sub" / "r"), f"{taken} is a file")
    assert snapshot_of(tmp_path) == before


def test_unbalanced_quotes_name_their_option(tmp_path):
    path = sweep_file(tmp_path, GOOD)
    results = tmp_path / "r"
    assert_one_line_error(autotune("run", path, "--slots", "1", "--args", "'abc", "-o", results), "--args", "quotation")
    assert_one_line_error(autotune("run", path, "--slots", "1", "--launcher", "'x", "-o", results), "--launcher")
    assert not results.exists()


def test_numbers_out_of_range_in_a_sweep_file(tmp_path):
    for entry in ("timeout: 1e400", "num_gpus: 1e400"):
        path = sweep_file(tmp_path, GOOD.replace("metric: throughput", f"metric: throughput\n  {entry}"))
        assert_one_line_error(autotune("run", path, "--slots", "1", "-o", tmp_path / "r"), f"{path}:4:",
                              "out of range")
        assert not (tmp_path / "r").exists()


def test_hosts_with_a_missing_ssh_config(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-0 slots=1\n")
    assert_one_line_error(autotune("hosts", "-H", hostfile, "--ssh-config", tmp_path / "nope"),
                          str(tmp_path / "nope"), "--ssh-config")


def test_a_corrupt_ledger_is_one_line_and_left_alone(tmp_path):
    results = tmp_path / "r"
    results.mkdir()
    ledger = results / "ledger.sqlite"
    ledger.write_bytes(b"this is not a database, just garbage " * 100)
    before = snapshot_of(results)
    for command in (["status", results], ["report", results], ["resume", results, "-q"], ["cancel", results]):
        assert_one_line_error(autotune(*command), str(ledger), "not a sweep ledger")
    assert snapshot_of(results) == before


def test_a_missing_ssh_config_creates_nothing(tmp_path):
    path = sweep_file(tmp_path, GOOD)
    results = tmp_path / "r"
    assert_one_line_error(autotune("run", path, "--slots", "1", "--ssh-config", tmp_path / "nope", "-o", results),
                          str(tmp_path / "nope"))
    assert not results.exists()


def test_negative_seconds_are_refused(tmp_path):
    path = sweep_file(tmp_path, GOOD)
    results = tmp_path / "r"
    for option in ("--deadline", "--grace", "--timeout"):
        assert_one_line_error(autotune("run", path, "--slots", "1", option, "-5", "-o", results), option)
        assert not results.exists()
    assert_one_line_error(autotune("resume", results, "--deadline", "-1"), "--deadline")


def test_resume_after_the_sweep_file_is_gone(tmp_path):
    import os

    path = sweep_file(tmp_path, GOOD)
    results = tmp_path / "r"
    slow = dict(os.environ, STANDIN_SECONDS="60")
    first = autotune("run", path, "--slots", "1", "--launcher", f"sh {STANDIN}", "--deadline", "1", "--grace", "1",
                     "-o", results, "-q", env=slow)
    assert first.returncode != 0, first
    path.unlink()
    out = autotune("resume", results, "--retry-failed", "-q")  # the deadline left one timed_out, two queued
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"autotune: note: {path} is gone: resuming the experiments recorded in the ledger"]
    assert "3 experiments: 3 succeeded" in out.stdout


def test_resume_refuses_a_sweep_file_now_malformed(tmp_path):
    path = sweep_file(tmp_path, GOOD)
    results = tmp_path / "r"
    first = autotune("run", path, "--slots", "3", "--launcher", f"sh {STANDIN}", "-o", results, "-q")
    assert first.returncode == 0, first.stderr
    path.write_text("{\n  script: train.py\n  space: {\"a\": [1, 2}\n}\n")
    assert_one_line_error(autotune("resume", results), f"{path}:3:")


def test_an_explicit_metric_wins_over_the_sweep_file(tmp_path):
    path = sweep_file(tmp_path, GOOD)  # metric: throughput
    results = tmp_path / "r"
    out = autotune("run", path, "--slots", "3", "--launcher", f"sh {STANDIN}", "--metric", "latency", "-o", results)
    assert out.returncode == 0, out.stderr
    assert "with latency" in out.stdout
    assert json.loads(autotune("report", results, "--format", "json").stdout)["metric"] == "latency"


@pytest.mark.parametrize("where", ["typer.main.get_command", "typer.core.TyperGroup.parse_args"])
def test_ctrl_c_while_the_command_line_is_read_is_one_line_and_exit_130(where):
    # A Ctrl-C that lands before the command's own handlers (typer building the command, or parsing it) printed
    # a KeyboardInterrupt traceback, or nothing (seen once in 117 interruptions of the outside crash test). Here
    # the press is a real SIGINT, sent at that moment.
    module, _, name = where.rpartition(".")
    code = ("import importlib, os, signal, time\n"
            f"owner = {module!r}.split('.')\n"
            "target = importlib.import_module('.'.join(owner[:2]))\n"
            "target = getattr(target, owner[2]) if len(owner) > 2 else target\n"
            f"original = getattr(target, {name!r})\n"
            "def pressed(*args, **kwargs):\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n"
            "    time.sleep(5)\n"
            "    return original(*args, **kwargs)\n"
            f"setattr(target, {name!r}, pressed)\n"
            "from autotuner.cli import main\n"
            "main(['status', '.'])\n")
    _interrupted_in_one_line(code)


def test_ctrl_c_while_the_command_line_is_imported_is_one_line_and_exit_130():
    # The console script's press before `cli.main` runs: while Python still imports the command line's modules
    # (about 50 ms of every start), a real SIGINT sent as the CLI's app module is looked for.
    code = ("import importlib.abc, os, signal, sys, time\n"
            "class Press(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name == 'autotuner.cli.app':\n"
            "            os.kill(os.getpid(), signal.SIGINT)\n"
            "            time.sleep(5)\n"
            "        return None\n"
            "sys.meta_path.insert(0, Press())\n"
            "sys.argv = ['autotune', 'status', '.']\n"
            "from autotuner.__main__ import main\n"
            "main()\n")
    _interrupted_in_one_line(code)


def _interrupted_in_one_line(code: str) -> None:
    """`code` (a Python program that presses Ctrl-C at some moment of the CLI's start) ends as every press does.
    It starts with Ctrl-C as a terminal gives it: a suite started in the background (`cmd &` without job control)
    hands its processes SIGINT ignored, and Python then never raises KeyboardInterrupt at all."""
    code = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n" + code
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 130, done
    assert done.stderr.strip() == "autotune: interrupted", done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_help_starts_without_rich_pydantic_or_any_backend():
    # `autotune --help` is plain click help: typer's rich help (rich's Markdown, pygments) was most of its start-up,
    # and the backends' checks are read through the API's lazy face, so no backend (but the declarations of their
    # flags: test_cli_backends.py), core or view module is imported.
    code = ("import sys\n"
            "from autotuner.cli import main\n"
            "DECLARATIONS = {'flags', 'kinds', 'hosts', 'hosts.options', 'slurm', 'slurm.options', 'ray', "
            "'ray.options'}\n"
            "try:\n"
            "    main(['--help'])\n"
            "except SystemExit as e:\n"
            "    assert e.code == 0, e.code\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('rich', 'pydantic', 'torch', 'deepspeed')\n"
            "             or m.startswith(('autotuner.backends.', 'autotuner.core', 'autotuner.views'))\n"
            "             and m.removeprefix('autotuner.backends.') not in DECLARATIONS))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


@pytest.mark.parametrize("command, options", [
    ("run", ["--hostfile", "--include", "--exclude", "--slots", "--ray", "--timeout", "--deadline", "--retries",
             "--grace", "--ssh-config", "--accept-new-hosts", "--remote-dir", "--quiet", "--events", "--fail-on",
             "--format", "--slurm", "--nodes", "--gpus-per-node", "--partition", "--time", "--account"]),
    ("tune", ["--hostfile", "--include", "--exclude", "--slots", "--ray", "--timeout", "--deadline", "--retries",
              "--grace", "--ssh-config", "--accept-new-hosts", "--remote-dir", "--quiet", "--events", "--fail-on",
              "--format", "--slurm", "--nodes", "--gpus-per-node", "--partition", "--time", "--account"]),
    ("resume", ["--timeout", "--deadline", "--retries", "--grace", "--ssh-config", "--accept-new-hosts",
                "--remote-dir", "--quiet", "--events", "--fail-on", "--format", "--slurm", "--nodes",
                "--gpus-per-node", "--partition", "--time", "--account", "--ray"]),
    ("plan", ["--hostfile", "--include", "--exclude", "--slots", "--ray", "--timeout", "--slurm", "--nodes",
              "--gpus-per-node"])])
def test_help_lists_every_option_of_the_shared_bundles(command, options):
    listed = autotune(command, "--help", env={**os.environ, "COLUMNS": "200"})
    assert listed.returncode == 0, listed.stderr
    words = set(listed.stdout.replace(",", " ").split())
    assert [o for o in options if o not in words] == []


def test_a_bundled_value_reaches_the_command_and_is_checked_there(tmp_path):
    # --deadline lives in the Timing bundle, --ssh-config in the SSH one: each checked once, for every command.
    for args in (("run", sweep_file(tmp_path, GOOD), "--slots", "1"), ("resume", tmp_path / "none")):
        assert_one_line_error(autotune(*args, "--deadline", "-5"), "--deadline must be a positive number")
        assert_one_line_error(autotune(*args, "--ssh-config", tmp_path / "missing"), "--ssh-config: no such file")


def test_a_launcher_named_by_a_relative_path_is_taken_from_the_current_directory(tmp_path):
    """Runs start in their script's directory: `--launcher bin/launch.sh` passed the check that it exists (from
    here), then every run failed with exit status 127 there, twice."""
    (tmp_path / "bin").mkdir()
    launcher = tmp_path / "bin" / "launch.sh"
    launcher.write_text(STANDIN.read_text())
    launcher.chmod(0o755)
    (tmp_path / "exp").mkdir()
    spec = sweep_file(tmp_path / "exp", "{\n  script: train.py\n  ds_config: {}\n  space: {x: [1, 2]}\n}\n")
    result = autotune("run", spec, "--slots", "2", "--launcher", "bin/launch.sh", "-o", tmp_path / "out", "-q",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 experiments: 2 succeeded" in result.stdout


@pytest.mark.parametrize("argv, code, torn_down", [
    (["report", "SWEEP", "--format", "csv"], 0, False),  # a read command: ends as soon as its output is out
    (["status", "NOWHERE"], 2, False),  # its bad input too, with its exit status
    (["-v", "status", "NOWHERE"], 2, False),  # after the options that may come first
    (["--version"], 0, False),
    (["resume", "NOWHERE"], 2, True),  # a command that runs sweeps ends as Python ends
])
def test_a_read_command_ends_without_the_interpreters_teardown_its_output_whole(tmp_path, argv, code, torn_down):
    """`autotune status/report/compare/plan`, --help and --version skip Python's teardown (__main__._READS) and
    run without the cyclic collector: their output and exit status are what they were; any other command ends
    as Python ends (atexit runs), its collector at work as it loads (thousands of objects made)."""
    sweep = record(tmp_path / "s", grid_sweep(), two_nodes(), finished=12)
    mark, collected = tmp_path / "torn-down", tmp_path / "collected"
    argv = [str(sweep) if a == "SWEEP" else str(tmp_path / "none") if a == "NOWHERE" else a for a in argv]
    program = ("import atexit, gc, sys\n"
               f"atexit.register(lambda: open({str(mark)!r}, 'w').close())\n"
               f"sys.argv = ['autotune', *{argv!r}]\n"
               "from autotuner.__main__ import main\n"
               f"gc.callbacks.append(lambda phase, info: open({str(collected)!r}, 'w').close())\n"
               "main()\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr
    assert mark.exists() == torn_down
    assert collected.exists() == torn_down
    if argv[0] == "report":
        assert done.stdout == render_report(sweep, "csv") and len(done.stdout.splitlines()) == 13
    elif code == 2:
        assert done.stderr.startswith("autotune: error:") and len(done.stderr.splitlines()) == 1


def test_a_read_command_runs_the_collector_while_it_makes_plots(tmp_path):
    """`report --plot` (and --html): matplotlib leaves cycles behind, collected as the plots are made though the
    command otherwise runs without the collector."""
    sweep = record(tmp_path / "s", grid_sweep(), two_nodes(), finished=12)
    seen, freed = tmp_path / "collector", tmp_path / "freed"
    program = ("import gc, sys, weakref, autotuner\n"
               "class Figure: pass\n"
               "def plots(*args, **kwargs):\n"
               f"    open({str(seen)!r}, 'w').write(str(gc.isenabled()))\n"
               "    figure = Figure()\n"
               "    figure.itself = figure  # a cycle, as a drawn figure's\n"
               f"    weakref.finalize(figure, open, {str(freed)!r}, 'w')\n"
               "    return []\n"
               "autotuner.write_plots = plots\n"
               f"sys.argv = ['autotune', 'report', {str(sweep)!r}, '--plot']\n"
               "from autotuner.__main__ import main\n"
               "main()\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert seen.read_text() == "True" and freed.exists() and done.stdout == render_report(sweep, "table")
