"""Every `autotune` command in a code block of the README and docs/ holds, so that a copied example never fails
on a typo:

- parsed: each is read by the command line's own parser (click's, through the typer app: the group's options,
  the command, its options and arguments, value types, ranges and choices), without running it;
- run: each code block is run as written, by bash, page by page in a scratch directory of its own, in the
  order the page shows them, with `autotune` the working tree's, its `run` and `tune` handed
  benchmarks/standin.sh as `--launcher` (a stand-in for DeepSpeed's launcher that writes the metrics file and
  ends: no DeepSpeed run, a few seconds in all). Every command must exit 0.

The scratch directory holds copies of experiments/ and benchmarks/standin.sh, a `hostfile` of this machine
(`localhost slots=2`), `sweep.hjson` (experiments/zero_mbs.hjson) and two finished stand-in sweeps of it,
`results/first` and `results/second`, for the examples that read a sweep. A block that cannot run there (it
needs a GPU or a cluster, serves until Ctrl-C, installs packages) says why on the line before it:
`<!-- examples: not run: REASON -->`; its commands are still parsed. A block that runs holds nothing but
`autotune` commands and `cd`.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer

from autotuner.backends import kinds
from autotuner.backends.flags import bare_values
from autotuner.cli import app, optional_html_value
from autotuner.cli.entry import _USAGE_ERROR, usage_error_line

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.M | re.S)
SHELL = ("", "sh", "bash", "shell", "console")
MARK = re.compile(r"<!-- examples: not run: (?P<why>.*?) -->")
OPERATORS = {"&&", "||", "|", ";", "&"}
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
# A line that runs `autotune`: at its start or after an operator, past any NAME=value assignments.
COMMAND_LINE = re.compile(r"(^|&&|\|\||[;|])\s*([A-Za-z_]\w*=\S*\s+)*autotune(\s|$)")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence
    text: str
    not_run: str | None  # the reason its marker gives, or None: it runs

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The shell code blocks of a page (a fence with no language, or sh, bash, shell, console)."""
    text = page.read_text()
    found = []
    for m in FENCE.finditer(text):
        if m.group(1).strip() not in SHELL:
            continue
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        mark = MARK.fullmatch(before)
        found.append(Block(page, text.count("\n", 0, m.start()) + 1, m.group(2),
                           mark.group("why").strip() if mark else None))
    return found


def logical_lines(text: str) -> list[str]:
    """The block's lines with backslash continuations joined."""
    return [line for line in text.replace("\\\n", " ").split("\n") if line.strip()]


