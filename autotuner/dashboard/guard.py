"""What every request to the dashboard passes first, and every answer carries (pure ASGI, around the whole app).

- The security headers, on every answer (page, assets, API, errors, 404s): a Content-Security-Policy the page
  works under (scripts only from the server itself, no framing), nosniff, no Referer, no framing.
- The Host header must be a name the server was started for, with its port (DNS rebinding: a foreign name
  made to resolve here is refused before the app sees it); an Origin, when a browser sends one, must be one
  too; an API request another site's page makes is refused on the browser's own word (Sec-Fetch-Site).
- A request that breaks off (a body shorter than its Content-Length, bad chunked encoding) ends quietly, and an
  error in a handler is one log line and a 500, never a traceback in the terminal (`--debug` shows it).
"""
from __future__ import annotations

import json
import logging

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp as App
from starlette.types import Message, Receive, Scope, Send

from .listen import Listening, split_authority

log = logging.getLogger("autotuner.dashboard")

# Scripts run only from the server's own files: markup that slipped into the page (an escaping bug) runs nothing,
# neither <script> nor on...= attributes, and no string is evaluated as code (no 'unsafe-eval'). Styles come only
# from app.css: no style attribute or <style> element is applied (the plots are SVG coloured by attributes and
# app.css's classes). Images: the page's own, and the empty `data:` icon of index.html.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-resource-policy", b"same-origin"),
]
SAME = {"same-origin", "none"}  # Sec-Fetch-Site values of the page's own requests, or a user's typed URL


class Guard:
    """The app wrapped: headers added, foreign names and origins refused, errors and broken requests contained."""

    def __init__(self, app: App, listening: Listening):
        self.app = app
        self.listening = listening

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # no WebSocket is served (uvicorn runs with ws="none"), no lifespan
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                ours = {name for name, _ in HEADERS}
                message["headers"] = [*(h for h in message.get("headers", []) if h[0].lower() not in ours), *HEADERS]
            await send(message)

        try:
            refused = self.refusal(scope)
            if refused is not None:
                await _answer(sending, *refused)
                return
            await self.app(scope, receive, sending)
        except ClientDisconnect:  # the client went away mid-request: nobody to answer
            log.debug("a request broke off: %s %s", scope.get("method"), scope.get("path"))
        except Exception:
            log.error("an error answering %s %s", scope.get("method"), str(scope.get("path"))[:200], exc_info=True)
            if not started:
                await _answer(sending, 500, "the dashboard failed on this request (its terminal says why)")

    def refusal(self, scope: Scope) -> tuple[int, str] | None:
        """Why this request is refused before the app sees it (the status and one line), or None."""
        headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        hosts = [v for k, v in headers if k == b"host"]
        if len(hosts) != 1 or not self.listening.serves(hosts[0].decode("latin-1")):
            return 421, (f"this dashboard answers only to the names it listens on, with port {self.listening.port}: "
                         "open the URL it printed")
        origins = [v.decode("latin-1") for k, v in headers if k == b"origin"]
        if len(origins) > 1 or (origins and not self._ours(origins[0])):
            return 403, "a request from another origin is refused"
        site = [v.decode("latin-1") for k, v in headers if k == b"sec-fetch-site"]
        if str(scope.get("path", "")).startswith("/api/") and any(s not in SAME for s in site):
            return 403, "a request from another site's page is refused"
        return None

    def _ours(self, origin: str) -> bool:
        scheme, sep, authority = origin.partition("://")
        return scheme == "http" and bool(sep) and split_authority(authority) is not None and \
            self.listening.serves(authority)


async def _answer(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": body})
