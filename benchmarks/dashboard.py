"""`autotune dashboard` on the 10,000-experiment sweep of benchmarks/scale.py, and beside a running sweep.

  page     the first load of a sweep's page: the page, its script and plotly.js, then the sweep's first answer
           (every row, the summary), cold (the dashboard's first read of the ledger) and warm; server time (the
           app's, from its Server-Timing header, before compression), wall time at the client, bytes as sent
           (gzip) and raw
  update   what the page asks every 0.5 s: "what changed since transition N", after one experiment started and
           another ended (as a runner records them), and with nothing new
  beside   the scheduling benchmark (N x S s on K slots, benchmarks/scheduling.py's round) with a dashboard
           open (a client polling as the page does, in a process of its own) against without, interleaved:
           makespan / ideal both ways, and the dashboard's own CPU time

  python benchmarks/dashboard.py --experiments 10000 --rounds 5 --beside-rounds 3
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
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

STANDIN = ROOT / "benchmarks" / "standin.sh"


class Served:
    """`autotune dashboard DIR --port 0` as a subprocess, and requests to it."""

    def __init__(self, directory: Path):
        self.proc = subprocess.Popen([sys.executable, "-m", "autotuner", "dashboard", str(directory), "--port", "0"],
                                     stdout=subprocess.PIPE, text=True, cwd=ROOT)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("open "):
                _, self.port, self.token = sign_in(line.split()[1])  # the link's one-time code traded
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
        assets = [served.get(p)[2] for p in ("/", "/static/app.js", "/static/app.css", "/static/plotly.min.js")]
        print(f"page assets (gzip): {sum(assets) / 1e6:.2f} MB, of which plotly.min.js {assets[-1] / 1e6:.2f} MB")
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
        for label, got in (("update, one experiment ran", changed), ("update, nothing new", idle)):
            print(f"{label} (median of {len(got)}): server {statistics.median(g[0] for g in got):.1f} ms, "
                  f"wall {statistics.median(g[1] for g in got):.1f} ms, {statistics.median(g[2] for g in got):.0f} B")
    finally:
        served.close()


def poll(port: int, token: str) -> None:
    """As the page does, in a process of its own (a browser's): the sweep's changes every 0.5 s until ended."""
    served = Served.__new__(Served)
    served.port, served.token = port, token
    seq, sv, sid = -1, "", None
    while True:
        if sid is None:
            found = decoded(served.get("/api/sweeps")[3])["sweeps"]
            sid = found[0]["id"] if found else None
        else:
            body = decoded(served.get(f"/api/sweeps/{sid}?since={seq}&sv={sv}")[3])
            seq, sv = body["seq"], body.get("sv", sv)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiments", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--beside-rounds", type=int, default=3)
    parser.add_argument("--beside", default="500x0.2x8", help="the scheduling sweep: NxSECONDSxSLOTS")
    parser.add_argument("--poll", nargs=2, metavar=("PORT", "TOKEN"), help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.poll:
        poll(int(opts.poll[0]), opts.poll[1])
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
