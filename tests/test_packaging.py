"""The package as the index would see it: its name (free there, not the other projects' `autotuner` or
`autotune`), one version, a licence, honest metadata; and `autotune --version`."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from email.parser import Parser
from pathlib import Path

import autotuner

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
NAME = PYPROJECT["project"]["name"]


def test_version_is_the_packages_one():
    for command in (["-m", "autotuner", "--version"], ["-m", "autotuner.cli", "--version"]):
        result = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0 and result.stdout == f"autotune {autotuner.__version__}\n", result


def built_metadata(tmp_path: Path) -> Path:
    """The dist-info the build backend makes from a copy of the source tree (what a wheel would carry)."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "autotuner", tree / "autotuner", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "meta").mkdir()
    code = ("import sys; from setuptools import build_meta\n"
            "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "meta")], cwd=tree, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return tmp_path / "meta" / out.stdout.strip().splitlines()[-1]


def test_the_built_metadata_names_the_distribution_its_version_licence_and_command(tmp_path):
    dist_info = built_metadata(tmp_path)
    meta = Parser().parsestr((dist_info / "METADATA").read_text())
    assert meta["Name"] == NAME == "ds-autotune"
    assert meta["Version"] == autotuner.__version__  # one place: autotuner/__init__.py
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["Requires-Python"] == ">=3.11"
    classifiers = meta.get_all("Classifier")
    assert "Programming Language :: Python :: 3.11" in classifiers and "Typing :: Typed" in classifiers
    assert "deepspeed" in meta["Keywords"]
    assert "autotune = autotuner.__main__:main" in (dist_info / "entry_points.txt").read_text()
    licence = next(dist_info.rglob("LICENSE")).read_text()
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in licence


def test_the_python_versions_said_are_the_ones_checked():
    """requires-python, the version mypy checks against and ruff's target agree (CI runs 3.11)."""
    lowest = re.fullmatch(r">=3\.(\d+)", PYPROJECT["project"]["requires-python"]).group(1)
    assert PYPROJECT["tool"]["mypy"]["python_version"] == f"3.{lowest}"
    assert PYPROJECT["tool"]["ruff"]["target-version"] == f"py3{lowest}"
    assert sys.version_info >= (3, int(lowest))


def test_every_install_line_names_this_distribution():
    """`pip install 'autotuner[plots]'` would install another project's code: every hint says ours."""
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "autotuner").rglob("*.py"))]
    named = {(path.name, m.group(1)) for path in texts
             for m in re.finditer(r"pip install '?([A-Za-z0-9_.-]+)\\*\[", path.read_text())}
    assert named and all(name == NAME for _, name in named), named
