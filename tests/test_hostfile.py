from __future__ import annotations

from pathlib import Path

import pytest

from autotuner.errors import UserError
from autotuner.spec.hostfile import (
    Host,
    format_hostfile,
    format_include,
    load_hostfile,
    localhost_hosts,
    parse_hostfile,
    select_slots,
)

REPO = Path(__file__).resolve().parent.parent

MIXED = """\
# a cluster with uneven nodes
big slots=8 gpu=A100
mid slots=4
small slots=2 gpu=T4
"""


def hosts() -> dict[str, Host]:
    return parse_hostfile(MIXED, "mixed")


# --- parsing -------------------------------------------------------------------------------------------------


def test_parse_happy_path_keeps_order_attrs_and_comments() -> None:
    text = "\n# header\n\nw-1 slots=8 gpu=A100 rack=r1  # trailing comment\n   \nw-0 slots = 2\n"
    parsed = parse_hostfile(text, "hf")
    assert list(parsed) == ["w-1", "w-0"]
    assert parsed["w-1"] == Host("w-1", 8, {"gpu": "A100", "rack": "r1"})
    assert dict(parsed["w-1"].attrs) == {"gpu": "A100", "rack": "r1"}
    assert parsed["w-0"].slots == 2 and dict(parsed["w-0"].attrs) == {}


def test_host_is_immutable_and_hashable() -> None:
    host = parse_hostfile("a slots=1 gpu=A100\n")["a"]
    assert hash(host) == hash(Host("a", 1, {"gpu": "A100"}))
    with pytest.raises(TypeError):
        host.attrs["gpu"] = "H100"  # type: ignore[index]
    with pytest.raises(AttributeError):
        host.slots = 2  # type: ignore[misc]
    source = {"gpu": "A100"}
    copy = Host("b", 1, source)
    source["gpu"] = "changed"
    assert copy.attrs["gpu"] == "A100"


@pytest.mark.parametrize("name", ["node-1", "gpu_node.cluster.local", "10.0.0.2", "nœud", "A100x8"])
def test_host_names_dns_and_ssh_aliases_use_are_read(name: str) -> None:
    assert list(parse_hostfile(f"{name} slots=2\n")) == [name]


def test_attribute_value_may_contain_equals() -> None:
    assert parse_hostfile("a slots=1 note=x=y\n")["a"].attrs["note"] == "x=y"


@pytest.mark.parametrize(("text", "line", "words"), [
    ("a slots=2\nb\n", 2, "expected `hostname slots=N"),
    ("a slots=2\nb gpus=2\n", 2, "expected `hostname slots=N"),
    ("slots=4\n", 1, "expected `hostname slots=N"),
    ("a slots=0\n", 1, "positive integer"),
    ("a slots=-1\n", 1, "positive integer"),
    ("a slots=two\n", 1, "positive integer"),
    ("a slots=1.5\n", 1, "positive integer"),
    ("a slots=\n", 1, "expected `hostname slots=N"),
    ("# c\na slots=2\n\na slots=4\n", 4, "duplicate host 'a'"),
    ("a slots=2 gpu\n", 1, "malformed attribute 'gpu'"),
    ("a slots=2 gpu=\n", 1, "malformed attribute 'gpu='"),
    ("a slots=2 =A100\n", 1, "malformed attribute '=A100'"),
    ("a slots=2 9x=1\n", 1, "malformed attribute"),
    ("a slots=2 gpu=A gpu=B\n", 1, "given twice"),
    ("a slots=2 slots=4\n", 1, "given twice"),
    ("a slots=2\nuser@b slots=2\n", 2, "contains '@'"),
    ("a:1 slots=2\n", 1, "contains ':'"),
    # Found by a hostile tester: names that reach ssh / pdsh as options, or DeepSpeed's remote shell command
    # line as --master_addr, and one host under two spellings (twice its slots).
    ("a slots=2\n-v slots=2\n", 2, "host name '-v': a host name is letters, digits"),
    ("n1;touch_x slots=2\n", 1, "host name 'n1;touch_x'"),
    ("n$(id) slots=2\n", 1, "host name 'n$(id)'"),
    ("`id` slots=2\n", 1, "host name '`id`'"),
    (".hidden slots=2\n", 1, "not starting with '.' or '-'"),
    ("a/b slots=2\n", 1, "host name 'a/b'"),
    ("a'b slots=2\n", 1, "host name \"a'b\""),
    ("N1 slots=2\nn1 slots=4\n", 2, "duplicate host 'n1' (as 'N1')"),
])
def test_parse_errors_name_file_and_line(text: str, line: int, words: str) -> None:
    with pytest.raises(UserError) as info:
        parse_hostfile(text, "cluster/hosts")
    assert info.value.path == "cluster/hosts" and info.value.line == line
    assert str(info.value).startswith(f"cluster/hosts:{line}: ")
    assert words in str(info.value)


