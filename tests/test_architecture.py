"""The package's rooms (docs/architecture.md): a short ground floor, every folder saying its role, and the import
contracts in pyproject.toml kept, as import-linter (a real tool, not a script of ours) checks them."""

from __future__ import annotations

import ast
import dataclasses
import os
import re
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
    """Never skipped: import-linter is a test requirement, and a missing one fails here (make test installs it)."""
    r = _lint(ROOT)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout and "Contracts: 3 kept" in r.stdout, r.stdout[-2000:]


def test_no_library_function_takes_more_than_twelve_parameters():
    """Options cross the library seam as one request (commands/requests.py), not as long keyword lists."""
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs) if x.arg not in ("self", "cls")]
                if len(names) > 12:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({len(names)})")
    assert not long, long


def test_every_command_builds_one_request_whose_defaults_are_the_command_lines():
    """Each option the command line gives a request has the request's default (defined once), and every option
    of a command is a field of its request: nothing the user types is dropped on the way to the library."""
    import click

    from eaglectl.cli.app import cli
    from eaglectl.commands import requests

    kinds = {"inspect": requests.InspectRequest, "convert": requests.ConvertRequest,
             "upgrade": requests.UpgradeRequest, "verify": requests.VerifyRequest, "diff": requests.DiffRequest,
             "smoke": requests.SmokeRequest, "check": requests.CheckRequest, "capture": requests.CaptureRequest,
             "drift": requests.DriftRequest, "upload": requests.UploadRequest}
    batch = {"manifest", "fail_fast", "sources"}
    for name, kind in kinds.items():
        fields = {f.name: f for f in dataclasses.fields(kind)}
        if kind is requests.UploadRequest:  # the gate's options are CheckRequest's
            fields.update({f.name: f for f in dataclasses.fields(requests.CheckRequest)})
        ctx = click.Context(cli.commands[name])
        for p in cli.commands[name].params:
            if not p.expose_value or p.name in batch:
                continue
            assert p.name in fields, f"{name}: --{p.name} is not a field of {kind.__name__}"
            default = p.get_default(ctx, call=True)
            if not isinstance(default, (str, int, float, tuple)) or p.name == "baselines":
                continue  # none (click's unset): the request's default applies; baselines: the parsed 'none'
            assert fields[p.name].default is not dataclasses.MISSING, f"{name} --{p.name}: a default for a must"
            want = fields[p.name].default
            got = p.type_cast_value(ctx, default) if isinstance(default, str) else default
            assert got == want, f"{name} --{p.name}: the command line's default {got!r}, the request's {want!r}"


# a command that runs no weights never imports torch, transformers or vLLM (they cost seconds and hundreds of MB)
_NO_WEIGHTS = (
    ("inspect", "{trained}/eagle3"),
    ("inspect", "{trained}/eagle3", "--target", "{config_only}"),
    ("convert", "{trained}/eagle3", "{tmp}/a", "--to", "speculators", "--target", "{config_only}"),
    ("convert", "{trained}/eagle3", "{tmp}/b", "--to", "modelopt", "--dtype", "bfloat16", "--target", "{config_only}"),
    ("diff", "{trained}/eagle3", "{trained}/eagle3-output"),
    ("rules",),
)


@pytest.mark.parametrize("args", _NO_WEIGHTS, ids=lambda a: " ".join(a[:1] + a[-2:]))
def test_a_command_that_runs_no_weights_imports_no_torch(args, tmp_path):
    config_only = tmp_path / "target"
    config_only.mkdir()
    shutil.copy(ROOT / "fixtures" / "trained" / "target" / "config.json", config_only)
    argv = [a.format(trained=ROOT / "fixtures" / "trained", config_only=config_only, tmp=tmp_path) for a in args]
    code = ("import runpy, sys\nsys.argv = ['eaglectl', *sys.argv[1:]]\ntry:\n"
            "    runpy.run_module('eaglectl', run_name='__main__')\nexcept SystemExit as e:\n    code = e.code\n"
            "print('IMPORTED', code, sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))")
    env = {**os.environ, "EAGLECTL_VLLM_PYTHON": str(tmp_path / "no-vllm")}  # the tables
    r = subprocess.run([sys.executable, "-c", code, *argv, "--json"], capture_output=True, text=True, cwd=ROOT,
                       env=env)
    line = r.stdout.strip().splitlines()[-1]
    assert line.startswith("IMPORTED") and line.split(" ", 2)[1] in ("0", "1"), r.stdout[-500:] + r.stderr[-2000:]
    assert line.endswith("[]"), line


