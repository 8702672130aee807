"""How a sweep's end becomes the exit status of `autotune run` / `resume`: the codes, and the `--fail-on` policy
that says what counts as failure. Cheap to import: the command line lists the policy's choices in its help.

`any` (the default): 1 unless every experiment succeeded and the best config was written. `no-result`: 1 only
when there is no result (no experiment succeeded with its metric, so no best config), so that
`autotune run ... --fail-on no-result && train` goes on past the OOMs a useful sweep always has.
"""
from __future__ import annotations

from ..states import _Word

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class FailOn(_Word):
    """What makes a finished sweep exit 1."""

    ANY = "any"  # any experiment that did not succeed (failed, timed out, cancelled, left queued; not `stopped`)
    NO_RESULT = "no-result"  # only a sweep without a result: no experiment succeeded, no best config written


def exit_code(*, interrupted: bool, all_succeeded: bool, best_written: bool, fail_on: FailOn = FailOn.ANY) -> int:
    """130 when interrupted (whatever the policy: the sweep is not over); else 0 or 1 as `fail_on` says."""
    if interrupted:
        return EXIT_INTERRUPTED
    if FailOn(fail_on) == FailOn.NO_RESULT:
        return EXIT_OK if best_written else EXIT_FAILED
    return EXIT_OK if all_succeeded and best_written else EXIT_FAILED
