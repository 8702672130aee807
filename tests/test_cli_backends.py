"""The command line's backend flags come from what the backends declare (backends/*/options.py, listed in
kinds.KINDS), not from the command line's own code: its help imports no backend beyond those declarations, and
a kind added to the list gets its flags, and their values, with no edit of the command line."""
from __future__ import annotations

import json
import subprocess
import sys

from cli_rig import ROOT, env

DECLARATIONS = {"autotuner.backends", "autotuner.backends.flags", "autotuner.backends.kinds",
                *(f"autotuner.backends.{kind}{part}" for kind in ("hosts", "slurm", "ray")
                  for part in ("", ".options"))}

# Runs the command line in this process, then prints the backend modules it imported (stdout: the command's).
IMPORTED = """\
import json, sys
from autotuner.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.startswith("autotuner.backends"))), file=sys.stderr)
"""

# The pretend kind (tests/pretend_kind.py) added to the list, then the command line run.
WITH_PRETEND = """\
import sys
from autotuner.backends import kinds
from pretend_kind import PRETEND
kinds.KINDS = (PRETEND, *kinds.KINDS)
from autotuner.cli import main
main(sys.argv[1:])
"""


def cli(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          env=env(PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}"))


def test_help_imports_no_backend_beyond_the_declarations():
    for args in ((), ("--help",), ("run", "--help"), ("hosts", "--help")):
        done = cli(IMPORTED, *args)
        assert set(json.loads(done.stderr.splitlines()[-1])) == DECLARATIONS, args


def test_a_kind_added_to_the_list_gets_its_flags_with_no_edit_of_the_command_line():
    for command in ("run", "tune", "resume", "plan", "hosts"):
        shown = cli(WITH_PRETEND, command, "--help")
        assert shown.returncode == 0 and "--pretend NAME" in shown.stdout, (command, shown.stderr)
        assert "Run on a pretend cluster named NAME." in shown.stdout
    hosts = cli(WITH_PRETEND, "hosts", "--pretend", "x", "--format", "md")  # routed to the kind that declared it
    assert hosts.returncode == 0, hosts.stderr
    assert "pretend-node" in hosts.stdout
    refused = cli(WITH_PRETEND, "hosts", "--pretend", "bad")  # its own check, as every kind's: one line, exit 2
    assert (refused.returncode, refused.stderr) == (2, "autotune: error: --pretend bad: no such pretend cluster\n")
    unknown = cli(IMPORTED, "hosts", "--pretend", "x")  # not listed: no such flag
    assert "No such option: --pretend" in unknown.stderr
