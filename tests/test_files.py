"""Atomic writes: whole files only, and created as open() would create them (readable by a colleague)."""
from __future__ import annotations

import os
import stat

import pytest

from autotuner.files import write_atomic, write_json_atomic


@pytest.fixture
def umask():
    def set_to(mask: int) -> None:
        os.umask(mask)

    previous = os.umask(0o022)
    yield set_to
    os.umask(previous)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_files_follow_the_umask(tmp_path, umask, mask, mode):
    umask(mask)
    write_atomic(tmp_path / "summary.txt", "text\n")
    write_atomic(tmp_path / "plot.png", b"\x89PNG")
    write_json_atomic(tmp_path / "ds_config_optimal.json", {"a": 1})
    for name in ("summary.txt", "plot.png", "ds_config_optimal.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode, name


def test_replaces_whole_and_leaves_no_temporary(tmp_path, umask):
    target = tmp_path / "cmd.txt"
    write_atomic(target, "old\n")
    write_atomic(target, "new\n")
    assert target.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmd.txt"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, umask):
    target = tmp_path / "summary.txt"
    write_atomic(target, "old\n")
    with pytest.raises(TypeError):
        write_atomic(target, 42)  # type: ignore[arg-type]
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.txt"]