# ------------------------------------------------------------------------------------------ sizes, pinned

MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80
# a module or function that is better long, with the reason (empty: none is)
LONG_ALLOWED: dict[str, str] = {}


def oversized(root: Path) -> list[str]:
    """Every module over MAX_MODULE_LINES and every function over MAX_FUNCTION_LINES under `root` (allow-list aside),
    as 'path:line name (n lines)'."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        text = path.read_text()
        n = len(text.splitlines())
        if n > MAX_MODULE_LINES and rel not in LONG_ALLOWED:
            out.append(f"{rel} ({n} lines)")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if length > MAX_FUNCTION_LINES and f"{rel}:{node.name}" not in LONG_ALLOWED:
                    out.append(f"{rel}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_no_module_passes_600_lines_and_no_function_80():
    assert not oversized(PACKAGE), oversized(PACKAGE)


def test_the_size_check_finds_a_planted_long_function_and_module(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def planted():\n{body}\n")
    (tmp_path / "big.py").write_text("\n".join(f"y{i} = {i}" for i in range(MAX_MODULE_LINES + 1)) + "\n")
    found = oversized(tmp_path)
    assert any(f.startswith("long.py:1 planted") for f in found) and "big.py (601 lines)" in found, found


# ---------------------------------------------------------------------------- the contracts fail when they should

def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint is not None, "import-linter is not installed in this interpreter (pip install -e '.[test]')"
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([lint, str(root / "pyproject.toml"), "--no-cache"], cwd=root,
                          capture_output=True, text=True, timeout=600, env=env)


def test_typing_only_imports_count_for_cycles_and_layers():
    """A cycle hidden behind `if TYPE_CHECKING:` is still a cycle (a reader follows it as any other import)."""
    text = (ROOT / "pyproject.toml").read_text()
    assert "exclude_type_checking_imports = false" in text


@pytest.mark.parametrize("planted", ["torch in rules", "an upward import", "a cycle", "a typing-only cycle"])
def test_the_contracts_break_on_a_planted_violation(planted, tmp_path):
    """Each contract of pyproject.toml fails on a violation planted in a copy of the package."""
    copy = tmp_path / "tree"
    shutil.copytree(PACKAGE, copy / "eaglectl", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    pkg = copy / "eaglectl"
    if planted == "torch in rules":
        (pkg / "rules" / "planted.py").write_text("import torch  # noqa: F401\n")
        (pkg / "rules" / "__init__.py").write_text((pkg / "rules" / "__init__.py").read_text()
                                                  + "from . import planted  # noqa: E402, F401\n")
    elif planted == "an upward import":
        (pkg / "io" / "planted.py").write_text("from ..commands import inspect  # noqa: F401\n")
    elif planted == "a cycle":
        (pkg / "io" / "planted_a.py").write_text("from . import planted_b  # noqa: F401\n")
        (pkg / "io" / "planted_b.py").write_text("from . import planted_a  # noqa: F401\n")
    else:
        (pkg / "io" / "planted_a.py").write_text("from . import planted_b  # noqa: F401\n")
        (pkg / "io" / "planted_b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                 "    from . import planted_a  # noqa: F401\n")
    r = _lint(copy)
    assert r.returncode != 0 and "BROKEN" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]


# ------------------------------------------------------------------------------- laziness at one boundary

HEAVY = ("torch", "transformers", "vllm", "sglang", "huggingface_hub", "matplotlib", "pyarrow", "gguf", "llama_cpp",
         "rich")  # what a light command must not pay for (seconds, hundreds of MB)
LAZY_BOUNDARY = "cli/table.py"  # the command table: a command's library module is imported when it runs


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level:
        base = base[: len(base) - (node.level - 1)]
        name = ".".join(base) + (f".{node.module}" if node.module else "")
    else:
        name = node.module or ""
    return [name] + [f"{name}.{a.name}" for a in node.names if f"{name}.{a.name}" in known]


def function_level_imports(package: Path = PACKAGE) -> list[tuple[str, int, list[str]]]:
    """(module, line, names) of every import inside a function whose names are all light: neither a HEAVY package
    nor an eaglectl module that imports one at its top, directly or through others (TYPE_CHECKING blocks aside).
    Those may be imported lazily; anything else belongs at the top of its module."""
    files = {_module_name(p): p for p in package.rglob("*.py") if "workers" not in p.parts}
    top: dict[str, set[str]] = {m: set() for m in files}
    inner: list[tuple[str, int, list[str]]] = []
    for module, path in files.items():
        is_package = path.name == "__init__.py"

        def visit(node: ast.AST, depth: int) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    continue
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    names = _imported(module, is_package, child, set(files))  # noqa: B023
                    (top[module].update(names) if depth == 0 else  # noqa: B023
                     inner.append((module, child.lineno, names)))  # noqa: B023
                visit(child, depth + isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

        visit(ast.parse(path.read_text()), 0)
    heavy: dict[str, bool] = {}

    def is_heavy(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name.split(".")[0] in HEAVY:
            return True
        if name not in files or name in seen:
            return False
        if name not in heavy:
            heavy[name] = any(is_heavy(n, seen | {name}) for n in top[name])
        return heavy[name]

    boundary = _module_name(PACKAGE / LAZY_BOUNDARY) if package == PACKAGE else None
    return [(m, line, names) for m, line, names in inner
            if m != boundary and not any(is_heavy(n) for n in names)]


def test_laziness_stays_at_one_boundary():
    """A function imports lazily only what is heavy (HEAVY, or an eaglectl module that imports it); the command table
    imports each command's module when it runs. Every other import is at the top of its module."""
    light = function_level_imports()
    assert not light, [f"{m}:{line} imports {names[0]}" for m, line, names in light]


