"""The committed fixtures are exactly what fixtures/make_fixtures.py writes."""

from __future__ import annotations

import json
import subprocess
import sys

from .conftest import DRAFTERS, FIXTURES, ROOT
from .helpers import fixture_generator


def test_committed_fixtures_match_their_manifest():
    committed = json.loads((FIXTURES / "MANIFEST.json").read_text())
    assert fixture_generator().manifest(FIXTURES) == committed


def test_the_generators_table_names_every_dialect_fixture():
    """tests/test_verify.py reads which fixtures hold the same weights from this table (only fp8 is built apart)."""
    assert set(fixture_generator().DIALECT_FIXTURES) | {"speculators-fp8"} == {p.name for p in DRAFTERS.iterdir()}


def test_regenerating_gives_the_same_content(tmp_path):
    subprocess.run([sys.executable, str(FIXTURES / "make_fixtures.py"), "--out", str(tmp_path)], check=True,
                   cwd=ROOT, capture_output=True)
    assert json.loads((tmp_path / "MANIFEST.json").read_text()) == json.loads((FIXTURES / "MANIFEST.json").read_text())
