"""`autotune dashboard` against hostile HTTP, over real sockets on loopback: every answer carries the security
headers, only the names the server was started for are served (DNS rebinding), a request that breaks off or
makes no sense is a 4xx or a closed connection and never a traceback, the printed link answers whatever
`--host` was, and a link opens the page once.
"""
from __future__ import annotations

import json

import pytest

from autotuner.dashboard.client import sign_in
from autotuner.dashboard.files import Refused, read_piece

from cli_rig import SLEEP_THEN_SUCCEED, Runners, autotune, env, write_launcher, write_sweep
from dashboard_rig import start_dashboard

SECURITY = {"x-frame-options": "DENY", "x-content-type-options": "nosniff", "referrer-policy": "no-referrer"}


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
    """A dashboard of the finished sweep, with --allow-cancel (the cancel path is the one with a body)."""
    runners = Runners()
    try:
        yield start_dashboard(runners, finished, "--allow-cancel")
    finally:
        runners.cleanup()


def _secured(headers: dict[str, str]) -> bool:
    csp = headers.get("content-security-policy", "")
    return all(headers.get(k) == v for k, v in SECURITY.items()) and "frame-ancestors 'none'" in csp and \
        "script-src 'self'" in csp and "default-src 'none'" in csp


def test_every_answer_carries_the_security_headers(served):
    (sid,) = served.sweep_ids()
    host = "{}:{}".format(*served.host_port)
    json_post = {"Content-Type": "application/json"}
    asked = [  # (method, path, options, the status expected)
        ("GET", "/", {"token": False}, 200),
        ("HEAD", "/", {"token": False}, 200),
        ("GET", "/static/app.js", {"token": False}, 200),
        ("GET", "/static/app.css", {"token": False}, 200),
        ("GET", "/static/plots.js", {"token": False, "headers": {"Accept-Encoding": "gzip"}}, 200),
        ("GET", "/static/nope.js", {"token": False}, 404),
        ("GET", "/api/sweeps", {}, 200),
        ("GET", f"/api/sweeps/{sid}", {}, 200),
        ("GET", f"/api/sweeps/{sid}/file?path=summary.txt", {}, 200),
        ("GET", "/api/sweeps", {"token": False}, 403),
        ("GET", f"/api/sweeps/{sid}?since=x", {}, 400),
        ("GET", "/api/sweeps/nope", {}, 404),
        ("GET", "/no/such/page", {"token": False}, 404),
        ("PUT", "/", {"token": False}, 405),
        ("POST", f"/api/sweeps/{sid}/cancel", {"body": b"{", "headers": json_post}, 400),
        ("POST", f"/api/sweeps/{sid}/cancel", {"body": b"x" * 100_000, "headers": json_post}, 413),
        ("POST", f"/api/sweeps/{sid}/cancel", {"body": b"{}", "headers": {"Content-Type": "text/plain"}}, 415),
        ("POST", "/api/session", {"token": False, "headers": {"X-Autotune-Code": "spent"}}, 403),
        ("GET", "/", {"token": False, "headers": {"Host": "evil.example"}}, 421),
        ("GET", "/api/config", {"headers": {"Origin": "http://evil.example"}}, 403),
        ("GET", "/api/config", {"headers": {"Origin": f"http://{host}"}}, 200),
    ]
    for method, path, options, status in asked:
        got, headers, _ = served.request(method, path, **options)
        assert got == status, (method, path, got)
        assert _secured(headers), (method, path, headers)
    # The API's answers are not kept by the browser's cache.
    assert served.request("GET", "/api/sweeps")[1]["cache-control"] == "no-store"


