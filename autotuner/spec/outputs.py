"""What a command writes never lands on what it reads: `plan --plot`, `--events`, a results directory's own files
(its hostfile, summary, best config) are each checked against the command's inputs (its sweep and config files,
scripts, hostfile, model info, ssh config; an earlier sweep's ledger) before anything is written. One check for
every output option: the same file is found as the system sees it (`os.path.samefile`: a link or another
spelling of the path is the same file), and by the resolved path where it does not exist yet.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from ..errors import UserError, file_kind
from .hostfile import HOSTFILE
from .model import RESERVED_NAMES


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file: by the file system where both exist, by resolved path otherwise."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one is missing (or cannot be looked at): compare where they point
        return Path(a).resolve() == Path(b).resolve()


def check_output(path: str | Path, option: str, inputs: Iterable[str | Path | None], *,
                 own_files: bool = True, replaced: bool = False) -> None:
    """Refuse `path`, which `option` writes, when it is one of `inputs` (the files the command reads; None
    entries are options not given), or (with `own_files`) one of a sweep's own files, its ledger above all. With
    `replaced` (a file written whole and renamed into place: a plot, a page), also where something other than a
    regular file is there: the rename would replace it (as root, /dev/null or /dev/full with a PNG)."""
    path = Path(path)
    if replaced:
        try:
            mode = path.stat().st_mode
        except OSError:  # nothing there yet (or nothing to look at): the write says what is wrong
            mode = None
        if mode is not None and not stat.S_ISREG(mode):
            raise UserError(f"is {file_kind(mode)}; {option} writes a file of its own in its place: name a file", path)
    for given in inputs:
        if given is not None and same_file(path, given):
            raise UserError(f"{option} would write over {given}, an input of this command: name another file",
                            path)
    if own_files and is_sweep_file(path):
        raise UserError(f"is one of the sweep's own files; {option} wants a file of its own", path)


def is_sweep_file(path: Path) -> bool:
    """Whether `path` names one of a results directory's own files (its ledger, hostfile, lock, summary...), as
    it is spelled or where its links lead (`--events evl`, a link to a sweep's ledger, appended to the ledger)."""
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):  # a loop of links: nothing it could name is written through it
        resolved = path
    for spelled in (path, resolved):
        directory = spelled.parent if str(spelled.parent) else Path(".")
        if (directory / "ledger.sqlite").exists() and RESERVED_NAMES.fullmatch(spelled.name):
            return True
    return False


def check_results_directory(directory: str | Path, inputs: Iterable[str | Path | None],
                            spec_directories: Iterable[str | Path] = ()) -> None:
    """A results directory is written into by the sweep (RESULTS_FILES, one directory per experiment): refused
    where that would overwrite an input (`-o .` beside the hostfile the run reads), or where it is a directory of
    experiment files itself (`resume` would read the best config written there as one more experiment)."""
    directory = Path(directory)
    for spec_directory in spec_directories:
        if same_file(directory, spec_directory):
            raise UserError("is a directory of experiment files this sweep reads: its results (ds_config_optimal"
                            ".json above all) would be read as experiments; pick another --results", directory)
    for given in inputs:
        if given is None:
            continue
        given = Path(given)
        if RESERVED_NAMES.fullmatch(given.name) and same_file(given.parent, directory):
            raise UserError(f"the sweep writes its own {given.name} here, over {given}, an input of this command: "
                            "pick another --results", directory)
    _check_strays(directory)


def _check_strays(directory: Path) -> None:
    """A directory that holds no sweep (no ledger) but a file of a sweep's own name (a `summary.txt` someone left
    there): the new sweep would write over it, so it is refused, never replaced. A hostfile is checked where the
    sweep is made (`sweep.create`): one a killed `run` left there is the same text and is written again."""
    try:
        if (directory / "ledger.sqlite").exists():
            return
        strays = sorted(entry.name for entry in os.scandir(directory) if RESERVED_NAMES.fullmatch(entry.name)
                        and entry.name != HOSTFILE)
    except OSError:  # not there yet, or a path the sweep's own creation of it refuses with its reason
        return
    if strays:
        raise UserError(f"holds {strays[0]} but no sweep (no ledger.sqlite): the sweep would write its own "
                        f"{strays[0]} over it; move it or pick another --results", directory)
