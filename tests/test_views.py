"""Looking at a sweep after (or while) it runs: report views, plots, the HTML page in a real browser, compare."""
from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotuner import cli
from autotuner.backends.launch import Launcher
from autotuner.errors import UserError
from autotuner.ledger.store import Attempt
from autotuner.states import State
from autotuner.views.analysis import choose_axes, swept_keys, utilisation
from autotuner.views.compare import compare, render_compare
from autotuner.views.plots import _STATE_COLORS, METRIC_PNG, TIMELINE_PNG, timeline_figure, write_plots
from autotuner.views.report import render_report
from autotuner.views.snapshot import snapshot
from autotuner.views.summary import summary_text, write_outcome_files

from recorded import T0, grid_sweep, record, throughput, two_nodes

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "benchmarks" / "standin.sh"
runner = CliRunner()


@pytest.fixture
def midway(tmp_path):
    """A sweep as it stands while it runs: 5 ended (1 OOM), 3 running, 4 queued on two nodes."""
    return record(tmp_path / "s", grid_sweep(), two_nodes(), finished=5, running=3, fail=("zm_z0_mbs16",))


@pytest.fixture
def finished(tmp_path):
    """A finished sweep of 3 stages x 5 micro-batch sizes x 2 accumulation steps, with OOMs at the top."""
    sweep = grid_sweep(mbs=(2, 4, 8, 16, 32), gas=(1, 2))
    directory = record(tmp_path / "f", sweep, two_nodes(), finished=30,
                       fail=("zm_z2_mbs32_gas1", "zm_z2_mbs32_gas2", "zm_z1_mbs32_gas2"))
    write_outcome_files(snapshot(directory), Launcher())
    return directory


