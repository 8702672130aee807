"""`autotune`, the console script, and `python -m autotuner`: the command line's modules are imported inside
the one frame that turns a Ctrl-C pressed while they load into the usual interrupted line and exit 130 (from
the first line of `cli.main` on, the command line handles presses itself)."""
from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys

# The commands that read and print: once one has returned, its process has nothing left to do, and it ends
# without Python's teardown (freeing every module and object it built: 11 ms whatever the sweep), as mypy's
# does. Whatever they write (a page, a plot) is closed before they return; stdout and stderr are flushed here.
# What they build lives until then, so they run without the cyclic collector (but while plots are drawn):
# it walked the few hundred thousand objects of a large sweep again and again as they piled up (half of a
# 100,000-experiment report, a third of a 100,000-experiment plan). What they read is held to the end
# (`autotuner.cli.reports`): freeing 100,000 attempts one by one was a sixth of a compare.
_READS = frozenset({"status", "report", "compare", "plan", "--help", "--version"})


def main() -> None:
    """Import the command line, then run it; a press before it took over Ctrl-C is one line, never a traceback."""
    if _command(sys.argv[1:]) in _READS:
        gc.disable()
    try:
        from autotuner.cli import main as command_line  # here, not at the top: a press while it loads lands below
        command_line()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second press while this one is told
        sys.stderr.write("autotune: interrupted\n")
        sys.exit(130)
    except SystemExit as done:
        if _command(sys.argv[1:]) in _READS and (done.code is None or isinstance(done.code, int)):
            _end_now(done.code or 0)
        raise


def _command(argv: list[str]) -> str | None:
    """The command `argv` names, past the options that may come before it (`autotune -v report DIR`): those of
    `cli.app._options` but --version, itself one of the reads. Read here, before the command line is imported."""
    return next((arg for arg in argv if arg not in ("-v", "--verbose", "--debug")), None)


def _end_now(code: int) -> None:
    """End the process with `code` now: logging's handlers, stdout and stderr flushed first."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # closed, or its pipe gone: the exit status is what is left
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
