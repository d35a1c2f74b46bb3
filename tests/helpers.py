"""Shared test helpers: a fixture copied and edited, and a CLI run read as JSON."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

Config = Mapping[str, Any] | Callable[[dict[str, Any]], object]
Tensors = Mapping[str, torch.Tensor | None] | Callable[[dict[str, torch.Tensor]], object]


def edited(fixture: str | Path, tmp_path: Path, *, name: str | None = None, config: Config | None = None,
           tensors: Tensors | None = None, metadata: dict[str, str] | None = None,
           weights: str = "model.safetensors", files: Mapping[str, str] | None = None) -> Path:
    """FIXTURE copied to TMP_PATH/NAME (NAME: the fixture's own folder name), then edited.

    `config`: a mapping merged into config.json (`dict.update`), or a function that edits the parsed config in
    place (what it returns is ignored). `tensors`: a mapping name -> tensor (None removes the tensor), or a function
    that edits the whole state in place or returns a new dict; written back to WEIGHTS with the file's own metadata
    (or `metadata`). `files`: name -> text, written into the copy (a card, a note)."""
    dest = tmp_path / (name or Path(fixture).name)
    shutil.copytree(fixture, dest)
    if config is not None:
        path = dest / "config.json"
        cfg = json.loads(path.read_text())
        if callable(config):
            config(cfg)
        else:
            cfg.update(config)
        path.write_text(json.dumps(cfg))
    if tensors is not None:
        path = dest / weights
        with safe_open(str(path), "pt") as f:
            state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (a safe_open handle, not a dict)
            kept = f.metadata()
        if callable(tensors):
            new = tensors(state)
            state = new if isinstance(new, dict) else state
        else:
            for key, value in tensors.items():
                if value is None:
                    del state[key]
                else:
                    state[key] = value
        save_file(state, str(path), metadata=kept if metadata is None else metadata)
    for file, text in (files or {}).items():
        (dest / file).parent.mkdir(parents=True, exist_ok=True)
        (dest / file).write_text(text)
    return dest


def fixture_generator():
    """fixtures/make_fixtures.py as a module (its tables say what each generated fixture holds)."""
    if "make_fixtures" not in sys.modules:
        spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["make_fixtures"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["make_fixtures"]


def same_weights(held: str) -> list[str]:
    """The drafter fixtures that hold drafter HELD (make_fixtures' name: d3, d31, ...), each in its own layout."""
    return [name for name, (h, _) in fixture_generator().DIALECT_FIXTURES.items() if h == held]


def config_of(folder: str | Path) -> dict[str, Any]:
    return json.loads((Path(folder) / "config.json").read_text())


def unreadable(path: Path, kind: str, limit_name: str) -> str:
    """Make PATH a FIFO ("fifo"), a link to a device (a path such as "/dev/zero") or a sparse file one byte over
    the limit LIMIT_NAME ("big"); what the refusal says about it."""
    import os

    from eaglectl.limits import limit

    if kind == "fifo":
        os.mkfifo(path)
        return "not a regular file (a FIFO); it is not read"
    if kind == "big":
        with path.open("wb") as f:
            f.truncate(limit(limit_name) + 1)  # sparse
        return f"{limit(limit_name) + 1} bytes exceeds the {limit(limit_name)}-byte limit"
    path.symlink_to(kind)
    return "not a regular file (a device); it is not read"


def run_json(invoke: Callable[..., Any], *args: Any, code: int | None = None) -> tuple[Any, dict[str, Any]]:
    """The CLI run with `--json` (added when ARGS lack it): (click result, parsed stdout). With `code`, the exit code
    is asserted first (the output in the message)."""
    argv = [*args] if "--json" in [str(a) for a in args] else [*args, "--json"]
    r = invoke(*argv)
    if code is not None:
        assert r.exit_code == code, r.stdout[-3000:] + r.stderr[-3000:]
    return r, json.loads(r.stdout)


# ------------------------------------------------------------------ the library calls, as the tests write them
# Each command's one library call takes its request (commands/requests.py); these build it from the positional
# names and keyword options the tests pass (fields of the request), as the command line does.

def _call(module: str, kind: str, *names: str) -> Callable[..., Any]:
    def call(*args: Any, progress: Any = None, **options: Any) -> Any:
        import importlib

        from eaglectl.commands import requests
        from eaglectl.progress import passthrough

        req = getattr(requests, kind)(**dict(zip(names, args, strict=False)), **options)
        return importlib.import_module(f"eaglectl.commands.{module}").run(req, progress or passthrough)

    return call


inspect_checkpoint = _call("inspect", "InspectRequest", "source")
convert_run = _call("convert.command", "ConvertRequest", "source", "dest", "to")
upgrade_run = _call("upgrade.command", "UpgradeRequest", "source", "dest")
smoke = _call("smoke.command", "SmokeRequest", "drafter", "target")
capture_run = _call("capture", "CaptureRequest", "target", "out")
verify_run = _call("verify", "VerifyRequest", "candidate")


def drift_run(drafters: list[str], **options: Any) -> Any:
    return _call("drift", "DriftRequest", "drafters")(tuple(drafters), **options)