def autotune(*args, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotuner.cli", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


# --- report ------------------------------------------------------------------------------------------------
def test_table_of_a_running_sweep_has_best_failure_class_config_and_command(midway):
    text = render_report(midway, "table")
    best_line = next(line for line in text.splitlines() if "zm_z0_mbs32" in line)
    assert "best" in best_line and "1,600" in best_line
    oom = next(line for line in text.splitlines() if "zm_z0_mbs16" in line)
    assert "failed" in oom and "[oom] torch.OutOfMemoryError: CUDA out of memory" in oom
    assert sum(1 for line in text.splitlines() if " running " in line) == 3
    assert "best config, ds_config_optimal.json (the file is written when the sweep ends):" in text
    config = json.loads(text.split("the sweep ends):\n", 1)[1].split("\n\ncommand", 1)[0])
    assert config["train_micro_batch_size_per_gpu"] == 32 and config["zero_optimization"] == {"stage": 0}
    assert "autotuning" not in config
    command = text.split("command, cmd_optimal.txt:\n", 1)[1].strip()
    assert command.startswith("DS_ACCELERATOR=cpu deepspeed --num_gpus 1 ")
    assert f"--deepspeed_config {(midway / 'ds_config_optimal.json').resolve()}" in command


def test_table_of_a_finished_sweep_shows_the_files_as_written(finished):
    text = render_report(finished, "table")
    assert "best config, ds_config_optimal.json:" in text
    shown = json.loads(text.split("ds_config_optimal.json:\n", 1)[1].split("\n\ncommand", 1)[0])
    assert shown == json.loads((finished / "ds_config_optimal.json").read_text())
    assert text.split("command, cmd_optimal.txt:\n", 1)[1].strip() == (finished / "cmd_optimal.txt").read_text().strip()


def test_json_csv_md_of_a_running_sweep(midway):
    data = json.loads(render_report(midway, "json"))
    assert data["best"] == "zm_z0_mbs32" and data["counts"] == {"succeeded": 4, "failed": 1, "running": 3, "queued": 4}
    assert data["optimal"]["config"]["train_micro_batch_size_per_gpu"] == 32
    assert "--deepspeed_config" in data["optimal"]["command"]
    rows = list(csv.DictReader(io.StringIO(render_report(midway, "csv"))))
    assert len(rows) == 12 and rows[0]["best"] == "True" and rows[0]["name"] == "zm_z0_mbs32"
    md = render_report(midway, "md")
    # the swept parameters (micro-batch size, ZeRO stage), then every metric
    assert "| **best** | zm_z0_mbs32 | succeeded | 32 | 0 | 1,600 | 0.625 | 10.0s | 0.002778 |  |" in md
    assert "oom: torch.OutOfMemoryError" in md


def test_summary_keeps_the_shape_of_deepspeeds(finished):
    text = (finished / "summary.txt").read_text()
    assert text == summary_text(snapshot(finished))
    lines = text.splitlines()
    assert [c.strip() for c in lines[0].split("|")[1:-1]] == ["tuning_space", "num_experiments", "best_metric_val",
                                                              "best_exp_name"]
    assert lines[1].startswith("|:---") and "-:|:-" in lines[1]
    rows = {cells[0]: cells[1:] for line in lines[2:] if line.startswith("| ")
            for cells in [[c.strip() for c in line.split("|")[1:-1]]]}
    assert rows["global"][0] == "30" and rows["global"][2] == "zm_z0_mbs32_gas1"
    assert "," not in rows["global"][1]  # 1600, not 1,600
    assert sum(int(r[0]) for space, r in rows.items() if space != "global") == 30
    assert lines[-1].startswith("Tuning completed in ") and lines[-1].endswith("Total number of experiments: 30.")


def test_report_cli_does_not_import_plotting_or_torch(midway):
    probe = ("import sys; from typer.testing import CliRunner; from autotuner.cli import app; "
             f"r = CliRunner().invoke(app, ['report', {str(midway)!r}]); "
             f"s = CliRunner().invoke(app, ['status', {str(midway)!r}]); "
             "print(r.exit_code, s.exit_code, "
             "[m for m in ('matplotlib', 'torch', 'deepspeed', 'PIL') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "0 0 []"


# --- plots -------------------------------------------------------------------------------------------------
def read_png(path: Path):
    import matplotlib.image

    return matplotlib.image.imread(str(path))


def assert_drawn(path: Path, min_width: int, min_height: int) -> None:
    image = read_png(path)
    height, width = image.shape[:2]
    assert width >= min_width and height >= min_height, (path, image.shape)
    rgb = image[..., :3]
    assert rgb.std() > 0.05, f"{path} is blank"
    # colour: at least the line/bar colours, not only black on white (a grey image has none; a midway sweep's
    # two short lines, with the failures' strip under them, about 0.25% of the pixels)
    assert (abs(rgb[..., 0] - rgb[..., 1]) > 0.2).mean() > 0.002


def test_plots_are_written_and_not_blank(finished):
    paths = write_plots(snapshot(finished))
    assert [p.name for p in paths] == [METRIC_PNG, TIMELINE_PNG]
    assert_drawn(finished / METRIC_PNG, 800, 500)
    assert_drawn(finished / TIMELINE_PNG, 1000, 300)


def test_plot_axes_default_to_micro_batch_and_zero_stage_or_the_keys_named(finished):
    experiments = list(snapshot(finished).experiments.values())
    assert set(swept_keys(experiments)) == {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                                            "zero_optimization.stage"}
    assert choose_axes(experiments, None, None) == ("train_micro_batch_size_per_gpu", "zero_optimization.stage")
    assert choose_axes(experiments, "gradient_accumulation_steps", "train_micro_batch_size_per_gpu") == (
        "gradient_accumulation_steps", "train_micro_batch_size_per_gpu")
    with pytest.raises(UserError, match=r"--x optimizer\.params\.beta: no experiment"):
        choose_axes(experiments, "optimizer.params.beta", None)
    with pytest.raises(UserError, match="same key"):
        choose_axes(experiments, "gradient_accumulation_steps", "gradient_accumulation_steps")
    paths = write_plots(snapshot(finished), "gradient_accumulation_steps", "train_micro_batch_size_per_gpu")
    assert_drawn(paths[0], 800, 500)


def test_utilisation_is_busy_slot_seconds_over_slots_times_makespan():
    slots = {"a": [0, 1], "b": [0]}
    attempts = [
        Attempt("x", 1, State.SUCCEEDED, T0, started_at=T0, finished_at=T0 + 10, slots={"a": [0, 1]}),  # 20 slot-s
        Attempt("y", 1, State.SUCCEEDED, T0, started_at=T0 + 5, finished_at=T0 + 20, slots={"b": [0]}),  # 15 slot-s
        Attempt("z", 1, State.RUNNING, T0, started_at=T0 + 12, slots={"a": [1]}),  # running until now: 8 slot-s
        Attempt("q", 1, State.QUEUED, T0),
    ]
    use = utilisation(attempts, slots, now=T0 + 20)
    assert use["makespan_s"] == 20 and use["busy_slot_s"] == 43 and use["slots"] == 3
    assert use["utilisation"] == pytest.approx(43 / 60)
    assert use["per_host"] == {"a": pytest.approx(28 / 40), "b": pytest.approx(15 / 20)}


def test_the_timeline_draws_a_bar_per_attempt_and_slot_the_best_outlined_on_top():
    """Bars in a few collections (one patch each took minutes for a plan on 1,024 nodes): one per attempt and
    slot it held, coloured by state, the running hatched, the best outlined and drawn last."""
    from matplotlib.colors import to_hex

    attempts = [
        Attempt("x", 1, State.SUCCEEDED, T0, started_at=T0, finished_at=T0 + 10, slots={"a": [0, 1]}),
        Attempt("y", 1, State.FAILED, T0, started_at=T0 + 5, finished_at=T0 + 20, slots={"b": [0]}),
        Attempt("z", 1, State.RUNNING, T0, started_at=T0 + 12, slots={"a": [1]}),
        Attempt("q", 1, State.QUEUED, T0)]
    ax = timeline_figure("s", {"a": [0, 1], "b": [0]}, attempts, now=T0 + 20, best=attempts[0]).axes[0]
    drawn = [(c.get_hatch(), [to_hex(f, keep_alpha=False) for f in c.get_facecolor()],
              [p.vertices[:, 0].min() for p in c.get_paths()], c.get_linewidth()[0]) for c in ax.collections]
    assert drawn == [(None, [_STATE_COLORS[State.FAILED]], [5], 0.8),
                     ("//", [_STATE_COLORS[State.RUNNING]], [12], 0.8),
                     (None, [_STATE_COLORS[State.SUCCEEDED]] * 2, [0, 0], 2)]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a:0", "a:1", "b:0"]


def test_the_timeline_of_thousands_of_slots_labels_as_many_as_have_room():
    slots = {f"node{n}": list(range(8)) for n in range(1024)}
    attempts = [Attempt(f"e{n}", 1, State.SUCCEEDED, T0, started_at=T0 + n % 7, finished_at=T0 + 10 + n % 7,
                        slots={f"node{n}": list(range(8))}) for n in range(1024)]
    ax = timeline_figure("s", slots, attempts, now=T0 + 20).axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert 250 <= len(labels) <= 300 and labels[:2] == ["node0:0", "node3:4"]
    assert len(ax.collections) == 1 and len(ax.collections[0].get_paths()) == 8192
    assert ax.collections[0].get_linewidth()[0] == 0  # rows of a pixel: no white edge to hide them
    assert not ax.texts and not ax.lines  # no host names nor lines between hosts: 1,024 have no room


def test_report_plot_through_the_cli(midway):
    result = runner.invoke(cli.app, ["report", str(midway), "--plot"])
    assert result.exit_code == 0, result.output
    assert_drawn(midway / METRIC_PNG, 800, 500)
    assert_drawn(midway / TIMELINE_PNG, 1000, 300)
    bad = runner.invoke(cli.app, ["report", str(midway), "--x", "gradient_accumulation_steps"])
    assert bad.exit_code == 2 and "--plot" in bad.output
    unknown = runner.invoke(cli.app, ["report", str(midway), "--plot", "--x", "no.such.key"])
    assert unknown.exit_code == 2 and "no.such.key" in unknown.output
    # Bad input is the one line: no report printed before it.
    assert len(unknown.output.strip().splitlines()) == 1, unknown.output


def test_without_matplotlib_plots_say_how_to_install_and_html_still_works(midway):
    code = ("import sys; sys.modules['matplotlib'] = None; from autotuner.cli import main; "
            "sys.argv = ['autotune'] + sys.argv[1:]; main()")
    plot = subprocess.run([sys.executable, "-c", code, "report", str(midway), "--plot"], capture_output=True,
                          text=True)
    assert plot.returncode == 2
    assert "pip install 'ds-autotune[plots]'" in plot.stderr and len(plot.stderr.strip().splitlines()) == 1
    assert not (midway / METRIC_PNG).exists()
    page = subprocess.run([sys.executable, "-c", code, "report", str(midway), "--html"], capture_output=True,
                          text=True)
    assert page.returncode == 0, page.stderr
    assert "without plots" in page.stderr
    html = (midway / "report.html").read_text()
    assert "zm_z0_mbs32" in html and "pip install &#x27;ds-autotune[plots]&#x27;" in html and "<img" not in html


# --- the HTML page -----------------------------------------------------------------------------------------
def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("headless Chromium is needed to check the HTML report (.ci/setup-tests installs Debian's chromium)")


def headless(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "chromium-profile"
    return subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", "--no-first-run",
                           f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=120)


# Appended to a copy of the page: records, once the page has loaded, whether each image decoded and its size.
PROBE = ('<script>window.addEventListener("load", function () { document.querySelectorAll("img").forEach('
         'function (i) { i.setAttribute("data-loaded", i.complete && i.naturalWidth > 0 ? '
         'i.naturalWidth + "x" + i.naturalHeight : "broken"); }); });</script>')


def test_html_report_renders_in_headless_chromium(finished, tmp_path):
    result = autotune("report", finished, "--html")  # bare --html: DIR/report.html
    assert result.returncode == 0, result.stderr
    page = finished / "report.html"
    html = page.read_text()
    assert "http://" not in html and "https://" not in html  # self-contained: nothing to fetch
    assert html.count('src="data:image/png;base64,') == 2
    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("</main></body>", PROBE + "</main></body>"))
    dom = headless(tmp_path, "--dump-dom", probe.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    text = dom.stdout
    snap = snapshot(finished)
    for name in snap.experiments:
        assert f'data-name="{name}"' in text and f"<td>{name}</td>" in text
    assert '<tr class="succeeded best" data-name="zm_z0_mbs32_gas1">' in text
    assert text.count('class="marker"') == 2  # the best line and the best row
    assert "[oom] torch.OutOfMemoryError" in text
    assert '"train_micro_batch_size_per_gpu": 32' in text and 'id="command">DS_ACCELERATOR=cpu deepspeed' in text
    loaded = dict(
        (part.split('id="', 1)[1].split('"', 1)[0], part.split('data-loaded="', 1)[1].split('"', 1)[0])
        for part in text.split("<img")[1:])
    assert set(loaded) == {"plot_metric", "plot_timeline"}
    for image_id, size in loaded.items():
        assert size != "broken", image_id
        width, height = map(int, size.split("x"))
        assert width >= 800 and height >= 300
    # and a picture of it, looked at: big enough, not blank, the plots' colours present
    shot = tmp_path / "page.png"
    taken = headless(tmp_path, f"--screenshot={shot}", "--window-size=1280,2600", page.as_uri())
    assert taken.returncode == 0 and shot.exists(), taken.stderr[-2000:]
    assert_drawn(shot, 1280, 2600)


def test_html_file_argument_and_bare_flag(finished, tmp_path):
    assert cli.optional_html_value(["report", "D", "--html"]) == ["report", "D", "--html="]
    assert cli.optional_html_value(["report", "--html", "D"]) == ["report", "--html=", "D"]
    assert cli.optional_html_value(["report", "--html", "x.html", "D"]) == ["report", "--html", "x.html", "D"]
    target = tmp_path / "elsewhere.html"
    result = autotune("report", "--html", target, finished, "--format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["best"] == "zm_z0_mbs32_gas1"  # stdout stays the report
    assert target.exists() and f"html: {target}" in result.stderr
    assert not (finished / "report.html").exists()


def test_html_never_lands_on_the_sweeps_own_files_nor_its_runs(finished, tmp_path):
    """The README: --html is refused where it names one of the command's inputs, its sweep's files among them.
    `--html=DIR/summary.txt` replaced the summary with the page, `--html=DIR/RUN/stdout.log` a run's log, and a
    link elsewhere to the summary the summary too."""
    log = finished / "zm_z0_mbs2_gas1" / "stdout.log"
    log.parent.mkdir(exist_ok=True)
    log.write_text("the run's own output\n")
    kept = {p: p.read_bytes() for p in (finished / "summary.txt", finished / "ds_config_optimal.json", log)}
    link = tmp_path / "page.html.txt"
    link.symlink_to(finished / "summary.txt")
    for target in [*kept, link]:
        result = autotune("report", finished, f"--html={target}", "--plot")
        assert result.returncode == 2 and result.stdout == "", result.stdout
        assert len(result.stderr.strip().splitlines()) == 1 and "--html wants a file of its own" in result.stderr
    assert {p: p.read_bytes() for p in kept} == kept
    assert not (finished / METRIC_PNG).exists()  # nothing written before the refusal
    assert autotune("report", finished, f"--html={finished / 'report.html'}").returncode == 0


def test_report_plot_and_html_while_the_sweep_runs(tmp_path):
    """A real sweep (stand-in launcher) that is still running: report, plots and page all work."""
    spec = tmp_path / "slow.hjson"
    # 18 runs of 4 s on 2 slots: still running while a loaded machine draws the plots and the page (with 6, the
    # sweep had ended before the page was written); it is stopped once they are checked
    spec.write_text("{\n  name: slow\n  script: /bin/true\n  timeout: 60\n  ds_config: {}\n"
                    "  space: { train_micro_batch_size_per_gpu: [1, 2, 4, 8, 16, 32],\n"
                    "           gradient_accumulation_steps: [1, 2, 3] }\n}\n")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "autotuner.cli", "run", str(spec), "--slots", "2", "--launcher",
                             f"sh {STANDIN}", "--results", str(out), "--quiet"],
                            env={**os.environ, "STANDIN_SECONDS": "4"}, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:  # first results while others still run
            if (out / "ledger.sqlite").exists():
                data = json.loads(render_report(out, "json"))
                if data["counts"].get("succeeded") and data["counts"].get("running"):
                    break
            time.sleep(0.1)
        else:
            pytest.fail("the sweep did not get going")
        report = autotune("report", out, "--plot", "--html")
        assert report.returncode == 0, report.stderr
        assert " running " in report.stdout
        assert "best config, ds_config_optimal.json (the file is written" in report.stdout
        assert "still running (runner pid" in (out / "report.html").read_text()
        assert_drawn(out / TIMELINE_PNG, 1000, 200)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.wait(30)


# --- compare -----------------------------------------------------------------------------------------------
@pytest.fixture
def pair(tmp_path):
    a = record(tmp_path / "a", grid_sweep(mbs=(4, 8, 16, 32)), two_nodes(), finished=12, fail=("zm_z2_mbs32",))
    faster = lambda name: round(throughput(name) * (1.25 if "_z0_" in name else 0.9), 3)  # noqa: E731
    b = record(tmp_path / "b", grid_sweep(mbs=(8, 16, 32, 64)), two_nodes(), finished=12, value=faster)
    return a, b


def test_compare_matches_by_name_with_ratio_and_lists_the_rest(pair):
    a, b = pair
    c = compare(snapshot(a), snapshot(b))
    by_name = {r["name"]: r for r in c.rows}
    assert set(by_name) == {f"zm_z{z}_mbs{m}" for z in (0, 1, 2) for m in (8, 16, 32)}
    assert by_name["zm_z0_mbs16"]["ratio"] == pytest.approx(1.25, rel=1e-3)
    assert by_name["zm_z1_mbs8"]["ratio"] == pytest.approx(0.9, rel=1e-3)
    assert by_name["zm_z2_mbs32"]["ratio"] is None and by_name["zm_z2_mbs32"]["a_state"] == "failed"
    assert c.only_a == ["zm_z0_mbs4", "zm_z1_mbs4", "zm_z2_mbs4"]
    assert c.only_b == ["zm_z0_mbs64", "zm_z1_mbs64", "zm_z2_mbs64"]
    assert c.verdict(1.25) == "better" and c.verdict(0.9) == "worse" and c.verdict(1.01) == "same"

    data = json.loads(render_compare(a, b, "json"))
    assert data["metric"] == "throughput" and data["a"]["best"] == "zm_z0_mbs32" and data["b"]["best"] == "zm_z0_mbs64"
    assert {r["name"]: r["verdict"] for r in data["experiments"]}["zm_z0_mbs8"] == "better"
    assert data["only_a"] == c.only_a and data["only_b"] == c.only_b
    assert data["geomean_ratio"] == pytest.approx((1.25 ** 3 * 0.9 ** 5) ** (1 / 8), rel=1e-3)


def test_compare_table_through_the_cli(pair):
    a, b = pair
    result = runner.invoke(cli.app, ["compare", str(a), str(b)])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "zm_z0_mbs16" in line)
    assert "919" in row and "1,149" in row and "1.250" in row and "better" in row
    failed = next(line for line in result.output.splitlines() if "zm_z2_mbs32" in line)
    assert "failed (oom)" in failed
    assert "only in A (3): zm_z0_mbs4, zm_z1_mbs4, zm_z2_mbs4" in result.output
    assert "only in B (3): zm_z0_mbs64, zm_z1_mbs64, zm_z2_mbs64" in result.output
    assert runner.invoke(cli.app, ["compare", str(a), str(b), "--format", "yaml"]).exit_code == 2
    missing = runner.invoke(cli.app, ["compare", str(a), str(a.parent / "nothing")])
    assert missing.exit_code == 2 and "no sweep here" in missing.output


def test_compare_of_sweeps_that_share_no_experiment_says_so_and_lists_few_names(tmp_path):
    """No empty box, and at most ten names of each side's (all of them in JSON)."""
    a = record(tmp_path / "a", grid_sweep(mbs=tuple(range(1, 12))), two_nodes(), finished=33)
    b = record(tmp_path / "b", grid_sweep(name="other", stages=(0,), mbs=(4,)), two_nodes(), finished=1)
    text = render_compare(a, b, "table")
    assert "┏" not in text and "0 experiment(s) in both" in text, text
    listed = [f"zm_z0_mbs{m}" for m in range(1, 11)]
    assert f"only in A (33): {', '.join(listed)}, and 23 more (--format json lists them all)" in text
    assert "only in B (1): other_z0_mbs4\n" in text
    assert len(json.loads(render_compare(a, b, "json"))["only_a"]) == 33


def test_compare_latency_sweeps_lower_is_better(tmp_path):
    a = record(tmp_path / "a", grid_sweep(metric="latency"), two_nodes(), finished=12)
    b = record(tmp_path / "b", grid_sweep(metric="latency"), two_nodes(), finished=12,
               value=lambda name: throughput(name) * 2)  # twice the throughput: half the latency
    c = compare(snapshot(a), snapshot(b))
    assert c.minimize and all(r["ratio"] == pytest.approx(0.5, rel=1e-3) for r in c.rows)
    assert {c.verdict(r["ratio"]) for r in c.rows} == {"better"}
