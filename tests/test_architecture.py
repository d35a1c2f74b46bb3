"""The package's rooms (docs/architecture.md): a short ground floor, every folder saying its role, and the import
contracts in pyproject.toml kept, as import-linter (a real tool, not a script of ours) checks them."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

PACKAGE = ROOT / "eaglectl"


def test_the_ground_floor_holds_at_most_eight_modules():
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(top) <= 8, top


def test_every_folder_says_its_role_in_its_init():
    for folder in sorted(p for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__"):
        if not any(folder.glob("*.py")) or folder.name == "workers":  # data, or standalone scripts
            continue
        init = folder / "__init__.py"
        assert init.is_file(), f"{folder} has no __init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and doc.strip(), f"{init}: no docstring saying the folder's role"


def test_the_import_contracts_are_kept():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.skip("import-linter is not installed in this interpreter (pip install -e '.[test]')")
    r = subprocess.run([lint, str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout and "Contracts: 3 kept" in r.stdout, r.stdout[-2000:]
