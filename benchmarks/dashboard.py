"""`autotune dashboard` on the 10,000-experiment sweep of benchmarks/scale.py, and beside a running sweep.

  page     the first load of a sweep's page: the page, its script and the plots' two, then the sweep's first answer
           (every row, the summary), cold (the dashboard's first read of the ledger) and warm; server time (the
           app's, from its Server-Timing header, before compression), wall time at the client, bytes as sent
           (gzip) and raw
  update   what the page asks every 0.5 s: "what changed since transition N", after one experiment started and
           another ended (as a runner records them), and with nothing new; and "whose steps so far changed since
           mark M", after a running experiment's reading was replaced (as the runner does, without a transition);
           and what a running experiment's own page asks every second (its attempts, their steps)
  beside   the scheduling benchmark (N x S s on K slots, benchmarks/scheduling.py's round) with a dashboard
           open (a client polling as the page does, in a process of its own) against without, interleaved:
           makespan / ideal both ways, and the dashboard's own CPU time
  browser  (--browser) the page in headless Chromium at 1400 px, its main thread's long tasks as the browser's own
           PerformanceObserver('longtask') reports them (every task over 50 ms): the sweep's first view (its
           table; view_plotly 1 if a chart library was loaded for it), the table sorted by the metric with a
           click (sort_ms, the click's own time: every row sorted, a page of them drawn), plotly.js's own
           evaluation where the checkout still served it (the task in which it defines window.Plotly; nan for a
           checkout whose plots are the page's own SVG), the plots tab's first drawing, redraws (the system's
           colour scheme switched, which redraws every plot), and 10 s of a live sweep (one experiment started and ended
           every 0.5 s, written to the ledger as a runner does): the longest task and the share of the time in
           long tasks. Each long task is also found in Chromium's own trace (its `toplevel` RunTask events, the
           same task by start and length), for its CPU time on the main thread (`tdur`): on a loaded machine a
           task's wall time is several times its CPU time (where that match fails on a loaded machine, cpu_1st
           and cpu_2nd: the CPU of the round's two costliest main-thread tasks, read from the whole trace once the
           round is over; plotly.js's evaluation is the first). Each --code (a checkout:
           its autotuner serves the page) in turn, round after round, each on a fresh copy of the sweep and a
           fresh browser profile (nothing cached)

  python benchmarks/dashboard.py --experiments 10000 --rounds 5 --beside-rounds 3
  python benchmarks/dashboard.py --browser --rounds 3 --code OLD_CHECKOUT --code .
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from scale import build  # noqa: E402

import autotuner  # noqa: E402
from autotuner import State  # noqa: E402
from autotuner.dashboard.client import sign_in  # noqa: E402
from autotuner.ledger.store import Ledger  # noqa: E402  # plays the runner's part: one start, one end per update
from autotuner.spec.interval import Interval, RunTimes  # noqa: E402

STANDIN = ROOT / "benchmarks" / "standin.sh"


class Served:
    """`autotune dashboard DIR --port 0` as a subprocess (of the checkout `code`), and requests to it."""

    def __init__(self, directory: Path, code: Path = ROOT):
        self.proc = subprocess.Popen([sys.executable, "-m", "autotuner", "dashboard", str(directory), "--port", "0"],
                                     stdout=subprocess.PIPE, text=True, cwd=code,
                                     env={**os.environ, "PYTHONPATH": str(code)})
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("open "):
                host, self.port, self.token = sign_in(line.split()[1])  # the link's one-time code traded
                self.url = f"http://{host}:{self.port}/?token={self.token}"  # for a browser: the token's own link
                break
        else:
            raise SystemExit("the dashboard did not start")

    def get(self, path: str, gzip: bool = True) -> tuple[float, float, int, bytes]:
        """(server ms, wall ms, bytes sent, body) of one GET."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        headers = {"X-Autotune-Token": self.token, "Accept-Encoding": "gzip" if gzip else "identity"}
        started = time.perf_counter()
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        body = response.read()
        wall = (time.perf_counter() - started) * 1000
        connection.close()
        assert response.status == 200, (path, response.status, body[:200])
        timing = response.getheader("Server-Timing") or "app;dur=nan"
        return float(timing.split("dur=")[1]), wall, len(body), body

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def decoded(body: bytes) -> Any:
    import gzip
    return json.loads(gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body)


