"""`Any` only where a third-party API forces it (mypy's strict settings check the rest, in pyproject.toml).

mypy accepts `Any` anywhere, so nothing else would notice one added where a real type exists. A parsed JSON
value is `autotuner.jsonvalues.JSON`; each module below holds the package's other uses, for the reason given.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "autotuner"

ALLOWED = {
    "jsonvalues.py": "the JSON alias itself: json.loads and hjson return Any",
    "__init__.py": "the lazy face's __getattr__",
    "views/__init__.py": "the lazy face's __getattr__",
    "backends/ssh/pool.py": "fabric and paramiko have no type information",
    "backends/ssh/hostkeys.py": "paramiko has no type information",
    "backends/ssh/process.py": "paramiko has no type information",
    "backends/ssh/sftp.py": "paramiko and fabric have no type information",
    "gpu/nvml.py": "pynvml has no type information",
    "backends/cluster.py": "pynvml has no type information",
    "backends/local/peaks.py": "pynvml has no type information",
    "backends/ray/leases.py": "Ray is handed in as a ModuleType: what it returns is Any",
    "backends/ray/backend.py": "Ray is handed in as a ModuleType: what it returns is Any",
    "cli/app.py": "typer.Option returns Any",
    "cli/bundles.py": "typer.Option returns Any; a bundle stands where one would",
    "cli/goal.py": "a bundle stands where typer's options would (as in cli/bundles.py)",
    "cli/entry.py": "click's usage error, of whichever click typer carries",
    "cli/reference.py": "click's commands and parameters, of whichever click typer carries",
    "views/records.py": "pandas has no type information",
    "ledger/rows.py": "sqlite3 gives a row's values as Any",
}


def uses_of_any(source: str) -> list[int]:
    """Lines where the code names typing.Any (as `Any` or `typing.Any`), imports aside."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Name) and node.id == "Any") or (isinstance(node, ast.Attribute)
                                                                 and node.attr == "Any"):
            lines.append(node.lineno)
    return lines


def test_uses_of_any_are_found_in_annotations_aliases_and_attributes():
    source = "from typing import Any\nimport typing\nX = Any\ndef f(a: dict[str, Any]) -> typing.Any: ...\n"
    assert uses_of_any(source) == [3, 4, 4]
    assert uses_of_any("'''Any text'''\n# Any comment\nx: 'Any' = 1\n") == []


def test_any_only_where_a_third_party_api_forces_it():
    found = {str(path.relative_to(PACKAGE)): uses_of_any(path.read_text())
             for path in sorted(PACKAGE.rglob("*.py"))}
    found = {name: lines for name, lines in found.items() if lines}
    assert {name: lines for name, lines in found.items() if name not in ALLOWED} == {}, \
        "Any where a real type exists: use it, or jsonvalues.JSON for a parsed JSON value"
    assert sorted(set(ALLOWED) - set(found)) == [], "no Any left there: take it off ALLOWED"
