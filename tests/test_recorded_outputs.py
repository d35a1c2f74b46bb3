"""What users see does not change by accident: every recorded command (tests/compare_outputs.py `recorded`) prints
byte for byte what tests/recorded/ holds, paths, durations and eaglectl's version masked. A change meant to alter an
output records it again (`python tests/compare_outputs.py --record`) and the diff shows what changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from .compare_outputs import RECORDINGS, masked, recorded, recording, recording_name, run
from .conftest import ROOT

_PLACEHOLDER = Path("/nonexistent-eaglectl-scratch")  # the scratch folder's place in the list, replaced per test


def test_every_recording_belongs_to_a_recorded_command():
    names = {recording_name(a) for a in recorded(_PLACEHOLDER)}
    assert len(names) == len(recorded(_PLACEHOLDER)), "two commands share a recording name"
    assert names == {p.name for p in RECORDINGS.iterdir()}, "run python tests/compare_outputs.py --record"


@pytest.mark.slow
@pytest.mark.parametrize("argv", recorded(_PLACEHOLDER), ids=lambda a: recording_name(a)[:-4])
def test_the_output_is_the_recorded_one(argv, tmp_path):
    argv = [a.replace(str(_PLACEHOLDER), str(tmp_path)) for a in argv]
    code, out = run(argv, ROOT, tmp_path)
    want = (RECORDINGS / recording_name(argv)).read_text()
    assert recording(code, masked(out, tmp_path)) == want, f"{' '.join(argv)}: the output changed (see the diff)"