def page_and_updates(n: int, rounds: int, workdir: Path) -> None:
    directory = workdir / "scale"
    directory.mkdir()
    counts = build(directory, n)
    print(f"sweep of {n}: {', '.join(f'{k} {v}' for k, v in counts.items())}", flush=True)
    served = Served(directory)
    try:
        cpu = served.cpu_seconds()
        listed = served.get("/api/sweeps")
        used = served.cpu_seconds() - cpu
        (sid,) = [s["id"] for s in decoded(listed[3])["sweeps"]]
        print(f"the list of sweeps, cold (the dashboard's first read of the ledger): server {listed[0]:.0f} ms "
              f"(CPU {used * 1000:.0f} ms), wall {listed[1]:.0f} ms, {listed[2]} B")
        assets = [served.get(p)[2] for p in ("/", "/static/app.js", "/static/app.css", "/static/chart.js",
                                              "/static/plots.js")]
        print(f"page assets (gzip): {sum(assets) / 1e3:.0f} kB, of which the plots' {sum(assets[-2:]) / 1e3:.0f} kB")
        cpu = served.cpu_seconds()
        cold = served.get(f"/api/sweeps/{sid}?since=-1")  # its first: the rows are encoded for the first time
        used = served.cpu_seconds() - cpu
        firsts = [served.get(f"/api/sweeps/{sid}?since=-1") for _ in range(rounds)]
        raw = served.get(f"/api/sweeps/{sid}?since=-1", gzip=False)
        first = decoded(cold[3])
        print(f"first answer: server {cold[0]:.0f} ms (CPU {used * 1000:.0f} ms, gzip included), wall "
              f"{cold[1]:.0f} ms, {cold[2] / 1e3:.0f} kB gzip ({raw[2] / 1e6:.2f} MB raw), {len(first['rows'])} rows")
        print(f"first answer, warm (median of {rounds}): server {statistics.median(f[0] for f in firsts):.0f} ms, "
              f"wall {statistics.median(f[1] for f in firsts):.0f} ms")
        seq, sv = first["seq"], first["sv"]
        queued = [r[0] for r in first["rows"] if r[1] == State.QUEUED]
        changed, idle, spent = [], [], []
        for name in queued[:rounds]:
            ledger = Ledger.open(directory)
            ledger.start(name, 1, slots={"localhost": [0]}, tag=f"bench.{name}.1", dir=str(directory / name),
                         at=time.time())
            ledger.finish(name, 1, State.SUCCEEDED, time.time(), exit_code=0, metric=9999.0,
                          metrics={"throughput": 9999.0})
            ledger.close()
            cpu = served.cpu_seconds()
            got = served.get(f"/api/sweeps/{sid}?since={seq}&sv={sv}")
            spent.append(served.cpu_seconds() - cpu)
            body = decoded(got[3])
            assert not body["full"] and [r[0] for r in body["rows"]] == [name], body["rows"]
            changed.append(got)
            seq, sv = body["seq"], body.get("sv", sv)
            idle.append(served.get(f"/api/sweeps/{sid}?since={seq}&sv={sv}"))
        print(f"update, one experiment ran: CPU {statistics.median(spent) * 1000:.0f} ms (median)")
        mark, read, still = body.get("p", ""), [], []
        running = [r[0] for r in first["rows"] if r[1] == State.RUNNING]
        for i in range(rounds):  # a running experiment's steps so far, replaced as the runner does (no transition)
            name = running[i % len(running)]
            ledger = Ledger.open(directory)
            ledger.measured(name, 1, RunTimes(1.0, 0.1, 10 + i, Interval(100.0 + i, 90.0, 110.0 + i, 8 + i, 2)))
            ledger.close()
            got = served.get(f"/api/sweeps/{sid}?since={seq}&sv={sv}&p={mark}")
            body = decoded(got[3])
            assert [r[0] for r in body["rows"]] == [name], body["rows"]
            read.append(got)
            mark = body["p"]
            still.append(served.get(f"/api/sweeps/{sid}?since={seq}&sv={sv}&p={mark}"))
        # A run's own page, as it polls every second: one experiment, its attempts and their steps.
        pages = [served.get(f"/api/sweeps/{sid}/experiments/{running[i % len(running)]}") for i in range(rounds)]
        assert all(decoded(p[3])["attempts"] for p in pages)
        for label, got in (("update, one experiment ran", changed), ("update, nothing new", idle),
                           ("update, a running experiment's steps so far moved", read),
                           ("update, nothing new, readings followed", still),
                           ("a running experiment's own page", pages)):
            print(f"{label} (median of {len(got)}): server {statistics.median(g[0] for g in got):.1f} ms, "
                  f"wall {statistics.median(g[1] for g in got):.1f} ms, {statistics.median(g[2] for g in got):.0f} B")
    finally:
        served.close()


