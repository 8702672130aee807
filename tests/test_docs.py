"""What the README and docs/ promise a reader, checked against the code: every option `--help` lists is named in
the manual, docs/reference.md is what the command line says, the Hjson examples read as their comments say,
links inside the repository lead somewhere, and none points at files outside it. The README stays short and
keeps the two commands a newcomer starts with. (tests/test_examples.py checks the `autotune` commands the
pages show.)"""
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
# The manual as people wrote it: the README and docs/, but the reference written from the command line.
WRITTEN = "\n".join(doc.read_text() for doc in DOCS if doc != REFERENCE)
FENCED = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def hjson_blocks() -> list[str]:
    return [body for lang, body in FENCED.findall(WRITTEN) if lang == "hjson"]


def test_every_option_help_lists_is_named_in_the_manual():
    """Each option is explained somewhere in the README or a page of docs/, not only listed by the reference."""
    command = typer.main.get_command(app)
    missing = []
    commands = [("autotune", command), *command.commands.items()]  # type: ignore[attr-defined]
    for name, sub in commands:
        for param in sub.params:
            spellings = [o for o in (*param.opts, *param.secondary_opts) if o.startswith("--") and o != "--help"]
            if spellings and not any(re.search(re.escape(o) + r"(?![\w-])", WRITTEN) for o in spellings):
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


def test_the_readme_commands_table_lists_every_command_in_help_order():
    command = typer.main.get_command(app)
    listed = re.findall(r"^\| \[`(\w+)`\]\(docs/[\w.-]+\.md\) \| ", README, re.M)
    assert listed == list(command.commands)  # type: ignore[attr-defined]


def test_the_readme_keeps_the_two_first_commands_and_ci_runs_its_test_command():
    blocks = [body.strip() for _, body in FENCED.findall(README)]
    assert "bash .ci/setup && autotune run experiments/zero_mbs.hjson --slots 2" in blocks
    assert "bash .ci/setup-tests && python -m pytest -q tests" in blocks
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert "bash .ci/setup-tests" in ci and ci[-1] == "python -m pytest -q tests"


def test_the_readme_is_read_in_five_minutes():
    """Well under 250 lines, none of prose longer than 120 characters (a code block may hold a long command)."""
    lines = README.splitlines()
    assert len(lines) < 200
    prose = re.sub(r"^```.*?^```", "", README, flags=re.M | re.S).splitlines()
    assert [line for line in prose if len(line) > 120] == []