def test_only_the_names_the_server_was_started_for_are_served(served, finished):
    """A DNS rebinding attack sends its own name as Host (and as Origin, from its page): refused whatever the
    token, and the answer holds nothing of the sweeps."""
    (sid,) = served.sweep_ids()
    _, port = served.host_port
    ours = [f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}", f"[0:0::1]:{port}"]
    foreign = [f"evil.example:{port}", "evil.example", f"127.0.0.1:{port + 1 if port < 65535 else 1}",
               "127.0.0.1", f"127.1:{port}", f"localhost.:{port}", f"a@127.0.0.1:{port}", f"127.0.0.1:+{port}",
               f"127.0.0.1:{port}0", f"[::1]:{port + 1 if port < 65535 else 1}", f"[127.0.0.1]:{port}", "",
               f"{'a' * 5000}:{port}", f"localhost:{port}/x"]
    for name in ours:
        assert served.request("GET", "/api/sweeps", headers={"Host": name})[0] == 200, name
    for name in foreign:
        status, headers, body = served.request("GET", "/api/sweeps", headers={"Host": name})
        assert status == 421 and finished.name.encode() not in body and b"done_x" not in body, (name, status)
        assert _secured(headers)
    raw = [b"GET /api/sweeps HTTP/1.0\r\nX-Autotune-Token: %s\r\n\r\n" % served.token.encode(),  # no Host
           b"GET / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nHost: evil.example:%d\r\nConnection: close\r\n\r\n" % (port, port)]
    for data in raw:
        status, _, body = served.raw(data)
        assert status is not None and 400 <= status < 500 and b"done_x" not in body, (data, status)

    # The Origin is compared with the names served, not with the request's own Host.
    cancel = f"/api/sweeps/{sid}/cancel"
    body = json.dumps({"names": []}).encode()
    sent = {"Content-Type": "application/json"}
    rebound = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
    assert served.request("POST", cancel, body=body, headers=sent | rebound)[0] == 421
    for origin in (f"http://evil.example:{port}", "null", f"https://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}",
                   "http://127.0.0.1", f"http://127.0.0.1:{port}/", f"ftp://127.0.0.1:{port}"):
        assert served.request("POST", cancel, body=body, headers=sent | {"Origin": origin})[0] == 403, origin
    for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
        assert served.request("POST", cancel, body=body, headers=sent | {"Origin": origin})[0] == 200, origin
    # Another site's page, as the browser itself says (a page on another port of this host is "same-site").
    for site in ("same-site", "cross-site"):
        assert served.request("GET", "/api/sweeps", headers={"Sec-Fetch-Site": site})[0] == 403
    assert served.request("GET", "/api/sweeps", headers={"Sec-Fetch-Site": "same-origin"})[0] == 200


