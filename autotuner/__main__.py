"""`autotune`, the console script, and `python -m autotuner`: the command line's modules are imported inside
the one frame that turns a Ctrl-C pressed while they load into the usual interrupted line and exit 130 (from
the first line of `cli.main` on, the command line handles presses itself)."""
from __future__ import annotations

import signal
import sys


def main() -> None:
    """Import the command line, then run it; a press before it took over Ctrl-C is one line, never a traceback."""
    try:
        from autotuner.cli import main as command_line  # here, not at the top: a press while it loads lands below
        command_line()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second press while this one is told
        sys.stderr.write("autotune: interrupted\n")
        sys.exit(130)


if __name__ == "__main__":
    main()