# ------------------------------------------------------------------------------- no name of a module that moved

def _is_module(parts: list[str]) -> bool:
    rel = ROOT.joinpath(*parts)
    return rel.with_suffix(".py").exists() or (rel / "__init__.py").exists()


def moved_modules() -> list[str]:
    """What docs/architecture.md's "What moved" tables name as gone: for each row's first `eaglectl...` name, its
    shortest prefix that is no module today (a capitalised part is a class of a module that stays: skipped)."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    gone = set()
    for row in re.findall(r"^\| `(eaglectl\.[\w.]+)`", doc, re.M):
        parts = row.split(".")
        for n in range(2, len(parts) + 1):
            if parts[n - 1][:1].isupper():
                break
            if not _is_module(parts[:n]):
                gone.add(".".join(parts[:n]))
                break
    return sorted(gone)


def stale_references(files: list[Path], base: Path = ROOT) -> list[str]:
    """'file:line name' for each mention of a module that moved away: its path (`engines/runners.py`), its dotted
    name (`eaglectl.engines.runners`, `engines.runners`), or its file name where no module has that name today."""
    current = {p.name for p in PACKAGE.rglob("*.py")}
    patterns = []
    for module in moved_modules():
        parts = module.split(".")[1:]
        names = [re.escape("eaglectl." + ".".join(parts)) + r"\b(?![/-])"]  # not a schema id (eaglectl.check/1)
        if len(parts) > 1:
            names += [re.escape("/".join(parts) + ".py"), re.escape(".".join(parts)) + r"\b"]
        if parts[-1] + ".py" not in current:
            names.append(re.escape(parts[-1] + ".py"))
        patterns.append(re.compile(r"(?<![\w./])(?:" + "|".join(names) + ")"))
    out = []
    for path in files:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            out += [f"{path.relative_to(base)}:{i} {m.group()}" for p in patterns if (m := p.search(line))]
    return out


def test_no_docstring_or_page_names_a_module_that_moved():
    gone = moved_modules()
    assert {"eaglectl.engines.runners", "eaglectl.conversion_plan", "eaglectl.checkpoint.family"} <= set(gone), gone
    files = [*PACKAGE.rglob("*.py"), *(p for p in (ROOT / "docs").glob("*.md") if p.name != "architecture.md")]
    assert not stale_references(files), stale_references(files)


def test_a_planted_stale_reference_is_found(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('"""Read by engines/runners.py as conversion_plan.py wrote it; see eaglectl.checkpoint.family '
                       'and engines.dflash (not rules/runners.py, measure/reading.py, vllm_smoke.py)."""\n')
    found = [line.split(" ", 1)[1] for line in stale_references([planted], tmp_path)]
    assert sorted(found) == ["conversion_plan.py", "eaglectl.checkpoint.family", "engines.dflash",
                             "engines/runners.py"], found