def segments(line: str) -> list[list[str]]:
    """A shell line's simple commands as words (comments dropped; `&&`, `|`, `;` separate them), each without
    the `NAME=value` assignments before it."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = list(lexer)
    commands: list[list[str]] = [[]]
    for word in words:
        if word in OPERATORS:
            commands.append([])
        else:
            commands[-1].append(word)
    result = []
    for command in commands:
        while command and ASSIGNMENT.match(command[0]):
            command = command[1:]
        if command:
            result.append(command)
    return result


def autotune_commands(block: Block) -> list[list[str]]:
    """The argv (past `autotune`) of every `autotune` command in the block; lines that run none (output, a
    layout, other programs) are not read as shell."""
    return [words[1:] for line in logical_lines(block.text) if COMMAND_LINE.search(line)
            for words in segments(line) if words[0] == "autotune"]


def parse(argv: list[str]) -> str | None:
    """None when the command line's parser takes `argv` (as `autotune` would get it), else its one error line.
    Nothing is run: each context is made (options and arguments read, converted and checked) and left."""
    args = list(argv)
    if "--html" in args:
        args = optional_html_value(args)
    args = bare_values(args, kinds.every_flag())
    group = typer.main.get_command(app)
    try:
        with group.make_context("autotune", args, resilient_parsing=False) as ctx:
            rest = [*getattr(ctx, "_protected_args", getattr(ctx, "protected_args", [])), *ctx.args]
            if not rest:
                return "no command"
            name, command, tail = group.resolve_command(ctx, rest)  # type: ignore[attr-defined]
            assert command is not None and name is not None
            with command.make_context(name, tail, parent=ctx, resilient_parsing=False):
                return None
    except typer.Exit as done:  # --version, --help: the command line would end there, with this status
        return None if done.exit_code == 0 else f"exit {done.exit_code}"
    except _USAGE_ERROR as error:
        return usage_error_line(error)


EVERY = [block for page in PAGES for block in blocks(page)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_autotune_command_in_a_code_block_parses(page):
    wrong = [f"{block.where}: autotune {shlex.join(argv)}: {error}"
             for block in blocks(page) for argv in autotune_commands(block)
             if (error := parse(argv)) is not None]
    assert wrong == []


def test_the_parser_refuses_what_the_command_line_refuses():
    """What the check above leans on: a typo, a value of the wrong kind, one out of range, an option another
    command takes, a flag given a value, a missing argument; and the forms `autotune` itself accepts."""
    refused = [["run", "sweep.hjson", "--slot", "2"], ["run", "sweep.hjson", "--slots", "two"],
               ["run", "sweep.hjson", "--slots", "0"], ["report", "DIR", "--slots", "2"],
               ["report", "DIR", "--plot", "yes"], ["report"], ["run", "sweep.hjson", "--fail-on", "some"],
               ["rnu", "sweep.hjson"], ["--verbos", "status", "DIR"], ["status", "DIR", "--format", "csv"]]
    assert [argv for argv in refused if parse(argv) is None] == []
    taken = [["-v", "run", "sweep.hjson", "--slots", "2", "--timeout", "none"], ["report", "DIR", "--html"],
             ["report", "DIR", "--html", "page.html", "--plot"], ["run", "s.hjson", "--ray"],
             ["tune", "--slots", "2", "train.py", "--deepspeed_config", "ds.json", "--whatever", "x"],
             ["--version"], ["hosts", "--help"]]
    assert [(argv, parse(argv)) for argv in taken if parse(argv) is not None] == []


def test_every_block_that_does_not_run_says_why_and_marks_a_block():
    for page in PAGES:
        text = page.read_text()
        for m in re.finditer(r"^<!-- examples:.*?-->", text, re.M):
            line = text.count("\n", 0, m.start()) + 1
            mark = MARK.fullmatch(m.group(0))
            assert mark and mark.group("why").strip(), f"{page.name}:{line}: `<!-- examples: not run: REASON -->`"
            assert text[m.end():].startswith("\n```"), f"{page.name}:{line}: the marker is not right above a block"


def test_the_readme_tour_runs_each_of_its_commands():
    """The README's tour shows run, tune, plan, report and resume, each in a block that runs here (the
    dashboard serves until Ctrl-C: parsed only)."""
    ran = {argv[0] for block in blocks(ROOT / "README.md") if block.not_run is None
           for argv in autotune_commands(block)}
    assert {"run", "tune", "plan", "report", "resume"} <= ran


# --- run on stand-ins ----------------------------------------------------------------------------------------
PRELUDE = """\
set -euo pipefail
autotune() {
  local before=()
  while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do before+=("$1"); shift; done
  case "${1-}" in
    run|tune) local command=$1; shift
              "$EXAMPLES_PYTHON" -m autotuner "${before[@]}" "$command" --launcher "$EXAMPLES_STANDIN" "$@" ;;
    *) "$EXAMPLES_PYTHON" -m autotuner "${before[@]}" "$@" ;;
  esac
}
"""


def environment(sandbox: Path, template: Path) -> dict[str, str]:
    """The examples' environment: the working tree's package, no colour, an instant stand-in; Python's bytecode
    kept beside the template for the next command (each is a new interpreter), never in the repository."""
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**environ, "PYTHONPATH": str(ROOT), "PYTHONPYCACHEPREFIX": str(template.parent / "pycache"),
            "NO_COLOR": "1", "STANDIN_SECONDS": "0", "EXAMPLES_PYTHON": sys.executable,
            "EXAMPLES_STANDIN": str(sandbox / "benchmarks" / "standin.sh")}


def bash(script: str, sandbox: Path, template: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", PRELUDE + script], cwd=sandbox, env=environment(sandbox, template),
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """The scratch directory every page's examples start from."""
    sandbox = tmp_path_factory.mktemp("examples") / "template"
    shutil.copytree(ROOT / "experiments", sandbox / "experiments", ignore=shutil.ignore_patterns("__pycache__"))
    (sandbox / "benchmarks").mkdir()
    shutil.copy2(ROOT / "benchmarks" / "standin.sh", sandbox / "benchmarks" / "standin.sh")
    (sandbox / "hostfile").write_text("localhost slots=2\n")
    sweep = (ROOT / "experiments" / "zero_mbs.hjson").read_text()
    (sandbox / "sweep.hjson").write_text(sweep.replace("script: train.py", "script: experiments/train.py"))
    made = bash("autotune run sweep.hjson --slots 2 -o results/first --quiet\n"
                "autotune run sweep.hjson --slots 2 -o results/second --quiet\n", sandbox, sandbox)
    assert made.returncode == 0, made.stdout + made.stderr
    return sandbox


RUN = [page for page in PAGES if any(b.not_run is None and autotune_commands(b) for b in blocks(page))]


@pytest.mark.parametrize("page", RUN, ids=lambda p: p.name)
def test_every_example_runs_on_stand_ins(page, template, tmp_path):
    sandbox = tmp_path / "sandbox"
    shutil.copytree(template, sandbox, symlinks=True)
    for block in blocks(page):
        if block.not_run is not None or not autotune_commands(block):  # not run, or no command (output)
            continue
        others = [line for line in logical_lines(block.text)
                  if any(words[0] not in ("autotune", "cd") for words in segments(line))]
        assert others == [], f"{block.where}: a block that runs holds only autotune and cd (or is marked)"
        done = bash(block.text, sandbox, template)
        assert done.returncode == 0, f"{block.where} exit {done.returncode}:\n{block.text}\n" \
                                     f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
