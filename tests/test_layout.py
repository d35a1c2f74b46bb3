"""Human output piped at 80 columns (a CI log): identifiers whole on one line, paths short."""

from __future__ import annotations

import json
import os

import pytest

from eaglectl.cli import report
from eaglectl.text import grid, short_path

from .conftest import FIXTURES, ROOT

T = FIXTURES / "trained"
D = FIXTURES / "drafters"
# vanilla-draft is a target-shaped draft model: inspect refuses it as "looks like a target model"
REAL = sorted(p for p in [*T.iterdir(), *D.iterdir()]
              if p.is_dir() and not p.name.startswith("target") and p.name != "vanilla-draft")


@pytest.fixture
def width80(monkeypatch):
    monkeypatch.setattr(report.stdout, "width", 80)
    monkeypatch.chdir(ROOT)


@pytest.fixture(params=[80, 120], ids=["80-columns", "120-columns"])
def width(request, monkeypatch):
    """Human output piped at 80 and at 120 columns (Rich reads COLUMNS only on a terminal)."""
    monkeypatch.setattr(report.stdout, "width", request.param)
    monkeypatch.chdir(ROOT)
    return request.param


def _names(doc):
    """Identifiers a document mentions: rule ids, dialects, tensor names, locators, stage names."""
    out = set()

    def walk(v, key=None):
        if isinstance(v, dict):
            if "score" in v and v["score"] is None:
                return  # a dialect that does not fit: not shown
            if v.get("severity") == "info" or "rule_severity" in v:
                return  # info findings (and the other engine's, listed in other_engine_findings): shown with -v only
            for k, x in v.items():
                walk(x, k)
        elif isinstance(v, list):
            for x in v:
                walk(x, key)
        elif isinstance(v, str) and key in {"rule_id", "dialect", "source_dialect", "dest_dialect", "locator",
                                            "dest", "name", "id"} and " " not in v:
            out.add(v)

    walk(doc)
    return out


def _assert_whole(invoke, *args, pick=_names):
    human = invoke(*args)
    machine = invoke(*args, "--json")
    lines = human.stdout.splitlines()
    names = {n for n in pick(json.loads(machine.stdout)) if not os.path.isabs(n)}
    assert names, args
    for name in names:
        assert any(name in line for line in lines), (name, args, human.stdout)
    return human


