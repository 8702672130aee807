"""The library's log on stderr: `autotune: ...` lines from the level that --verbose / --debug choose."""
from __future__ import annotations

import logging
import sys


class _Stderr(logging.Handler):
    """Log records to whatever sys.stderr is when they are emitted (a test runner may swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


class _OneLine(logging.Formatter):
    """`autotune: ...` on one line; a traceback only with --debug, else the exception's own line."""

    def __init__(self, debug: bool) -> None:
        super().__init__()
        self.debug = debug

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.levelno >= logging.WARNING:
            text = f"{record.levelname.lower()}: {text}"
        if self.debug:
            text = f"{record.name}: {text}"
            if record.exc_info:
                text += "\n" + self.formatException(record.exc_info)
            return f"autotune: {text}"
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            text += f" ({type(error).__name__}: {error})"
        return "autotune: " + " ".join(text.split())


def configure_logging(level: int) -> None:
    """The library logs to logging.getLogger("autotuner"); the command shows it on stderr from `level` up."""
    logger = logging.getLogger("autotuner")
    for handler in [h for h in logger.handlers if isinstance(h, _Stderr)]:  # one per process, however often called
        logger.removeHandler(handler)
    handler = _Stderr()
    handler.setFormatter(_OneLine(debug=level <= logging.DEBUG))
    logger.addHandler(handler)
    logger.setLevel(level)