@pytest.mark.parametrize("text", ["", "\n\n", "# only comments\n  # and more\n"])
def test_empty_hostfile_is_an_error(text: str) -> None:
    with pytest.raises(UserError) as info:
        parse_hostfile(text, "empty.txt")
    assert str(info.value) == "empty.txt: hostfile lists no hosts"


def test_load_hostfile(tmp_path: Path) -> None:
    path = tmp_path / "hostfile"
    path.write_text("n1 slots=2\n")
    assert load_hostfile(path) == {"n1": Host("n1", 2)}
    path.write_text("n1 slots=2\nn1 slots=2\n")
    with pytest.raises(UserError) as info:
        load_hostfile(path)
    assert str(info.value).startswith(f"{path}:2: ")


def test_load_hostfile_missing_or_unreadable(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(UserError) as info:
        load_hostfile(missing)
    assert str(info.value) == f"{missing}: hostfile: no such file"
    with pytest.raises(UserError) as info:
        load_hostfile(tmp_path)  # a directory
    assert str(info.value) == f"{tmp_path}: hostfile is a directory, not a regular file"
    binary = tmp_path / "bin"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UserError, match="not UTF-8"):
        load_hostfile(binary)


def test_example_hostfile_parses() -> None:
    parsed = load_hostfile(REPO / "hostfile.example")
    assert len(parsed) >= 2
    assert len({h.slots for h in parsed.values()}) > 1, "the example should show uneven nodes"
    assert all("gpu" in h.attrs for h in parsed.values())


# --- include / exclude ---------------------------------------------------------------------------------------


def test_no_filter_gives_every_slot_of_every_host() -> None:
    assert select_slots(hosts()) == {"big": tuple(range(8)), "mid": (0, 1, 2, 3), "small": (0, 1)}


def test_include_mixed_slot_counts_in_hostfile_order() -> None:
    got = select_slots(hosts(), include="small@big:7,0,3")
    assert got == {"big": (0, 3, 7), "small": (0, 1)}
    assert list(got) == ["big", "small"]


def test_include_same_host_twice_merges() -> None:
    assert select_slots(hosts(), include="big:1@big:0,1") == {"big": (0, 1)}
    assert select_slots(hosts(), include="big:1@big") == {"big": tuple(range(8))}
    assert select_slots(hosts(), include="big@big:1") == {"big": tuple(range(8))}


def test_exclude_whole_host_and_single_slots() -> None:
    got = select_slots(hosts(), exclude="big@mid:0,3")
    assert got == {"mid": (1, 2), "small": (0, 1)}


def test_exclude_every_slot_of_a_host_drops_it() -> None:
    assert select_slots(hosts(), exclude="small:0,1") == {"big": tuple(range(8)), "mid": (0, 1, 2, 3)}


