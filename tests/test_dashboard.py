"""`autotune dashboard` over real HTTP: the token, files kept inside the sweep, malformed requests, cancel's
guards, what an update carries, and that the dashboard writes nothing into a sweep. The browser's view is in
test_dashboard_browser.py.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
from dataclasses import replace

import pytest

from autotuner.dashboard.eta import Planner, planned_end
from autotuner.dashboard.feed import COLUMNS, PROBED, SweepFeed, read_only, runner_pid
from autotuner.dashboard.summary import standing
from autotuner.ledger.lock import SweepLock
from autotuner.ledger.store import Ledger
from autotuner.states import Reason, State
from autotuner.views.live import LiveView
from autotuner.views.snapshot import Snapshot, snapshot

from cli_rig import SLEEP_THEN_SUCCEED, Runners, autotune, env, wait_until, write_launcher, write_sweep
from dashboard_rig import start_dashboard
from helpers import SWEEP_META, experiment


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A stand-in sweep of four experiments, run to its end."""
    base = tmp_path_factory.mktemp("finished")
    spec = write_sweep(base, [1, 2, 4, 8], name="done")
    launcher = write_launcher(base, SLEEP_THEN_SUCCEED)
    out = base / "results" / "done"
    ran = autotune("run", spec, "--slots", 2, "--launcher", launcher, "-o", out, "-q",
                   environ=env(LAUNCH_LOG=base / "launches.log", STANDIN_SECONDS=0.05))
    assert ran.returncode == 0, ran.stderr
    return out


@pytest.fixture(scope="module")
def served(finished):
    """A dashboard of the finished sweep's folder (no --allow-cancel)."""
    runners = Runners()
    try:
        yield start_dashboard(runners, finished.parent)
    finally:
        runners.cleanup()


def test_every_api_request_needs_the_token(served):
    (sid,) = served.sweep_ids()
    for path in ("/api/sweeps", f"/api/sweeps/{sid}", f"/api/sweeps/{sid}/file?path=summary.txt", "/api/config"):
        for token in (False, "wrong", served.token[:-1]):
            status, _, body = served.request("GET", path, token=token)
            assert status == 403, (path, token, status)
            assert b"token" in body
        assert served.request("GET", path)[0] == 200
    assert served.request("GET", "/")[0] == 200  # the page itself holds nothing: it asks for the token


def test_the_page_and_its_charts_come_from_the_server_itself(served):
    status, _, page = served.request("GET", "/", token=False)
    assert status == 200
    assert b'src="/static/app.js"' in page and b"://" not in page.replace(b"http://", b"")
    # The plots (the page's own SVG, no chart library) are loaded when its plots tab is first opened, from the
    # server too; nothing else is served.
    status, _, app = served.request("GET", "/static/app.js", token=False, headers={"Accept-Encoding": "identity"})
    assert status == 200 and b'"/static/chart.js", "/static/plots.js"' in app and b"://" not in app
    for name in ("chart.js", "plots.js"):
        status, _, js = served.request("GET", f"/static/{name}", token=False, headers={"Accept-Encoding": "identity"})
        assert status == 200 and b"://" not in js.replace(b"http://www.w3.org/2000/svg", b"")
    assert served.request("GET", "/static/plotly.min.js", token=False)[0] == 404
    for name in ("../server.py", "..%2Fserver.py", "index.html", "server.py"):
        assert served.request("GET", f"/static/{name}", token=False)[0] == 404


