"""The committed fixtures are exactly what fixtures/make_fixtures.py writes."""

from __future__ import annotations

import json
import subprocess
import sys

from .conftest import FIXTURES, ROOT


def _manifest_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_fixtures"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_committed_fixtures_match_their_manifest():
    committed = json.loads((FIXTURES / "MANIFEST.json").read_text())
    assert _manifest_module().manifest(FIXTURES) == committed


def test_regenerating_gives_the_same_content(tmp_path):
    subprocess.run([sys.executable, str(FIXTURES / "make_fixtures.py"), "--out", str(tmp_path)], check=True,
                   cwd=ROOT, capture_output=True)
    assert json.loads((tmp_path / "MANIFEST.json").read_text()) == json.loads((FIXTURES / "MANIFEST.json").read_text())
