import json
import os

import pytest

from autotuner.errors import UserError
from autotuner.spec.metrics import (
    FLOPS_PER_GPU,
    LATENCY,
    MAX_KEPT,
    METRICS_PATH_ENV,
    THROUGHPUT,
    Metric,
    MetricsError,
    metric_named,
    read_metrics,
)

DEEPSPEED_METRICS = {"fwd": 1.25, "bwd": 2.5, "step": 0.75, "latency": 4.5, "FLOPS_per_gpu": 1.5e9,
                     "throughput": 711.1, "rank": 0}


def test_known_metrics_and_their_direction():
    assert metric_named("throughput") == THROUGHPUT == Metric("throughput", minimize=False)
    assert metric_named("latency") == LATENCY and LATENCY.minimize
    assert metric_named("FLOPS_per_gpu") == FLOPS_PER_GPU and not FLOPS_PER_GPU.minimize
    assert metric_named("flops") == FLOPS_PER_GPU  # DeepSpeed's autotuning config word for it


def test_sort_key_puts_the_best_first():
    assert sorted([3.0, 9.0, 1.0], key=THROUGHPUT.sort_key) == [9.0, 3.0, 1.0]
    assert sorted([3.0, 9.0, 1.0], key=LATENCY.sort_key) == [1.0, 3.0, 9.0]


def test_custom_metrics_need_a_direction_and_round_trip_through_spec():
    loss = metric_named("val_loss:min")
    assert loss == Metric("val_loss", minimize=True) and loss.spec == "val_loss:min"
    assert metric_named("tokens_per_s:max") == Metric("tokens_per_s", minimize=False)
    for metric in (THROUGHPUT, LATENCY, FLOPS_PER_GPU, loss, Metric("acc", False)):
        assert metric_named(metric.spec) == metric
    assert THROUGHPUT.spec == "throughput"
    assert metric_named("throughput:max") == THROUGHPUT  # the right direction on a known name is fine


@pytest.mark.parametrize("text", ["loss", "thruput", "loss:lower", ":min", "a b:max", "", "latency:max"])
def test_bad_metric_names_are_user_errors(text):
    with pytest.raises(UserError) as info:
        metric_named(text)
    assert repr(text) in str(info.value)


def test_metric_error_can_be_located():
    with pytest.raises(UserError) as info:
        metric_named("loss", path="sweep.hjson", line=7)
    assert str(info.value).startswith("sweep.hjson:7: unknown metric 'loss'")


def test_reads_deepspeed_metrics(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(DEEPSPEED_METRICS))
    values = read_metrics(path, THROUGHPUT)
    assert values == {k: float(v) for k, v in DEEPSPEED_METRICS.items()}
    assert read_metrics(path, LATENCY)["latency"] == 4.5