def test_no_url_reaches_a_file_outside_the_sweep(served, finished, tmp_path):
    (sid,) = served.sweep_ids()
    secret = tmp_path / "secret.txt"
    secret.write_text("not the sweep's\n")
    (finished / "link_out").symlink_to(secret)
    (finished / "dir_out").symlink_to(tmp_path, target_is_directory=True)
    (finished / "link_in").symlink_to(finished / "summary.txt")
    os.mkfifo(finished / "fifo")
    try:
        def get(path: str) -> tuple[int, bytes]:
            status, _, body = served.request("GET", f"/api/sweeps/{sid}/file?path={path}")
            return status, body

        status, body = get("summary.txt")
        assert status == 200 and b"Tuning completed" in body
        assert get("link_in") == (200, body)  # a symlink that stays inside is a file of the sweep
        assert get("done_x1/stdout.log")[0] == 200
        for path in ("../../secret.txt", "..%2F..%2Fsecret.txt", "done_x1/../../" + finished.parent.name,
                     "%2e%2e/%2e%2e/" + tmp_path.name + "/secret.txt", str(secret), "/etc/passwd",
                     "%2Fetc%2Fpasswd", "link_out", "dir_out/secret.txt"):
            status, body = get(path)
            assert status == 403, (path, status, body)
            assert b"not the sweep's" not in body and b"root:" not in body
        for path in ("fifo", "done_x1", "nope.txt", "", "a%00b", "..\\secret.txt"):
            assert get(path)[0] in (400, 404), path
    finally:
        for name in ("link_out", "dir_out", "link_in", "fifo"):
            (finished / name).unlink()


