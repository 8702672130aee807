"""Bad input a hostile tester found past the first two rounds (test_bad_input, test_bad_input_surfaces): bytes
that are not UTF-8, strings no encoder can write, numbers that made a check loop for minutes, config sections
every run would fail on. The rule is the same: exit 2, one line naming the file, line and problem, nothing
written or launched, memory and time bounded."""
from __future__ import annotations

import pytest
from test_bad_input import refused
from test_bad_input_surfaces import STANDIN, config

from cli_rig import autotune, env

NOT_UTF8 = "r\udcffes"  # how Python hands on the byte 0xff of an argument (surrogateescape)


@pytest.mark.parametrize("where", ["results", "script argument", "status"])
def test_an_argument_that_is_not_utf8_is_one_line_before_anything_is_written(tmp_path, where):
    """Non-UTF-8 bytes in an argument reached the ledger and failed there: a traceback after the results
    directory was made (tune -o), or after the sweep had started (a script's argument)."""
    config(tmp_path)
    if where == "status":
        result = autotune("status", tmp_path / NOT_UTF8, cwd=tmp_path)
    else:
        out, extra = (NOT_UTF8, "--steps") if where == "results" else ("results", NOT_UTF8)
        result = autotune("tune", "--slots", "1", "-o", out, "--launcher", f"sh {STANDIN}", "train.py",
                          "--deepspeed_config", "ds.json", extra,
                          environ=env(OOM_STANDIN_LOG=tmp_path / "launches.log"), cwd=tmp_path, timeout=60)
    refused(result, "argument ", "\\xff", "is not UTF-8 text", tmp_path=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.json", "train.py"]
