"""The allocation a sweep runs in, held by the Slurm backend for as long as the caller's block runs: asked for
(or taken over, or this job's), kept (its keeper signalled), and given back however the block ends, whichever
caller started the sweep (the command line or a program calling `autotuner.run`)."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping

from ...ledger.meta import BackendRecord
from ..base import Given
from ..flags import routed
from .allocation import KIND, Allocation, SlurmError, sigterm_interrupts
from .ask import SlurmAsk, ask_of
from .options import SlurmGiven
from .request import release


def own_data(recorded: Mapping[str, object] | None) -> Mapping[str, object] | None:
    """What a sweep's record of its backend says of the Slurm allocation it ran in; None when it is another
    kind's (or none)."""
    record = BackendRecord.from_json(dict(recorded)) if recorded is not None else None
    return record.data if record is not None and record.kind == KIND else None


def _ignore(line: str) -> None:
    """The default for a line nobody asked to hear."""


@contextlib.contextmanager
def held(ask: SlurmAsk, recorded: Mapping[str, object] | None = None, *, log: Callable[[str], None] = _ignore,
         not_given_back: Callable[[str], None] | None = None) -> Iterator[Allocation | None]:
    """The allocation `ask` names (see `SlurmAsk.allocation`; None: not in Slurm) for the block, `recorded` the
    sweep's record of its backend (`ResumePlan.recorded`: a Slurm one names the allocation it ran in). One autotune
    asked for is given back when the block ends, however it ends (SIGTERM meanwhile taken as Ctrl-C: its
    default would end the process with the allocation held until its keeper's bound); `log` is told. One that
    cannot be given back (Slurm does not answer) is a SlurmError naming it and how to end it, raised when the
    block itself ended well; told to `not_given_back` instead, when given (a block that raised keeps its
    error: the line then goes to `not_given_back`, else to `log`)."""
    allocation = ask.allocation(own_data(recorded), log=log)
    if allocation is None or not allocation.owned:
        yield allocation
        return
    try:
        with sigterm_interrupts():
            yield allocation
    except BaseException:
        problem = _give_back(allocation, log)
        if problem is not None:
            (not_given_back or log)(problem)
        raise
    problem = _give_back(allocation, log)
    if problem is not None:
        if not_given_back is None:
            raise SlurmError(problem)
        not_given_back(problem)


def _give_back(allocation: Allocation, log: Callable[[str], None]) -> str | None:
    """Cancel an allocation autotune asked for (`log` told); what went wrong when Slurm did not answer."""
    try:
        release(allocation.job)
    except SlurmError as e:
        return (f"Slurm job {allocation.job} was not given back ({e}): it still holds its nodes; "
                f"`scancel {allocation.job}` ends it")
    log(f"gave Slurm job {allocation.job} back")
    return None


@contextlib.contextmanager
def held_given(given: Given, recorded: Mapping[str, object] | None, log: Callable[[str], None],
               not_given_back: Callable[[str], None] | None) -> Iterator[Given]:
    """`held` for the registry: the allocation the options given ask for (or the sweep's record names) held for
    the block, its warnings told to `log`, and added to the options (`allocation`); one given whole is the
    caller's to hold."""
    options = routed(SlurmGiven, given)
    if options.allocation is not None:
        yield given
        return
    with held(ask_of(options), recorded, log=log, not_given_back=not_given_back) as allocation:
        if allocation is None:
            yield given
            return
        for line in allocation.warnings():
            log(line)
        yield {**given, "allocation": allocation}