def poll(port: int, token: str) -> None:
    """As the page does, in a process of its own (a browser's): the sweep's changes every 0.5 s until ended."""
    served = Served.__new__(Served)
    served.port, served.token = port, token
    seq, sv, mark, sid = -1, "", "", None
    while True:
        if sid is None:
            found = decoded(served.get("/api/sweeps")[3])["sweeps"]
            sid = found[0]["id"] if found else None
        else:
            body = decoded(served.get(f"/api/sweeps/{sid}?since={seq}&sv={sv}&p={mark}")[3])
            seq, sv, mark = body["seq"], body.get("sv", sv), body.get("p", "")
        time.sleep(0.5)


def scheduling_round(n: int, seconds: float, slots: int, workdir: Path, dashboard: bool) -> dict[str, float]:
    os.environ["STANDIN_SECONDS"] = str(seconds)
    experiments = tuple(autotuner.Experiment(name=f"e{i:05d}", ds_config={"train_micro_batch_size_per_gpu": 1},
                                             num_gpus=1, num_nodes=1, script=str(STANDIN), source="bench")
                        for i in range(n))
    sweep = autotuner.Sweep(name="bench", experiments=experiments, metric=autotuner.metric_named("throughput"),
                            source="bench")
    root = Path(tempfile.mkdtemp(dir=workdir))
    directory = autotuner.prepare(sweep, autotuner.load_cluster(slots=slots), root / "sweep",
                                  launcher=["sh", str(STANDIN)])
    served = Served(root) if dashboard else None
    poller = subprocess.Popen([sys.executable, __file__, "--poll", str(served.port), served.token]) if served else None
    try:
        cpu = served.cpu_seconds() if served else 0.0
        started = time.perf_counter()
        autotuner.execute(directory, autotuner.Options(grace=1.0))
        wall = time.perf_counter() - started
        used = served.cpu_seconds() - cpu if served else 0.0
    finally:
        if poller:
            poller.terminate()
            poller.wait()
        if served:
            served.close()
    return {"ratio": wall / (n * seconds / slots), "dashboard_cpu_s": used, "wall_s": wall}


# Injected before the page's own scripts: the long tasks, and when plotly.js finished evaluating where an older
# checkout serves it (it ends by setting window.Plotly), so that its one task is told apart from the page's own.
OBSERVER = """
window.__long = [];
new PerformanceObserver((list) => { for (const e of list.getEntries()) window.__long.push([e.startTime, e.duration]); })
  .observe({type: 'longtask'});
let plotly;
Object.defineProperty(window, 'Plotly', {configurable: true, get() { return plotly; },
  set(v) { plotly = v; window.__plotlyAt = performance.now(); }});
"""


