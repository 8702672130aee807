"""What a script does with the link `autotune dashboard` prints: trade its one-time code for the token that every
API request carries (header `X-Autotune-Token`), as the page does. The standard library only.
"""
from __future__ import annotations

import http.client
import json
import urllib.parse


def sign_in(link: str, timeout: float = 30) -> tuple[str, int, str]:
    """(host, port, token) of the dashboard at `link` (`http://HOST:PORT/#code=CODE`); the code is spent by it,
    and the dashboard prints the next one."""
    parsed = urllib.parse.urlsplit(link)
    code = urllib.parse.parse_qs(parsed.fragment).get("code", [""])[0]
    if parsed.scheme != "http" or not parsed.hostname or not code:
        raise ValueError(f"not a link autotune dashboard printed: {link}")
    host, port = parsed.hostname, parsed.port or 80
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("POST", "/api/session", headers={"X-Autotune-Code": code})
        response = connection.getresponse()
        body = response.read()
    finally:
        connection.close()
    if response.status != 200:
        raise PermissionError(json.loads(body).get("error", body.decode(errors="replace")))
    return host, port, str(json.loads(body)["token"])
