"""The package's architecture as pyproject.toml states it ([tool.importlinter]): each layer imports only the
layers below it, and no import cycle among the modules of any package, function-level imports included.

Checked with import-linter on the real package, and on a copy with one import against the rules added, to show
the contracts catch what they are for."""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter's verdict on the `autotuner` package found in `root`, with the repository's contracts."""
    code = ("import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")
    return subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


def copy_with(tmp_path: Path, module: str, line: str) -> Path:
    """A copy of the package and its contracts, with `line` added inside a function at the end of `module`."""
    shutil.copytree(ROOT / "autotuner", tmp_path / "autotuner", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    path = tmp_path / module
    path.write_text(path.read_text() + f"\n\ndef _added() -> None:\n    {line}\n")
    return tmp_path


def test_the_package_keeps_its_layers_and_has_no_import_cycle():
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 kept, 0 broken" in done.stdout


def test_an_import_up_the_layers_is_refused(tmp_path):
    # The scheduling core asking the runner for something: the core would no longer be usable without it.
    done = lint_imports(copy_with(tmp_path, "autotuner/core/scheduler.py", "from ..sweep import run  # noqa"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Layers: the command line on top, the vocabulary at the bottom BROKEN" in done.stdout
    assert "autotuner.core.scheduler -> autotuner.sweep.run" in done.stdout


def test_a_cycle_within_one_layer_is_refused(tmp_path):
    # The tuners' factory imports the search; the search importing the factory back (to dodge it inside a
    # function) is the cycle this project had.
    done = lint_imports(copy_with(tmp_path, "autotuner/tune/search.py", "from . import tuners  # noqa"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "No import cycles among the modules of any package BROKEN" in done.stdout
    assert "Layers: the command line on top, the vocabulary at the bottom KEPT" in done.stdout


MOST_LINES = 500  # the house's bound on a module: one concept a module

# Classes of one name in two modules, each its own thing: none (core's Source became Searcher, beside spec/reading.py's
# Source, a file's text).
SHARED_NAMES: set[str] = set()


def package_modules() -> list[Path]:
    return sorted((ROOT / "autotuner").rglob("*.py"))


def test_no_module_of_the_package_is_over_500_lines():
    over = [f"{p.relative_to(ROOT)}: {n} lines" for p in package_modules()
            if (n := len(p.read_text().splitlines())) > MOST_LINES]
    assert not over, over


def defined_types(path: Path) -> dict[str, str]:
    """The module's top-level classes and type aliases (a capitalised name bound to a type), name -> what."""
    found: dict[str, str] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef):
            found[node.name] = "class"
        elif isinstance(node, ast.Assign) and not _type_variable(node.value):
            for t in node.targets:
                if isinstance(t, ast.Name) and t.id[:1].isupper() and not t.id.isupper():
                    found[t.id] = "alias"
    return found


def _type_variable(value: ast.expr) -> bool:
    """A TypeVar and its kin: local to the module's signatures, not a thing of the package."""
    return (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            and value.func.id in {"TypeVar", "TypeVarTuple", "ParamSpec"})


def test_one_name_is_one_thing():
    # A class or type alias is defined in one module: FreeMemory was both core.placement's callable alias and
    # gpu.nvml's NVML reader class, so an import decided which of the two a reader of the code was looking at.
    where: dict[str, list[str]] = {}
    for path in package_modules():
        for name, what in defined_types(path).items():
            where.setdefault(name, []).append(f"{path.relative_to(ROOT)} ({what})")
    twice = {name: places for name, places in where.items() if len(places) > 1 and name not in SHARED_NAMES}
    assert not twice, twice



def layout_modules() -> list[tuple[int, str]]:
    """Each module docs/ARCHITECTURE.md's layout names, as a path under the repository, with its line: a name is
    read in the package its line (or the entry it continues) sits in, by indentation."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text().splitlines()
    start = text.index("## Layout: packages named for their jobs")
    block = text[start:]
    first = block.index("```") + 1
    block = block[first:first + block[first:].index("```")]
    stack: list[tuple[int, str]] = []
    named = []
    for offset, line in enumerate(block):
        indent = len(line) - len(line.lstrip(" "))
        head = re.match(r"(\w+)/(\s|$)", line.lstrip(" "))
        entry = head or re.match(r"\w+\.py\s", line.lstrip(" "))
        if entry:
            while stack and stack[-1][0] >= indent:
                stack.pop()
            if head:
                stack.append((indent, head.group(1)))
        where = "/".join(name for _, name in stack)
        for token in re.findall(r"(?<![\w./`])([\w/]+\.py)\b", line):
            named.append((start + first + offset + 1, f"{where}/{token}" if "/" not in token else f"autotuner/{token}"))
    return named


def test_the_architecture_page_names_only_modules_that_exist():
    # It listed spec/gpus.py, which never existed (the GPU readers are gpu/nvml.py and backends/local/gpus.py).
    missing = [f"docs/ARCHITECTURE.md:{line}: {path}" for line, path in layout_modules()
               if not (ROOT / path).is_file()]
    assert layout_modules(), "no module read from the layout"
    assert not missing, missing