def test_broken_and_hostile_requests_are_answered_without_a_traceback(finished, runners):
    """A body shorter than its Content-Length or broken chunks put a 45-line ClientDisconnect traceback in the
    terminal (found by a security review). Every class of hostile request here: a 4xx or a closed connection,
    the server alive, and nothing at all on its stderr."""
    served = start_dashboard(runners, finished, "--allow-cancel")
    (sid,) = served.sweep_ids()
    _, port = served.host_port
    host, token = f"127.0.0.1:{port}".encode(), served.token.encode()
    cancel = b"POST /api/sweeps/%s/cancel HTTP/1.1\r\nHost: %s\r\nX-Autotune-Token: %s\r\n" \
             b"Content-Type: application/json\r\n" % (sid.encode(), host, token)
    get = b"Host: %s\r\nX-Autotune-Token: %s\r\nConnection: close\r\n\r\n" % (host, token)
    broken = [  # (bytes, whether the client then stops sending)
        (cancel + b"Content-Length: 100\r\n\r\n{\"na", True),  # shorter than its length
        (cancel + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n", False),  # not a chunk size
        (cancel + b"Transfer-Encoding: chunked\r\n\r\n5\r\nab", True),  # a chunk cut short
        (cancel + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", True),  # both (smuggling)
        (cancel + b"Content-Length: 99999999999999999999\r\n\r\n", False),  # a length past any bound
        (cancel + b"Content-Length: 60000\r\nConnection: close\r\n\r\n" + b"[" * 30000 + b"]" * 30000, False),
        (cancel + b"Content-Length: 16\r\nConnection: close\r\n\r\n{\"names\": [NaN]}", False),
        (cancel + b"Content-Length: 7\r\nConnection: close\r\n\r\n\xff\xfe{}\x00\x00\x00", False),  # not UTF-8
        (b"\x00\x01\x02 nonsense\r\n\r\n", False),
        (b"FOO\x01 / HTTP/1.1\r\n" + get, False),  # a method with a control character
        (b"get / HTTP/1.1\r\n" + get, False),
        (b"TRACE / HTTP/1.1\r\n" + get, False),
        (b"OPTIONS * HTTP/1.1\r\n" + get, False),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", False),  # HTTP/2's preface
        (b"GET http://evil.example/api/config HTTP/1.1\r\n" + get, False),  # absolute form
        (b"GET /api/sweeps/%ff%fe HTTP/1.1\r\n" + get, False),  # not UTF-8 once decoded
        (b"GET /api/sweeps/" + sid.encode() + b"/experiments/%ff%00 HTTP/1.1\r\n" + get, False),
        (b"GET /api/sweeps/" + sid.encode() + b"/file?path=%ff&offset=-99999999999999999999 HTTP/1.1\r\n" + get, False),
        (b"GET /api/sweeps/" + sid.encode() + b"?since=" + b"9" * 5000 + b" HTTP/1.1\r\n" + get, False),
        (b"GET /api/sweeps/%zz?since=%zz&since=1 HTTP/1.1\r\n" + get, False),  # bad percent-encoding
        (b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n" + get, False),
        (b"GET / HTTP/1.1\r\nX-A: " + b"x" * 100_000 + b"\r\n" + get, False),  # a huge header
        (b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(3000)) + get, False),
        (b"GET /api/sweeps HTTP/1.1\r\nX-Autotune-Token: \xff\xfe\x00\r\nHost: %s\r\nConnection: close\r\n\r\n" % host,
         False),
        (b"GET /static/app.js HTTP/1.1\r\nRange: bytes=50-10\r\n" + get, False),  # a range backwards
        (b"GET /static/app.js HTTP/1.1\r\nRange: bytes=abc\r\n" + get, False),
        (b"GET /static/app.js HTTP/1.1\r\nRange: bytes=" + b",".join(b"%d-%d" % (i, i) for i in range(0, 4000, 2))
         + b"\r\n" + get, False),
        (b"GET /static/..%2f..%2fserver.py HTTP/1.1\r\n" + get, False),
        (b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade, close\r\nSec-WebSocket-Version: 13\r\n"
         b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nHost: %s\r\n\r\n" % host, False),
        (b"POST /api/session HTTP/1.1\r\nX-Autotune-Code: " + b"c" * 10_000 + b"\r\nContent-Length: 0\r\n" + get,
         False),
    ]
    for data, stops in broken:
        status, _, _ = served.raw(data, half_close=stops)
        assert status is None or status < 500, (data[:80], status)
    assert served.request("GET", "/api/sweeps")[0] == 200 and served.proc.poll() is None
    err = served.stop()
    assert err.strip() == "autotune: interrupted", err[-3000:]


def test_a_file_gone_between_the_look_and_the_read_is_a_404(tmp_path):
    """A run's log removed after `inside` found it (a directory cleaned) was a 500 and an error line."""
    with pytest.raises(Refused) as refused:
        read_piece(tmp_path / "gone.log", 0)
    assert refused.value.status == 404


@pytest.mark.parametrize("host", ["::", "0.0.0.0", "::1", "[::1]", "localhost", "127.0.0.1"])
def test_the_printed_link_answers_whatever_the_host(finished, runners, host):
    """`--host ::` printed http://127.0.0.1:PORT/, which refused connections (the socket was IPv6 only); `[::1]`
    was refused as an address. The rig signs in with the link printed: it answered."""
    served = start_dashboard(runners, finished, "--host", host)
    assert served.sweep_ids()
    link = served.next_link()
    assert link.startswith(served.base + "/#code=")
    _, port = served.host_port
    if host == "::":  # both families, as the link's 127.0.0.1 and a browser's [::1] reach it
        for address in (f"127.0.0.1:{port}", f"[::1]:{port}"):
            assert sign_in(f"http://{address}/#code={link.split('=')[1]}")[2] == served.token
            link = served.next_link()


@pytest.mark.parametrize("host", ["a" * 5000, "a..b", "http://127.0.0.1", "127.0.0.1:8080", "nosuch.invalid",
                                  "[::1", "::1]", " 127.0.0.1", "999.1.1.1", "::ffff:999.1.1.1", "a\tb", "-x",
                                  "ünï.invalid"], ids=lambda host: repr(host[:20]))
def test_a_bad_host_is_one_line_and_exit_2(tmp_path, host):
    done = autotune("dashboard", tmp_path, "--host", host, "--port", "0", timeout=60)
    assert done.returncode == 2 and done.stdout == "", done
    line = done.stderr.strip()
    assert "\n" not in line and line.startswith("autotune: error: --host ") and len(line) < 300, line


def test_a_link_opens_the_page_once(served):
    """The link printed carries a one-time code: spent when the page trades it for the token, so the copy the
    browser's history keeps opens nothing; the terminal prints the next one."""
    link = served.next_link()
    assert sign_in(link)[2] == served.token
    with pytest.raises(PermissionError, match="used already"):
        sign_in(link)
    assert sign_in(served.next_link())[2] == served.token
    for code in ("", "x", served.token, "a" * 10_000):  # nor is the token, or anything else, a code
        status, _, body = served.request("POST", "/api/session", token=False, headers={"X-Autotune-Code": code})
        assert status == 403 and served.token.encode() not in body