Task = tuple[float, float, float]  # start (page ms), wall ms (the longtask entry), CPU ms of the main thread (trace)


class Traced:
    """Chromium's trace of the renderers' main threads, as chromedriver's performance log hands it over."""

    def __init__(self) -> None:
        self.runs: list[tuple[float, float, float]] = []  # (start ms, wall ms, thread ms) of each task over 40 ms
        self.threads: dict[tuple[int, int], str] = {}
        self.offset: float | None = None  # trace ms - page ms, once found

    def read(self, driver: Any) -> None:
        """The trace since the last read taken in (Chromium hands it over late, in chunks)."""
        events = [json.loads(e["message"])["message"] for e in driver.get_log("performance")]
        traced = [e["params"] for e in events if e["method"] == "Tracing.dataCollected"]
        self.threads.update({(t["pid"], t["tid"]): t["args"]["name"] for t in traced if t.get("name") == "thread_name"})
        new = [(t["ts"] / 1000, t["dur"] / 1000, t.get("tdur", 0) / 1000) for t in traced
               if t.get("name", "").endswith("RunTask") and t.get("dur", 0) > 40_000
               and self.threads.get((t["pid"], t["tid"])) == "CrRendererMain"]
        self.runs += new

    def top(self, n: int) -> list[float]:
        """The most CPU ms the n costliest main-thread tasks took, whatever their wall time: no matching."""
        return sorted((cpu for _, _, cpu in self.runs), reverse=True)[:n] + [float("nan")] * n

    def cpu(self, tasks: list[tuple[float, float]]) -> list[Task]:
        """The long tasks with their CPU time: each matched to the traced task of the same length whose start is
        the page's start shifted by the clocks' offset (the offset most matches agree on, to 2 ms)."""
        votes: dict[int, int] = {}
        for s, d in tasks:
            for ts, dur, _ in self.runs:
                if abs(dur - d) < 1.5:
                    votes[round((ts - s) / 2)] = votes.get(round((ts - s) / 2), 0) + 1
        if self.offset is None and votes:
            self.offset = max(votes, key=lambda k: votes[k]) * 2.0
        if self.offset is None:
            return [(s, d, float("nan")) for s, d in tasks]
        offset = self.offset
        found = []
        for s, d in tasks:
            near = [cpu for ts, dur, cpu in self.runs if abs(ts - s - offset) < 5 and abs(dur - d) < 1.5]
            found.append((s, d, near[0] if near else float("nan")))
        return found


def _tasks(driver: Any, since: float) -> tuple[list[tuple[float, float]], float | None]:
    """The long tasks since `since` (page ms) but plotly's own evaluation, and that one's start (if it was seen)."""
    tasks, at = driver.execute_script("return [window.__long, window.__plotlyAt || null]")
    plotly = [s for s, d in tasks if at is not None and s <= at <= s + d]
    return [(s, d) for s, d in tasks if s >= since and not (at is not None and s <= at <= s + d)], \
        (plotly[0] if plotly else None)


