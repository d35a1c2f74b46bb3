"""The package's rooms (docs/architecture.md): a short ground floor, every folder saying its role, and the import
contracts in pyproject.toml kept, as import-linter (a real tool, not a script of ours) checks them."""

from __future__ import annotations

import ast
import dataclasses
import os
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
