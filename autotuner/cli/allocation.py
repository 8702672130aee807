"""The Slurm allocation a command runs in, as the command line shows it: asked for through the API
(`SlurmAsk.allocation`), its warnings as notes, and given back however the command ends."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import typer

import autotuner
from autotuner import UserError

from ..jsonvalues import JSONObject
from .app import echo_err, fail, note


def slurm_allocation(ask: autotuner.SlurmAsk, recorded: JSONObject | None = None
                     ) -> autotuner.Allocation | None:
    """The allocation the command runs in (None: not in Slurm); a bad ask is one line, exit 2."""
    try:
        allocation = ask.allocation(recorded, log=note)
    except UserError as e:
        raise fail(e) from None
    except autotuner.Withdrawn as e:
        echo_err(f"autotune: interrupted while waiting for the allocation: Slurm job {e.job} withdrawn")
        raise typer.Exit(autotuner.EXIT_INTERRUPTED) from None
    for line in allocation.warnings() if allocation is not None else ():
        note(line)
    return allocation


@contextlib.contextmanager
def given_back(allocation: autotuner.Allocation | None) -> Iterator[None]:
    """An allocation we asked for is given back however the command ends; one that cannot be (Slurm does not
    answer) is named with what to do, and a command that would have succeeded exits 2. SIGTERM meanwhile is
    taken as Ctrl-C (the sweep installs its own handler while it runs)."""
    guard: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if allocation is not None and allocation.owned:
        guard = autotuner.sigterm_interrupts()
    try:
        with guard:
            yield
    except typer.Exit as e:
        if not _give_back(allocation) and e.exit_code == 0:
            raise typer.Exit(autotuner.EXIT_USAGE) from None
        raise
    except BaseException:
        _give_back(allocation)
        raise
    if not _give_back(allocation):
        raise typer.Exit(autotuner.EXIT_USAGE)


def _give_back(allocation: autotuner.Allocation | None) -> bool:
    """Cancel an allocation autotune asked for (True), or say in one line that it still runs (False)."""
    if allocation is None or not allocation.owned:
        return True
    try:
        autotuner.release_allocation(allocation.job)
    except autotuner.SlurmError as e:
        echo_err(f"autotune: error: Slurm job {allocation.job} was not given back ({e}): it still holds its "
                 f"nodes; `scancel {allocation.job}` ends it")
        return False
    echo_err(f"autotune: note: gave Slurm job {allocation.job} back")
    return True
