"""`autotune dashboard`: a live page of the sweeps under some results directories, read straight from their
ledgers, read only.

One job per module: `feed` follows one sweep's ledger (what changed since transition N), `discover` finds the
sweeps under the directories served, `summary` works out what the page shows at the top (counts, ETA, best,
nodes), `eta` re-plans the ETA off the request path, `files` reads a sweep's files without leaving it, `server`
is the web app (Starlette, served by uvicorn), and `assets/` holds the page. The web stack is the optional
`dashboard` extra: nothing here is imported by `import autotuner` or by the other commands.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import UserError
from .discover import check_roots
from .listen import listen


def serve(directories: Sequence[Path], *, host: str = "127.0.0.1", port: int = 8765, allow_cancel: bool = False,
          announce: Callable[[str], None] = lambda line: None, token: str | None = None) -> None:
    """`autotune dashboard`: serve the sweeps under `directories` until interrupted (`server.serve`). The web
    stack is imported here, when asked for: it is an optional extra."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ModuleNotFoundError as e:
        raise UserError(f"the dashboard needs {e.name}, which is not installed: "
                        "pip install 'ds-autotune[dashboard]'") from None
    directories = check_roots(directories)  # refused before a port is taken
    listening = listen(host, port)  # a bad --host refused before the rest loads
    try:
        from .server import serve as run
    except BaseException:
        listening.close()
        raise
    run(directories, listening, allow_cancel=allow_cancel, announce=announce, token=token)
