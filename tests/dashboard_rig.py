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
