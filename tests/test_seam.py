"""The seam between the backends and the rest: no module outside `autotuner/backends/` names a kind of cluster
(an import of a kind's package, a name, a parameter, a keyword, an attribute with `slurm`, `ray` or `ssh` as one
of its words: `SlurmAsk`, `optional_ray_value`, `meta.ray`). Read from the package's syntax trees, strings and
docstrings left out.

KNOWN holds how many names a module outside backends/ still has, as a ceiling that may only come down: the
public face alone, for what users' programs name (`Ssh`, how hosts are reached; `SlurmAsk`, the allocation
`run` and `resume` ask for; `SlurmError`). The command line builds its flags from what the backends declare
and the runner's Options carries their values by name (issue 33), so neither names a kind. A module not listed
names none; a new name of a kind outside backends/ fails here."""
from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "autotuner"
KINDS = {"slurm", "ray", "ssh"}
KNOWN = {"__init__.py": 11}


def words(name: str) -> set[str]:
    """A name's words: split at `_`, `.` and where a capital follows a small letter (SlurmAsk: slurm, ask)."""
    return {part.lower() for part in re.split(r"[_.]|(?<=[a-z0-9])(?=[A-Z])", name) if part}


def names(tree: ast.AST) -> Iterator[str]:
    """Every name the code says: variables, attributes, parameters, keywords, definitions, imports."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
            yield node.arg
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.name
        elif isinstance(node, ast.ImportFrom):
            yield node.module or ""
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def kinds_named(source: str) -> list[str]:
    return [name for name in names(ast.parse(source)) if words(name) & KINDS]


def outside_backends() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if not module.startswith("backends/"):
            yield module, path


def test_no_module_outside_backends_names_more_kinds_than_it_did():
    over = {}
    for module, path in outside_backends():
        found = kinds_named(path.read_text())
        if len(found) > KNOWN.get(module, 0):
            over[module] = sorted(set(found))
    assert not over, over


def test_the_check_sees_a_kind_however_it_is_named():
    # What a module outside backends/ could add, each caught: an import of a kind's package, a class, a
    # function, a parameter, an attribute of a record, a keyword.
    for line in ("from ..backends.ray.ask import nodes", "x = SlurmAsk()", "optional_ray_value(argv)",
                 "def f(ssh: int) -> None: ...", "meta.slurm", "f(ray=1)", "import autotuner.backends.ssh"):
        assert kinds_named(line), line
    for line in ("array = [1]", "x.survey", "sshd_config = None", "def step(self): ..."):
        assert kinds_named(line) == [], line  # words, not letters: "array" names no Ray


def test_what_the_backends_share_imports_no_kind():
    # The contract and the helpers every backend uses (recovery, watch, cluster, exit status, ...) know no kind:
    # recovery read an attempt's Slurm step itself (importing slurm.executor) where it now asks the backend
    # (`recorded_code`). kinds.py alone lists the kinds; `local` is this machine, which every kind runs on.
    shared = {}
    for path in sorted((PACKAGE / "backends").glob("*.py")):
        if path.name == "kinds.py":  # the list of the kinds, each as it declares itself
            continue
        imported = [node.module or "" for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, ast.ImportFrom) and node.level == 1]
        kinds = [m for m in imported if m.split(".")[0] in KINDS | {"hosts"}]
        if kinds:
            shared[path.name] = kinds
    assert not shared, shared