def test_exclude_everything_is_an_error() -> None:
    with pytest.raises(UserError, match="--exclude 'big@mid@small' leaves no slots"):
        select_slots(hosts(), exclude="big@mid@small")


def test_include_and_exclude_together_is_an_error() -> None:
    with pytest.raises(UserError, match="cannot be used together"):
        select_slots(hosts(), include="big", exclude="mid")


@pytest.mark.parametrize(("spec", "words"), [
    ("nosuch", "unknown host 'nosuch'"),
    ("big:0@other:1", "unknown host 'other' in 'other:1'"),
    ("mid:4", "slot 4 in 'mid:4' is out of range; mid has slots 0-3"),
    ("small:0,2", "slot 2 in 'small:0,2' is out of range"),
    ("big:", "bad slot id ''"),
    ("big:a", "bad slot id 'a'"),
    ("big:-1", "bad slot id '-1'"),
    ("big:0,,1", "bad slot id ''"),
    ("big@@mid", "empty entry"),
    ("@big", "empty entry"),
])
def test_filter_errors_name_option_and_bad_part(spec: str, words: str) -> None:
    for option in ("include", "exclude"):
        with pytest.raises(UserError) as info:
            select_slots(hosts(), **{option: spec})
        message = str(info.value)
        assert message.startswith(f"--{option} {spec!r}: "), message
        assert words in message


def test_filter_error_uses_given_source_name() -> None:
    with pytest.raises(UserError, match=r"^sweep\.hjson include 'x': unknown host"):
        select_slots(hosts(), include="x", source="sweep.hjson include")


def test_blank_filters_mean_no_filter() -> None:
    assert select_slots(hosts(), include="  ", exclude="") == select_slots(hosts())


# --- formatting ----------------------------------------------------------------------------------------------


def test_format_include_is_explicit_and_sorted() -> None:
    assert format_include({"h1": [1, 0], "h2": (3,)}) == "h1:0,1@h2:3"
    assert format_include({"h1": [0], "h2": []}) == "h1:0"


def test_format_include_refuses_empty_selection() -> None:
    # "" would mean "no filter", i.e. every slot.
    with pytest.raises(ValueError):
        format_include({})
    with pytest.raises(ValueError):
        format_include({"h": []})


@pytest.mark.parametrize("selection", [
    {"big": (0, 3, 7), "small": (0, 1)},
    {"mid": (0, 1, 2, 3)},
    {"big": tuple(range(8)), "mid": (2,), "small": (1,)},
])
def test_format_include_round_trips_through_select_slots(selection: dict[str, tuple[int, ...]]) -> None:
    assert select_slots(hosts(), include=format_include(selection)) == selection


def test_round_trip_of_every_selection_is_identity() -> None:
    everything = select_slots(hosts())
    assert select_slots(hosts(), include=format_include(everything)) == everything


def test_format_hostfile_is_readable_back() -> None:
    text = format_hostfile({"big": 8, "small": 2})
    assert text == "big slots=8\nsmall slots=2\n"
    assert {n: h.slots for n, h in parse_hostfile(text).items()} == {"big": 8, "small": 2}
    with pytest.raises(ValueError):
        format_hostfile({"a": 0})


def test_localhost_hosts() -> None:
    local = localhost_hosts(3)
    assert local == {"localhost": Host("localhost", 3)}
    assert select_slots(local, include="localhost:2") == {"localhost": (2,)}
    with pytest.raises(UserError):
        localhost_hosts(0)


def test_crlf_and_bom_files(tmp_path: Path) -> None:
    path = tmp_path / "hostfile"
    path.write_bytes(b"\xef\xbb\xbfa slots=1\r\n# c\r\nb slots=oops\r\n")
    with pytest.raises(UserError) as info:
        load_hostfile(path)
    assert str(info.value).startswith(f"{path}:3: slots for b ")
    path.write_bytes(b"\xef\xbb\xbfa slots=1\r\n")
    assert list(load_hostfile(path)) == ["a"]
