"""Ctrl-C as the command sees it: from the first line of `main` to the exit, one press interrupts (one line,
exit 130) and later presses are ignored, so no press lands as a traceback or kills the process by SIGINT."""
from __future__ import annotations

import signal
import sys
import threading
from typing import NoReturn

import autotuner

from .app import echo_err

EARLY_PRESS = threading.Event()  # a Ctrl-C came before a command installed its own handling


def interrupt_once(early: bool = False) -> None:
    """Ctrl-C outside the runner's own handling (while it sets up, or once it restored the handler it found):
    the first press interrupts, later ones are ignored. With Python's default handler every press raised a
    KeyboardInterrupt, and one landing while the first was handled, or as the interpreter shut down, ended the
    process by SIGINT. The CLI owns the process: this stays until it exits (see `ignore_interrupts`).

    `early`: from the start of `main`, before a command installs its own handling; the press is noted in
    EARLY_PRESS, and `main` says so in one line and exits 130."""
    if threading.current_thread() is not threading.main_thread():
        return

    def on_sigint(signum: int, frame: object) -> None:
        if early:
            EARLY_PRESS.set()
        ignore_interrupts()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)


def ignore_interrupts() -> None:
    """The sweep has ended (or been interrupted): what is left is printing its outcome. SIG_IGN, not a Python
    handler, since Python resets its own handlers as it shuts down and a late press would then kill it."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def interrupted() -> NoReturn:
    """A Ctrl-C while the command line was still being read: nothing started, one line, exit 130."""
    ignore_interrupts()
    echo_err("autotune: interrupted")
    sys.exit(autotuner.EXIT_INTERRUPTED)