def test_keeps_only_finite_numbers(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text('{"loss": 0, "note": "x", "ok": true, "bad": NaN, "big": Infinity, "n": null, "l": [1]}')
    assert read_metrics(path, metric_named("loss:min")) == {"loss": 0.0}


def test_keys_no_report_column_can_show_are_left_out(tmp_path):
    """Found by a hostile tester: a script's key `"\\ud800"` (half a UTF-16 pair) made every table of the report
    fail with a traceback; a key of a million characters made each row a megabyte; 3,000 keys 3,000 columns."""
    path = tmp_path / "metrics.json"
    keys = ["\ud800", "k" * 101, "tab\there", "", "train/loss", "k" * 100]
    path.write_text(json.dumps({**{k: 1 for k in keys}, "throughput": 2}))
    assert read_metrics(path, THROUGHPUT) == {"train/loss": 1.0, "k" * 100: 1.0, "throughput": 2.0}
    path.write_text(json.dumps({**{f"m{i}": i for i in range(3000)}, "throughput": 2}))
    values = read_metrics(path, THROUGHPUT)
    assert len(values) == MAX_KEPT and values["throughput"] == 2.0 and "m254" in values and "m255" not in values


@pytest.mark.parametrize("content, reason", [
    (None, "missing"),
    ("", "not JSON (empty file)"),
    ('{"throughput": 1', "not JSON"),
    (b"\xff\xfe", "not JSON"),
    ("[1, 2]", "not an object"),
    ('{"latency": 3}', "metric 'throughput' missing (keys: latency)"),
    ('{"throughput": "fast"}', "not a finite number"),
    ('{"throughput": true}', "not a finite number"),
    ('{"throughput": null}', "not a finite number"),
    ('{"throughput": NaN}', "not a finite number"),
    ('{"throughput": Infinity}', "not a finite number"),
    ('{"throughput": -1.5}', "not a finite number >= 0"),
    ('{"throughput": 1' + "0" * 400 + "}", "not a finite number"),
])
def test_invalid_metrics_files(tmp_path, content, reason):
    path = tmp_path / "metrics.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(MetricsError) as info:
        read_metrics(path, THROUGHPUT)
    assert reason in str(info.value) and str(path) in str(info.value)
    assert reason in info.value.reason


def test_zero_is_a_valid_value(tmp_path):
    path = tmp_path / "m.json"
    path.write_text('{"throughput": 0}')
    assert read_metrics(path, THROUGHPUT) == {"throughput": 0.0}


def test_a_directory_is_not_a_metrics_file(tmp_path):
    with pytest.raises(MetricsError, match="unreadable"):
        read_metrics(tmp_path, THROUGHPUT)


def test_the_environment_contract_is_documented():
    import autotuner.spec.metrics as module

    assert METRICS_PATH_ENV == "AUTOTUNE_METRICS_PATH"
    assert METRICS_PATH_ENV in module.__doc__


# --- files that used to crash or hang the reader: each is a MetricsError naming the file and the problem ----
@pytest.mark.parametrize("content, reason", [
    ("[" * 100_000 + "]" * 100_000, "nests 100000 levels deep (at most 32 are read)"),
    ('{"throughput": 1, "x": ' + "[" * 5000 + "]" * 5000 + "}", "nests 5001 levels deep"),
    ('{"throughput": 1e400}', "is Infinity, not a finite number"),
    ('{"throughput": -Infinity}', "not a finite number"),
    ('{"throughput": 1' + "0" * 5000 + "}", "not JSON (Exceeds the limit"),
    ('{"throughput": "' + "f" * 10_000 + '"}', "is \"ffff"),
    ('"throughput"', "holds a JSON str, not an object"),
    ("3.5", "holds a JSON float, not an object"),
    ('{"throughput": {"value": 3}}', "not a finite number"),
    (b"\x00\x01\x89PNG\r\n\x1a\n" * 100, "not JSON"),
    (b"\xc3\x28", "not JSON (not UTF-8 text: byte 0)"),
    (" " * (1024 * 1024 + 1), "larger than 1 MiB"),
], ids=["deep-100000", "deep-value", "1e400", "-Infinity", "5000-digits", "long-string", "a-string", "a-float",
        "an-object", "binary", "bad-utf8", "over-1MiB"])
def test_bounded_reader_refuses_what_would_crash_it(tmp_path, content, reason):
    path = tmp_path / "metrics.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(MetricsError) as info:
        read_metrics(path, THROUGHPUT)
    message = str(info.value)
    assert reason in message and message.startswith(f"{path}: ")
    assert len(message) < len(str(path)) + 300  # a huge value is not echoed whole


def test_strings_holding_brackets_are_not_nesting(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps({"note": "[" * 1000 + '"{' * 100, "throughput": 2.5}))
    assert read_metrics(path, THROUGHPUT) == {"throughput": 2.5}


def test_shallow_nesting_is_read(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps({"throughput": 4, "detail": [[[[{"a": [1]}]]]]}))
    assert read_metrics(path, THROUGHPUT) == {"throughput": 4.0}


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_only_a_regular_file_is_read(tmp_path, kind):
    """A FIFO used to block the reader for ever, /dev/zero to fill the memory."""
    path = tmp_path / "metrics.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    with pytest.raises(MetricsError) as info:
        read_metrics(path, THROUGHPUT)
    assert f"{path}: metrics file unreadable: a " in str(info.value) and "not a regular file" in str(info.value)
