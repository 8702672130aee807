"""Bad input a hostile tester found past the first two rounds (test_bad_input, test_bad_input_surfaces): bytes
that are not UTF-8, strings no encoder can write, numbers that made a check loop for minutes, config sections
every run would fail on. The rule is the same: exit 2, one line naming the file, line and problem, nothing
written or launched, memory and time bounded."""
from __future__ import annotations

import pytest
from test_bad_input import line_of, refused
from test_bad_input_surfaces import STANDIN, config, tune

from autotuner.spec.reading import Budget, read_source

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


@pytest.mark.parametrize("value", ['"a\\ud800"', '["ok", "\\udc00 alone"]', '"\\ude00\\ud83d"'])
def test_half_a_utf16_pair_in_a_config_is_located_not_written(tmp_path, value):
    """JSON's `\\ud800` escape parses to a string no encoder can write: tune made its results directory and
    ledger, then failed on the experiment's digest with a traceback."""
    config(tmp_path)
    path = tmp_path / "ds.json"
    path.write_text(path.read_text()[:-1] + f',\n "comment": {value}\n}}')
    refused(tune(tmp_path), f"{path}:{line_of(path, 'comment')}:", "half of a UTF-16 pair", tmp_path=tmp_path)
    assert not (tmp_path / "results").exists()


def test_a_whole_utf16_pair_is_one_character_and_read(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"a": "\\ud83d\\ude00", "b": "\\uD83D\\uDE00"}')
    assert read_source(path, Budget(), "DeepSpeed config").data == {"a": "\U0001F600", "b": "\U0001F600"}


def test_half_a_utf16_pair_in_a_sweep_file_is_located(tmp_path):
    (tmp_path / "train.py").touch()
    path = tmp_path / "sweep.hjson"
    path.write_text('{\n  script: train.py\n  name: "s\\udfff"\n  ds_config: {}\n}\n')
    refused(autotune("plan", "--slots", "1", path, cwd=tmp_path), f"{path}:3:", "half of a UTF-16 pair")