def _driver(profile: Path) -> Any:
    """Headless Chromium at 1400 px, as the tests' (dashboard_rig.chromium_driver), tracing its main threads."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 f"--user-data-dir={profile}", "--window-size=1400,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    options.add_experimental_option("perfLoggingPrefs", {"traceCategories": "toplevel", "enableNetwork": False,
                                                         "enablePage": False})
    return webdriver.Chrome(service=Service(shutil.which("chromedriver") or "chromedriver"), options=options)


def _longest(tasks: list[Task]) -> tuple[float, float]:
    """The longest task's wall ms, and the most CPU ms any of the tasks found in the trace took (nan: none found;
    a task of many seconds can be missing from it)."""
    wall = max(tasks, key=lambda t: t[1], default=(0.0, 0.0, 0.0))
    return wall[1], max((t[2] for t in tasks if t[2] == t[2]), default=float("nan") if tasks else 0.0)


def _wait(driver: Any, script: str, timeout: float = 300) -> None:
    end = time.monotonic() + timeout
    while not driver.execute_script(script):
        if time.monotonic() > end:
            raise SystemExit(f"timed out: {script}")
        time.sleep(0.2)


def browser_round(template: Path, code: Path, workdir: Path) -> dict[str, float]:
    """One page of the sweep's plots in a fresh Chromium, served by `code`'s dashboard; its long tasks: the
    longest's wall ms (the browser's longtask entry) and the most CPU ms one took (the trace)."""
    directory = Path(tempfile.mkdtemp(dir=workdir)) / "scale"
    shutil.copytree(template, directory)
    served = Served(directory, code)
    driver = _driver(Path(tempfile.mkdtemp(dir=workdir)) / "profile")
    trace = Traced()
    out: dict[str, float] = {}
    try:
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": OBSERVER})
        driver.get(served.url)
        _wait(driver, "return document.querySelectorAll('#sweeps a').length > 0")
        sid = driver.execute_script("return document.querySelector('#sweeps a').getAttribute('href')")
        since = driver.execute_script("return performance.now()")
        # The sweep's first view, its table (no plots loaded for it), in the same document: one time origin.
        driver.execute_script("location.hash = arguments[0]", sid)
        _wait(driver, "return document.querySelectorAll('#experiments tbody tr').length > 0")
        time.sleep(3)
        trace.read(driver)
        out["view_max"], out["view_cpu"] = _longest(trace.cpu(_tasks(driver, since)[0]))
        out["view_plotly"] = float(driver.execute_script("return window.Plotly ? 1 : 0"))
        # The table sorted by the metric with a click (sorted and drawn in the click's task): the median of 6.
        out["sort_ms"] = statistics.median(driver.execute_script(
            "const t0 = performance.now();"
            "document.querySelector('#experiments th[data-col=\"metric:throughput\"]').click();"
            "return performance.now() - t0") for _ in range(6))
        since = driver.execute_script("return performance.now()")
        driver.execute_script("location.hash = arguments[0]", sid + "/plots")
        _wait(driver, "return document.querySelectorAll('.plot svg.chart, .plot .main-svg').length >= 4")
        time.sleep(3)  # what the drawing leaves to later tasks
        page, plotly_at = _tasks(driver, since)
        trace.read(driver)
        every = trace.cpu(driver.execute_script("return window.__long"))
        evaluated = [t for t in every if t[0] == plotly_at]
        out["plotly_eval"], out["plotly_eval_cpu"] = evaluated[0][1:] if evaluated else (float("nan"),) * 2
        out["first_max"], out["first_cpu"] = _longest(trace.cpu(page))
        redraws: list[Task] = []
        for scheme in ("dark", "light", "dark"):
            since = driver.execute_script("return performance.now()")
            driver.execute_cdp_cmd("Emulation.setEmulatedMedia",
                                   {"features": [{"name": "prefers-color-scheme", "value": scheme}]})
            time.sleep(4)
            trace.read(driver)
            redraws += trace.cpu(_tasks(driver, since)[0])
        out["redraw_max"], out["redraw_cpu"] = _longest(redraws)
        # A live sweep: one experiment started and ended every 0.5 s, as a runner records them.
        ledger = Ledger.open(directory)
        queued = [a.name for a in ledger.latest() if a.state == State.QUEUED]
        ledger.close()
        since = driver.execute_script("return performance.now()")
        started = time.monotonic()
        for name in queued[:20]:
            ledger = Ledger.open(directory)
            ledger.start(name, 1, slots={"localhost": [0]}, tag=f"bench.{name}.1", dir=str(directory / name),
                         at=time.time())
            ledger.finish(name, 1, State.SUCCEEDED, time.time() + 0.01, exit_code=0, metric=4321.0,
                          metrics={"throughput": 4321.0})
            ledger.close()
            time.sleep(max(0.0, started + 0.5 * (queued.index(name) + 1) - time.monotonic()))
        live = _tasks(driver, since)[0]
        window = driver.execute_script("return performance.now()") - since
        trace.read(driver)
        out["live_max"], out["live_cpu"] = _longest(trace.cpu(live))
        out["live_share"] = sum(d for _, d in live) / window
        time.sleep(5)  # the trace's last chunks
        trace.read(driver)
        out["cpu_1st"], out["cpu_2nd"] = trace.top(2)[:2]
    finally:
        driver.quit()
        served.close()
    return out


def browser(n: int, rounds: int, codes: list[Path], workdir: Path) -> None:
    template = workdir / "template"
    template.mkdir()
    counts = build(template, n)
    print(f"sweep of {n}: {', '.join(f'{k} {v}' for k, v in counts.items())}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    results: dict[Path, list[dict[str, float]]] = {c: [] for c in codes}
    for i in range(rounds):
        for code in codes if i % 2 == 0 else codes[::-1]:
            r = browser_round(template, code, workdir)
            results[code].append(r)
            print(f"round {i + 1} {code}: " + "  ".join(f"{k}={v:.0f}" if k != "live_share" else f"{k}={v:.2f}"
                                                        for k, v in r.items())
                  + f"  (load {os.getloadavg()[0]:.1f})", flush=True)
    for code, rs in results.items():  # nan: not found in that round (a CPU figure the trace missed)
        print(f"{code}, median of {len(rs)} (of the rounds that found it, how many in brackets): " + "  ".join(
            f"{k}={_median([r[k] for r in rs]):.{2 if k == 'live_share' else 0}f}"
            f"({sum(r[k] == r[k] for r in rs)})" for k in rs[0]))


def _median(values: list[float]) -> float:
    """The median of the values found (nan: none was)."""
    found = [v for v in values if v == v]
    return statistics.median(found) if found else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiments", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--beside-rounds", type=int, default=3)
    parser.add_argument("--beside", default="500x0.2x8", help="the scheduling sweep: NxSECONDSxSLOTS")
    parser.add_argument("--poll", nargs=2, metavar=("PORT", "TOKEN"), help=argparse.SUPPRESS)
    parser.add_argument("--browser", action="store_true", help="the page's long tasks in Chromium (only that)")
    parser.add_argument("--code", type=Path, action="append", help="--browser: a checkout to serve the page "
                        "(repeatable, interleaved; default this one)")
    opts = parser.parse_args()
    if opts.poll:
        poll(int(opts.poll[0]), opts.poll[1])
        return
    if opts.browser:
        with tempfile.TemporaryDirectory() as tmp:
            browser(opts.experiments, opts.rounds, [c.resolve() for c in opts.code or [ROOT]], Path(tmp))
        return
    with tempfile.TemporaryDirectory() as tmp:
        page_and_updates(opts.experiments, opts.rounds, Path(tmp))
        n, seconds, slots = opts.beside.split("x")
        results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for i in range(opts.beside_rounds):
            for dashboard in ((False, True) if i % 2 == 0 else (True, False)):  # interleaved, order alternating
                r = scheduling_round(int(n), float(seconds), int(slots), Path(tmp), dashboard)
                results[dashboard].append(r)
                print(f"round {i + 1} {'with' if dashboard else 'without'} a dashboard: "
                      + "  ".join(f"{k}={v:.3f}" for k, v in r.items()), flush=True)
        for dashboard, rs in ((d, rs) for d, rs in results.items() if rs):
            print(f"{'with' if dashboard else 'without'} a dashboard, median of {len(rs)}: makespan/ideal "
                  f"{statistics.median(r['ratio'] for r in rs):.3f}"
                  + (f", dashboard CPU {statistics.median(r['dashboard_cpu_s'] for r in rs):.2f} s over "
                     f"{statistics.median(r['wall_s'] for r in rs):.1f} s" if dashboard else ""))


if __name__ == "__main__":
    main()
