"""The dashboard as a user runs it: `autotune dashboard` as a subprocess (its URL and token read from what it
prints), plain HTTP requests to it, stand-in sweeps for it to show, and headless Chromium driven by Selenium
(Debian's chromium and chromium-driver).
"""
from __future__ import annotations

import http.client
import json
import shutil
import signal
import socket
import subprocess
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotuner.dashboard.client import sign_in

from cli_rig import PREAMBLE, WRITE_METRICS, Runners, env, write_launcher, write_sweep

# A stand-in that prints a numbered line to stdout (and one to stderr) every 0.2 s for $STANDIN_SECONDS (1 s by
# default), then writes metrics; an experiment whose name holds "long" runs for $LONG_SECONDS instead, and one
# whose name holds "gate" until the file $GATE exists (a test opens it when it has seen the run running).
TALKING = PREAMBLE + """\
seconds=${STANDIN_SECONDS:-1}
case "$name" in *long*) seconds=${LONG_SECONDS:-60};; esac
i=0
end=$(( $(date +%s) + ${seconds%.*} ))
held() { case "$name" in *gate*) [ ! -e "$GATE" ];; *) false;; esac; }
while [ "$(date +%s)" -lt "$end" ] || [ "$i" -lt 2 ] || held; do
    i=$((i + 1)); echo "step $i of $name"; echo "warning $i" >&2; sleep 0.2
done
""" + WRITE_METRICS


@dataclass
class Dashboard:
    proc: subprocess.Popen
    base: str  # http://127.0.0.1:PORT
    token: str
    printed: list[str]

    @property
    def host_port(self) -> tuple[str, int]:
        parsed = urllib.parse.urlsplit(self.base)
        return parsed.hostname or "127.0.0.1", parsed.port or 80

    def request(self, method: str, path: str, *, token: bool | str = True, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """One real HTTP request; (status, headers, body)."""
        host, port = self.host_port
        connection = http.client.HTTPConnection(host, port, timeout=30)
        sent = dict(headers or {})
        if token:
            sent["X-Autotune-Token"] = self.token if token is True else str(token)
        try:
            connection.request(method, path, body=body, headers=sent)
            response = connection.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            connection.close()

    def json(self, path: str, **options: Any) -> Any:
        status, _, body = self.request("GET", path, **options)
        assert status == 200, (status, body)
        return json.loads(body)

    def sweep_ids(self) -> list[str]:
        return [s["id"] for s in self.json("/api/sweeps")["sweeps"]]

    def raw(self, data: bytes, *, half_close: bool = False) -> tuple[int | None, dict[str, str], bytes]:
        """Bytes sent as they are (a request no client library would send), the answer read to its end:
        (status, headers, body), status None when the server closed without answering."""
        with socket.create_connection(self.host_port, timeout=30) as connection:
            connection.sendall(data)
            if half_close:
                connection.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
        if not answer:
            return None, {}, b""
        head, _, body = answer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        return int(lines[0].split()[1]), headers, body

    def stop(self) -> str:
        """Ctrl-C, as a user ends it; what it wrote on stderr, all of it."""
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=60)
        return str(err)

    def next_link(self) -> str:
        """The link the dashboard printed after the last one was used (each opens the page once)."""
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            assert line, f"the dashboard ended: {self.printed}"
            self.printed.append(line.rstrip("\n"))
            if line.startswith("open "):
                return line.split()[1]


def start_dashboard(runners: Runners, *args: object) -> Dashboard:
    """`autotune dashboard ARGS --port 0`, up and listening: its lines up to the link it prints, whose one-time
    code is traded for the token here (`next_link` reads the link printed next, for a browser)."""
    proc = runners.start("dashboard", *args, "--port", 0)
    printed = []
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"the dashboard ended before printing its URL: {printed} "
                                 f"{proc.stderr.read() if proc.stderr else ''}")
        printed.append(line.rstrip("\n"))
        if line.startswith("open "):
            url = line.split()[1]
            parsed = urllib.parse.urlsplit(url)
            return Dashboard(proc, f"{parsed.scheme}://{parsed.netloc}", sign_in(url)[2], printed)


def stand_in_sweep(directory: Path, values: list[object], *, name: str = "s", slots: int = 2, extra: str = "",
                   runners: Runners, **environ: object) -> tuple[Path, subprocess.Popen]:
    """A stand-in sweep started in the background (the TALKING stand-in); returns its results directory."""
    directory.mkdir(parents=True, exist_ok=True)
    spec = write_sweep(directory, values, name=name, extra=extra)
    launcher = write_launcher(directory, TALKING)
    out = directory / "results" / name
    proc = runners.start("run", spec, "--slots", slots, "--launcher", launcher, "-o", out, "-q",
                         environ=env(LAUNCH_LOG=directory / "launches.log", **environ), directory=out)
    return out, proc