def test_malformed_requests_are_answered_4xx_and_the_server_lives_on(served):
    (sid,) = served.sweep_ids()
    assert served.request("GET", f"/api/sweeps/{sid}?since=abc")[0] == 400
    assert served.request("GET", f"/api/sweeps/{sid}/file?path=summary.txt&offset=x")[0] == 400
    assert served.request("GET", "/api/sweeps/nosuchsweep")[0] == 404
    assert served.request("GET", f"/api/sweeps/{sid}/experiments/nosuch")[0] == 404
    assert served.request("GET", "/api/compare?a=" + sid)[0] == 404
    assert served.request("GET", "/no/such/page")[0] == 404
    assert served.request("GET", f"/api/sweeps/{sid}/cancel")[0] == 405
    host, port = served.host_port
    for garbage in (b"\x00\x01\x02 nonsense\r\n\r\n", b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n",
                    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n"):
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(garbage)
            answer = s.recv(100)
            assert answer == b"" or answer.split()[1].startswith(b"4"), answer
    assert served.request("GET", "/api/sweeps")[0] == 200
    assert served.proc.poll() is None


def test_cancel_is_off_unless_allowed_and_needs_the_token_json_and_our_origin(served, finished, runners):
    (sid,) = served.sweep_ids()
    body = json.dumps({"names": []}).encode()
    headers = {"Content-Type": "application/json"}
    status, _, answer = served.request("POST", f"/api/sweeps/{sid}/cancel", body=body, headers=headers)
    assert status == 403 and b"--allow-cancel" in answer

    allowed = start_dashboard(runners, finished, "--allow-cancel")
    path = f"/api/sweeps/{sid}/cancel"
    host = "{}:{}".format(*allowed.host_port)
    assert allowed.request("POST", path, body=body, headers=headers, token=False)[0] == 403
    assert allowed.request("POST", path, body=body, headers=headers | {"Origin": "http://evil.example"})[0] == 403
    assert allowed.request("POST", path, body=body, headers={"Content-Type": "text/plain"})[0] == 415
    assert allowed.request("POST", path, body=b"{nope", headers=headers)[0] == 400
    assert allowed.request("POST", path, body=b'{"names": [1]}', headers=headers)[0] == 400
    assert allowed.request("POST", path, body=b"x" * 100_000, headers=headers)[0] == 413
    status, _, answer = allowed.request("POST", path, body=b'{"names": ["nope"]}', headers=headers)
    assert status == 409 and b"no experiment named nope" in answer
    # From its own page (same origin), with the token: done as `autotune cancel` does it (nothing left to cancel).
    status, _, answer = allowed.request("POST", path, body=body, headers=headers | {"Origin": f"http://{host}"})
    assert status == 200, answer
    assert json.loads(answer)["cancelled"] == []


def test_the_dashboard_writes_nothing_into_a_sweep(served, finished):
    def state() -> tuple[list[str], str]:
        return (sorted(str(p.relative_to(finished)) for p in finished.rglob("*")),
                hashlib.sha256((finished / "ledger.sqlite").read_bytes()).hexdigest())

    before = state()
    (sid,) = served.sweep_ids()
    for _ in range(3):
        served.json(f"/api/sweeps/{sid}?since=-1")
        served.json(f"/api/sweeps/{sid}/experiments/done_x1")
        served.json("/api/sweeps")
    assert state() == before
    with read_only(finished) as reader, pytest.raises(sqlite3.OperationalError, match=r"readonly|read-only"):
        reader.db.execute("DELETE FROM meta")


def test_an_update_carries_only_the_experiments_that_moved(tmp_path):
    ledger = Ledger.create(tmp_path, SWEEP_META)
    ledger.add_experiments([experiment(f"e{i}", ds_config={"train_micro_batch_size_per_gpu": 2 ** i})
                            for i in range(5)], at=1.0)
    feed = SweepFeed(tmp_path)
    assert feed.refresh()
    first = feed.changes(-1)
    assert first.full and [r[0] for r in first.rows] == [f"e{i}" for i in range(5)]
    assert "param:train_micro_batch_size_per_gpu" in first.columns
    assert not feed.refresh()  # nothing new: not even a row decoded
    assert feed.changes(first.seq).rows == []

    ledger.start("e3", 1, slots={"localhost": [0]}, tag="t", dir=str(tmp_path / "e3"), at=2.0)
    assert feed.refresh()
    moved = feed.changes(first.seq)
    assert not moved.full and [(r[0], r[1]) for r in moved.rows] == [("e3", State.RUNNING)]
    ledger.finish("e3", 1, State.SUCCEEDED, 3.0, metric=5.0, metrics={"throughput": 5.0})
    ledger.finish("e1", 1, State.CANCELLED, 3.0)
    feed.refresh()
    later = feed.changes(moved.seq)
    assert not later.full and sorted(r[0] for r in later.rows) == ["e1", "e3"]
    assert "metric:throughput" in later.columns
    ledger.finish("e0", 1, State.CANCELLED, 4.0)
    feed.refresh()
    assert [r[0] for r in feed.changes(later.seq).rows] == ["e0"]
    # A metric no run had before is a new column: a page that saw `later` is sent every row again.
    ledger.start("e2", 1, slots={"localhost": [0]}, tag="t2", dir=str(tmp_path / "e2"), at=5.0)
    ledger.finish("e2", 1, State.SUCCEEDED, 6.0, metric=4.0, metrics={"throughput": 4.0, "latency": 0.25})
    feed.refresh()
    again = feed.changes(later.seq)
    assert again.full and len(again.rows) == 5 and "metric:latency" in again.columns
    assert feed.snapshot().best is not None and feed.snapshot().best.name == "e3"
    ledger.close()


def test_the_runner_is_found_without_taking_its_lock(tmp_path):
    Ledger.create(tmp_path, SWEEP_META).close()
    assert runner_pid(tmp_path) is None
    lock = SweepLock(tmp_path).acquire()
    try:
        assert runner_pid(tmp_path) == os.getpid()
    finally:
        lock.release()
    assert runner_pid(tmp_path) is None


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args in (("dashboard", tmp_path / "nope"), ("dashboard", tmp_path, "--port", "70000")):
        done = autotune(*args)
        assert done.returncode == 2, done
        assert "Traceback" not in done.stderr and done.stdout == ""
    done = autotune("dashboard", tmp_path / "nope")
    assert done.stderr.strip().count("\n") == 0 and "nope: no such directory" in done.stderr
    with socket.create_server(("127.0.0.1", 0)) as taken:  # a port another program listens on
        done = autotune("dashboard", tmp_path, "--port", taken.getsockname()[1])
    assert done.returncode == 2 and "cannot listen on 127.0.0.1" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("host", ["", " "])
def test_an_empty_host_is_refused_not_served_on_every_interface(tmp_path, host):
    """`--host ''` bound every interface and printed http://:8765/ as the URL to open (found by a hostile
    tester): refused in one line, before anything listens."""
    done = autotune("dashboard", tmp_path, "--host", host, "--port", "0", timeout=30)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.strip() == f"autotune: error: --host {host!r}: name the address to listen on (127.0.0.1, or " \
                                  "0.0.0.0 for every interface)"


def test_binding_beyond_loopback_says_what_that_means(finished, runners):
    shown = start_dashboard(runners, finished, "--host", "0.0.0.0")
    assert any("anyone who can reach this machine" in line for line in shown.printed)
    assert shown.request("GET", "/api/sweeps")[0] == 200


def test_the_command_line_does_not_import_the_web_stack():
    code = ("import sys, autotuner.cli; bad = [m for m in ('starlette', 'uvicorn', 'autotuner.dashboard') "
            "if m in sys.modules]; print(bad)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_new_sweeps_appear_and_two_are_compared(tmp_path, runners):
    results = tmp_path / "results"
    results.mkdir()
    shown = start_dashboard(runners, results)
    assert shown.json("/api/sweeps")["sweeps"] == []
    launcher = write_launcher(tmp_path, SLEEP_THEN_SUCCEED)
    for name in ("first", "second"):  # the same experiment names: a pair each
        (tmp_path / name).mkdir()
        spec = write_sweep(tmp_path / name, [1, 2, 4], name="pair")
        ran = autotune("run", spec, "--slots", 2, "--launcher", launcher, "-o", results / name, "-q",
                       environ=env(LAUNCH_LOG=tmp_path / "launches.log", STANDIN_SECONDS=0.05))
        assert ran.returncode == 0, ran.stderr
    listed = shown.json("/api/sweeps")["sweeps"]
    assert sorted(s["directory"] for s in listed) == ["results/first", "results/second"]
    assert all(s["counts"] == {"succeeded": 3} and s["runner"] is None for s in listed)
    ids = {s["directory"].split("/")[-1]: s["id"] for s in listed}
    compared = shown.json(f"/api/compare?a={ids['first']}&b={ids['second']}")
    assert [r["name"] for r in compared["rows"]] == ["pair_x1", "pair_x2", "pair_x4"]
    # The stand-ins' throughput is a function of the name alone: each pair is the same, B / A is 1.
    assert all(r["ratio"] == 1.0 and r["verdict"] == "same" for r in compared["rows"])
    assert compared["only_a"] == compared["only_b"] == []


def test_the_eta_is_the_terminals(tmp_path):
    """The page's ETA is the live view's: the same re-plan of what waits and runs, at the same instant."""
    ledger = Ledger.create(tmp_path, SWEEP_META)
    ledger.add_experiments([experiment(f"e{i}") for i in range(8)], at=0.0)
    for i in range(3):  # three ended, after 10, 20 and 30 s; one runs since t=95; four wait
        ledger.start(f"e{i}", 1, slots={"localhost": [0]}, tag=f"t{i}", dir=str(tmp_path / f"e{i}"), at=10.0 * i)
        ledger.finish(f"e{i}", 1, State.SUCCEEDED, 10.0 * i + 10 * (i + 1), metric=1.0, metrics={"throughput": 1.0})
    ledger.start("e3", 1, slots={"localhost": [0]}, tag="t3", dir=str(tmp_path / "e3"), at=95.0)
    ledger.close()
    now = 100.0
    snap = snapshot(tmp_path)
    terminal = LiveView(snap, clock=lambda: now).state().planned_end
    assert terminal is not None and terminal > now
    assert planned_end(snap, (), now) == terminal

    planner = Planner()
    try:
        feed = SweepFeed(tmp_path)
        feed.refresh()
        ours = feed.snapshot()  # the feed's own read model: only the experiments that wait or run are built
        plan = wait_until(lambda: planner.end(ours, feed.seq, set(), now), message="a plan")
        assert plan.end == terminal
    finally:
        planner.close()


def test_without_the_extra_the_command_says_what_to_install(tmp_path):
    code = ("import sys; sys.modules['uvicorn'] = None\n"  # as if the dashboard extra were not installed
            "from autotuner.cli import main\n"
            f"sys.argv = ['autotune', 'dashboard', {str(tmp_path)!r}]\n"
            "main()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "pip install 'ds-autotune[dashboard]'" in done.stderr and done.stderr.count("\n") == 1


def test_per_gpu_type_bests_and_lost_nodes(tmp_path):
    meta = replace(SWEEP_META, slots={"a": (0, 1), "b": (0,)}, gpu_types={"a": "A100", "b": "H100"})
    ledger = Ledger.create(tmp_path, meta)
    ledger.add_experiments([experiment(f"e{i}") for i in range(5)], at=0.0)
    for i, (host, value) in enumerate((("a", 5.0), ("a", 7.0), ("b", 3.0))):
        ledger.start(f"e{i}", 1, slots={host: [0]}, tag=f"t{i}", dir=str(tmp_path / f"e{i}"), at=1.0)
        ledger.finish(f"e{i}", 1, State.SUCCEEDED, 2.0, metric=value, metrics={"throughput": value})
    ledger.start("e3", 1, slots={"b": [0]}, tag="t3", dir=str(tmp_path / "e3"), at=3.0)
    ledger.finish("e3", 1, State.FAILED, 4.0, reason=Reason.LOST, detail="host b stopped answering")
    ledger.start("e4", 1, slots={"a": [1]}, tag="t4", dir=str(tmp_path / "e4"), at=5.0)
    ledger.close()
    feed = SweepFeed(tmp_path)
    feed.refresh()
    snap = feed.snapshot()
    made = standing(snap, "id", tmp_path.parent)
    assert [(b["gpu_type"], b["name"], b["value"]) for b in made["best"]] == [("A100", "e1", 7.0), ("H100", "e2", 3.0)]
    assert all(b["config"] is not None and "--deepspeed_config" in b["command"] for b in made["best"])
    assert made["types"] == ["A100", "H100"] and made["lost"] == ["b"]
    nodes = {n["host"]: n for n in made["nodes"]}
    assert nodes["b"]["lost"] and not nodes["a"]["lost"]
    assert [s["run"] for s in nodes["a"]["slots"]] == [None, "e4"]
    rows = {r[0]: r for r in feed.changes(-1).rows}
    assert rows["e1"][COLUMNS.index("gpu_type")] == "A100" and rows["e2"][COLUMNS.index("gpu_type")] == "H100"


def test_a_page_further_behind_than_the_reads_kept_gets_every_row(tmp_path, monkeypatch):
    monkeypatch.setattr("autotuner.dashboard.feed.KEPT_READS", 4)
    ledger = Ledger.create(tmp_path, SWEEP_META)
    ledger.add_experiments([experiment(f"e{i}") for i in range(6)], at=0.0)
    feed = SweepFeed(tmp_path)
    feed.refresh()
    seen = [feed.seq]
    for i in range(6):
        ledger.finish(f"e{i}", 1, State.CANCELLED, 1.0 + i)
        feed.refresh()
        seen.append(feed.seq)
    ledger.close()
    assert feed.changes(seen[0]).full  # its reads were let go
    recent = feed.changes(seen[-2])
    assert not recent.full and [r[0] for r in recent.rows] == ["e5"]


def test_what_the_feed_shares_between_its_two_snapshots_is_what_a_snapshot_caches():
    """`SweepFeed.snapshot` copies the probe's ranking and types (every cached property of a Snapshot: none
    needs its experiments): one renamed or added must be named in PROBED, or the second snapshot works it out
    again."""
    cached = {name for name, value in vars(Snapshot).items() if isinstance(value, functools.cached_property)}
    assert set(PROBED) == cached