@pytest.mark.parametrize("drafter", REAL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_inspect_and_convert_keep_names_whole(invoke, width, tmp_path, drafter):
    r = _assert_whole(invoke, "inspect", drafter.relative_to(ROOT), "--allow-pickle")
    assert len(r.stdout.splitlines()) <= 45  # a summary and the findings; -v for the spec table
    to = "modelopt" if "mla" not in drafter.name else "speculators"
    conv = invoke("convert", drafter.relative_to(ROOT), tmp_path / "o", "--to", to, "--dry-run",
                  "--target", T / ("target-mla" if "mla" in drafter.name else "target"), "--allow-pickle", "--no-measure", "--json")
    if conv.exit_code == 0:
        _assert_whole(invoke, "convert", drafter.relative_to(ROOT), tmp_path / "o", "--to", to, "--dry-run",
                      "--target", T / ("target-mla" if "mla" in drafter.name else "target"), "--allow-pickle", "--no-measure")


def test_every_other_command_keeps_names_whole_at_80_columns(invoke, width80, tmp_path):
    _assert_whole(invoke, "formats", pick=lambda doc: {d["id"] for d in doc["dialects"]})
    _assert_whole(invoke, "rules")
    _assert_whole(invoke, "check", "fixtures/trained/eagle3", "fixtures/defects/aux-ids-range",
                  pick=lambda doc: {i["source"] for i in doc["items"]})
    _assert_whole(invoke, "check", "fixtures/defects/aux-ids-range", pick=lambda doc: {s["name"] for s in doc["stages"]} | {
        f["rule_id"] for f in doc["findings"] if f["severity"] != "info"})
    _assert_whole(invoke, "verify", "fixtures/trained/eagle3", "--tokens", "4", "--steps", "1")
    _assert_whole(invoke, "upgrade", "fixtures/drafters/speculators-3", tmp_path / "u", "--dry-run", "--no-fidelity")
    smoke = invoke("smoke", "fixtures/trained/eagle3", "--target", "fixtures/trained/target", "--engine", "reference",
                   "--num-prompts", "1", "--max-tokens", "4", "--baseline", "none,eagle3:fixtures/trained/eagle3.1")
    assert smoke.exit_code == 0, smoke.stderr
    assert any("eagle3:fixtures/trained/eagle3.1" in line for line in smoke.stdout.splitlines()), smoke.stdout
    assert max(len(line) for line in smoke.stdout.splitlines() if "--" not in line) <= 80, smoke.stdout


def test_prose_wraps_at_spaces_and_records_when_names_cannot_fit():
    long_id = "aux-ids-output-convention"
    lines = grid(["rule", "message"], [(long_id, "word " * 40)], width=40, prose=["message"])
    assert any(long_id in line for line in lines) and all(len(line) <= 40 for line in lines)
    tensor = "model.layers.0.self_attn.q_proj.weight.very_long_name_indeed"
    lines = grid(["severity", "rule", "where", "message"], [("error", long_id, tensor, "a b c")], width=40,
                 prose=["message"])
    assert any(long_id in line for line in lines) and any(line.strip() == tensor for line in lines)  # stacked, whole


def test_short_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert short_path(tmp_path / "a" / "b") == os.path.join("a", "b")
    hub = "/root/.cache/huggingface/hub/models--yuhuili--EAGLE3-LLaMA3.1-Instruct-8B/snapshots/0123abcd"
    assert short_path(hub) == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    assert short_path(hub + "/sub") == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B/sub"
    far = "/very/long/path/somewhere/else/on/disk/drafter/head"
    assert short_path(far) == far  # never cut: a locator must open as printed
    monkeypatch.setenv("HOME", "/home/user")
    assert short_path("/home/user/models/drafter/config.json") == "~/models/drafter/config.json"
    assert short_path("/home/username/x") == "/home/username/x"
    assert short_path("org/name") == "org/name" and short_path("/opt/x") == "/opt/x"


def test_records_keep_a_header_when_the_identifiers_fit():
    """A numeric table whose prose column cannot fit still says which number is which (smoke in a CI log)."""
    rows = [["draft_model:vanilla-draft-long-name", "3.207", "324", "0.81 / 0.73 / 0.66"],
            ["eagle3:eagle3-upgraded", "3.087", "333", "0.82 / 0.69 / 0.58"]]
    lines = [report.printable(line).replace("[bold]", "").replace("[/]", "")
             for line in grid(["config", "AL", "drafts", "per position"], rows, width=50, prose=["per position"])]
    assert lines[0].split() == ["config", "AL", "drafts"] and lines[1].strip() == "per position"
    assert lines[2].split() == rows[0][:3] and lines[3].strip() == rows[0][3]
    assert lines[2].index("3.207") == lines[4].index("3.087") == lines[0].index("AL")


# --------------------------------------------------------------- commands and identifiers never wrap (issue 23)

DEFECTS = FIXTURES / "defects"
PAIRS = [(d, FIXTURES / "target-llama") for d in sorted(DEFECTS.iterdir())] + [
    (d, FIXTURES / "target-llama") for d in sorted(D.iterdir())] + [
    (T / "eagle3", T / "target"), (T / "eagle3-output", T / "target"), (T / "eagle3.1-mla", T / "target-mla")]


def _one_line(command, lines):
    return any(command in line for line in lines)


def _printed(doc):
    """Every command a JSON document holds (finding hints, the serve line, rule fixes)."""
    from eaglectl.text import COMMAND

    texts = [f.get("hint") for f in doc.get("findings", []) if f.get("severity") != "info"]  # info is hidden
    texts += [r.get("hint") for r in doc.get("rules", [])]
    out = [m.group() for t in texts if t for m in COMMAND.finditer(t)]
    out += [c for c in ((doc.get("recommendation") or {}).get("command"), doc.get("serve_fix")) if c]
    return out + ([doc["serve_command"]] if doc.get("serve_command") else [])


@pytest.mark.parametrize("source,target", PAIRS, ids=[f"{s.parent.name}/{s.name}" for s, _ in PAIRS])
def test_every_printed_command_is_one_line(invoke, width, source, target):
    """Piped at 80 or 120 columns, a fix pastes as one command: `eaglectl convert X DEST --to speculators
    --target T` never loses `--target T` to the next line (where a shell would run it as a command)."""
    pickle = ["--allow-pickle"] if source.name.endswith("-bin") else []
    for command in ("inspect", "check"):
        args = [command, source.relative_to(ROOT), "--target", target.relative_to(ROOT), "--no-measure", *pickle]
        args += ["--no-card"] if command == "check" else []
        human, machine = invoke(*args), invoke(*args, "--json")
        if machine.exit_code not in (0, 1):
            continue  # refused before a report (corrupt input): one line on stderr
        lines = human.stdout.splitlines()
        printed = _printed(json.loads(machine.stdout))
        for command_line in printed:
            assert _one_line(command_line, lines), (width, command_line, human.stdout)
        for line in lines:  # longer than the width only for a command or an identifier that cannot break
            assert len(line) <= width or any(p in line for p in printed) or "vllm serve" in line or any(
                len(w) > width - 8 for w in line.split()), (width, line, human.stdout)


def test_the_rule_catalogue_prints_each_fix_command_whole(invoke, width):
    human, machine = invoke("rules"), invoke("rules", "--json")
    lines = human.stdout.splitlines()
    for printed in _printed(json.loads(machine.stdout)):
        assert _one_line(printed, lines), (width, printed)


def test_messages_keep_a_minimum_width_and_identifiers_stack():
    from eaglectl.text import MIN_PROSE

    where = "fixtures/drafters/specforge-3.1/config.json:speculators_config.verifier.name_or_path"
    rows = [("warning", "specforge-norm-output-window", where, "word " * 30)]
    lines = [report.printable(x).replace("[bold]", "").replace("[/]", "") for x in
             grid(["severity", "rule", "where", "message"], rows, width=120, prose=["message"])]
    message = [x for x in lines if "word" in x]
    assert all(len(x.strip()) >= MIN_PROSE for x in message[:-1]), lines  # never a 28-column sliver
    assert any(where in x for x in lines)
    narrow = grid(["severity", "rule", "where", "message"], rows, width=60, prose=["message"])
    assert any(x.strip() == where for x in narrow) and any("specforge-norm-output-window" in x for x in narrow)
    assert all("speculators_c" not in x or where in x for x in narrow), narrow  # no fold inside the path


def test_a_command_in_prose_is_one_unit():
    from eaglectl.text import wrap_words

    fix = ("for vLLM: eaglectl convert fixtures/drafters/specforge-3.1 DEST --to speculators --target "
           "fixtures/target-llama (translates them)")
    lines = wrap_words(fix, 40)
    assert "eaglectl convert fixtures/drafters/specforge-3.1 DEST --to speculators --target fixtures/target-llama" \
        in lines and lines[0] == "for vLLM:" and lines[-1] == "(translates them)"


def test_the_tensors_line_breaks_between_items_only(invoke, width80):
    r = invoke("inspect", "fixtures/drafters/specforge-3.1")
    lines = r.stdout.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("tensors  "))
    dtypes = next(x for x in lines[at:at + 3] if "dtypes" in x)
    assert "BF16×16, BOOL×1, I64×1" in dtypes and all(len(x) <= 80 for x in lines[at:at + 2])
    r = invoke("-q", "inspect", "fixtures/defects/aux-ids-range", "--target", "fixtures/trained/target-mla",
               "--no-measure")
    assert len(r.stdout.splitlines()) == 1  # the -q result line is one line, however long