def chromium_driver(profile: Path, width: int = 1280, height: int = 900) -> Any:
    """Headless Chromium through Selenium and Debian's chromium-driver, with a fresh profile."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert browser and driver, "chromium and chromium-driver are needed (.ci/setup-tests installs them)"
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=options)


# Text a renderer of markup would draw as other than itself: markup, a link, a line break, an entity, a template, TeX.
HOSTILE = ('<b>bold</b>', '<a href="https://evil.example/x">link</a>', '<i>it</i><br>x', '&lt;b&gt;ent', '%{x}%{text}',
           '$x^2$', '<span style="font-size:40px">big</span>', 'x' * 3000)


def recorded_sweep(directory: Path, n: int, *, strings: Sequence[str] = (), key: str = "k",
                   hosts: Sequence[str] = ("node1", "node2"), gpu_types: Mapping[str, str] | None = None,
                   detail: str = "torch.OutOfMemoryError: CUDA out of memory", extra_metric: str = "FLOPS_per_gpu",
                   logs: bool = False, metric: str = "throughput") -> Path:
    """A sweep of `n` experiments written straight into a ledger, as a runner would have left it (nothing runs):
    experiment `e{i:05d}` has `a.b` = i * 10 // n (the latest hold the largest, as a sweep ordered by it), the
    micro-batch 2 ** (i % 4) and ZeRO stage i % 3, and `strings[i % len]` under `key`. Every 97th is queued,
    every 31st failed with `detail`, every 211th left running, the others succeeded (their metrics:
    throughput, latency and `extra_metric`). `logs`: each run's directory with empty stdout.log and stderr.log.
    `metric`: the sweep's, as `--metric` names it (its value recorded as each run's metric)."""
    from dataclasses import replace

    from autotuner.ledger.meta import SweepMeta
    from autotuner.ledger.store import Ledger
    from autotuner.spec import Experiment
    from autotuner.states import Reason, State

    directory.mkdir(parents=True, exist_ok=True)
    configs = []
    for i in range(n):
        config: dict[str, object] = {"train_micro_batch_size_per_gpu": 2 ** (i % 4),
                                     "zero_optimization": {"stage": i % 3}, "a": {"b": i * 10 // n}}
        if strings:
            config[key] = strings[i % len(strings)]
        configs.append(config)
    experiments = [Experiment(name=f"e{i:05d}", ds_config=c, num_gpus=1, num_nodes=1, script="/bin/true", args=(),
                              timeout=None, env={}, source="test") for i, c in enumerate(configs)]
    meta = SweepMeta(name=directory.name, metric=metric, sweep_id="sid", launcher=("deepspeed",),
                     slots={h: (0, 1, 2, 3) for h in hosts}, gpu_types=dict(gpu_types) if gpu_types else None)
    ledger = Ledger.create(directory, replace(meta, created=1.0e9))
    ledger._db.execute("PRAGMA synchronous=OFF")  # setting up is not what is tested: no fsync per transition
    ledger.add_experiments(experiments, at=1.0e9)
    for i, e in enumerate(experiments):
        if i % 97 == 5:
            continue
        at = 1.0e9 + i * 0.2
        run = directory / e.name
        if logs:
            run.mkdir()
            (run / "stdout.log").write_text("")
            (run / "stderr.log").write_text("")
        ledger.start(e.name, 1, slots={hosts[i % len(hosts)]: [(i // len(hosts)) % 4]}, tag=f"sid.{e.name}.1",
                     dir=str(run), at=at)
        ledger.launched(e.name, 1, pid=1, port=29500, at=at + 0.01)
        if i % 211 == 7:
            continue
        if i % 31 == 4:
            ledger.finish(e.name, 1, State.FAILED, at + 0.5, reason=Reason.OOM, exit_code=1, detail=detail)
        else:
            value = 1000.0 + (i * 7919) % 5000
            metrics = {"throughput": value, "latency": 1.0 / value, extra_metric: value * 1e9}
            ledger.finish(e.name, 1, State.SUCCEEDED, at + 1.4, exit_code=0, metrics=metrics,
                          metric=metrics[metric.partition(":")[0]])
    ledger.close()
    return directory
