"""What the README and docs/ promise a reader, checked against the code: every option `--help` lists is named,
the Hjson examples read as their comments say, links inside the repository lead somewhere, and none points at
files outside it."""
from __future__ import annotations

import re
from pathlib import Path

import hjson
import pytest
import typer

import autotuner
from autotuner.cli import app, reference

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REFERENCE = ROOT / "docs" / "reference.md"
FENCED = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def hjson_blocks() -> list[str]:
    return [body for lang, body in FENCED.findall(README) if lang == "hjson"]


def test_every_option_help_lists_is_named_in_the_readme():
    command = typer.main.get_command(app)
    missing = []
    commands = [("autotune", command), *command.commands.items()]  # type: ignore[attr-defined]
    for name, sub in commands:
        for param in sub.params:
            spellings = [o for o in (*param.opts, *param.secondary_opts) if o.startswith("--") and o != "--help"]
            if spellings and not any(re.search(re.escape(o) + r"(?![\w-])", README) for o in spellings):
                missing.append(f"{name} {spellings[0]}")
    assert missing == []


def test_the_reference_is_what_the_command_line_says():
    assert REFERENCE.read_text() == reference.markdown(), \
        f"docs/reference.md differs from the command line: write it again with `{reference.REGENERATE}`"


def test_the_reference_lists_every_option_of_every_command():
    """What the comparison above leans on: the page names each command and each of its options."""
    text = REFERENCE.read_text()
    command = typer.main.get_command(app)
    missing = [f"{name} {opt}" for name, sub in command.commands.items()  # type: ignore[attr-defined]
               for param in sub.params for opt in (*param.opts, *param.secondary_opts)
               if param.param_type_name == "option"
               and not re.search(rf"^## autotune {name}\n(?:(?!^## ).)*?`[^`\n]*{re.escape(opt)}\b", text, re.M | re.S)]
    assert missing == []


def _strings(value: object) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def test_the_hjson_examples_read_as_written():
    # Hjson reads an unquoted value to the end of its line: a trailing comment or a closing brace there becomes
    # part of the value (or the file no longer parses).
    blocks = hjson_blocks()
    assert len(blocks) >= 3
    for block in blocks:
        data = hjson.loads(block.replace("{ ... }", "{}"))
        swallowed = [s for s in _strings(data) if "#" in s or s.rstrip().endswith(("}", "]", ","))]
        assert swallowed == [], block


def test_the_tune_file_example_is_a_tune_autotune_reads(tmp_path):
    tune = next(b for b in hjson_blocks() if "name: mytune" in b)
    (tmp_path / "train.py").touch()
    (tmp_path / "tune.hjson").write_text(tune)
    request = autotuner.read_tune(str(tmp_path / "tune.hjson"), [])
    assert request.inputs  # read and checked, nothing refused


def test_the_sweep_file_examples_load(tmp_path):
    sweeps = [b for b in hjson_blocks() if "space:" in b]
    assert len(sweeps) == 2
    for i, block in enumerate(sweeps):
        (tmp_path / "train.py").touch()
        (tmp_path / "train_hf.py").touch()
        path = tmp_path / f"sweep{i}.hjson"
        path.write_text(block.replace("{ ... }", "{gradient_accumulation_steps: 1}"))
        assert len(autotuner.load_sweep([path]).experiments) == (6 if i == 0 else 4)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_inside_the_repository_lead_somewhere(doc):
    text = doc.read_text()
    anchors = {_slug(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        found = (doc.parent / path).exists() if path else anchor in anchors
        if not found:
            broken.append(target)
    assert broken == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_no_doc_points_outside_the_repository(doc):
    assert re.findall(r"/work/shared|\.\./shared", doc.read_text()) == []


def test_the_commands_table_gives_each_command_only_options_it_takes():
    command = typer.main.get_command(app)
    takes = {name: {o for p in sub.params for o in (*p.opts, *p.secondary_opts)}
             for name, sub in command.commands.items()}  # type: ignore[attr-defined]
    wrong = []
    for line in README.splitlines():
        if not line.startswith("| `autotune "):
            continue
        usage = line.split(" | ")[0]
        first = re.match(r"\| `autotune (\w+)", line)
        also = re.search(r"\(and ([^)]*)\)", usage)
        assert first is not None, line
        names = [first.group(1), *(re.findall(r"`(\w+)`", also.group(1)) if also else [])]
        wrong += [f"{n} {o}" for o in re.findall(r"--[a-z][\w-]*", usage) for n in names if o not in takes[n]]
    assert wrong == []
