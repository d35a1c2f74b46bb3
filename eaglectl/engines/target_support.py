"""Target pre-flight: does vLLM capture EAGLE-3 aux states from this target at all?

vLLM captures them only from a target whose model class implements `SupportsEagle3`; for any other class
`vllm serve` stops after loading the weights with "Model does not support EAGLE3 interface". Where a vLLM
interpreter is at hand, `workers/vllm_reading.py` resolves the target's architecture through vLLM's own registry
(in the same run that reads the drafter) and reports its class, `supports_eagle3`, whether it is hybrid and its
layer count as vLLM counts them. Elsewhere the answer comes from `facts.TARGET_CAPTURE` at eaglectl's reference
release, labelled assumed. An architecture neither knows is undecided, never a failure (docs/engines.md).

No torch import here.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from .facts import REFERENCE, TARGET_TABLE_RELEASES, TargetCapture, target_capture

TARGET_ASSUMED = f"assumed (eaglectl's table of vLLM {TARGET_TABLE_RELEASES}, read in their wheels)"
KINDS = {"attention": "attention", "hybrid": "hybrid attention/recurrent", "recurrent": "recurrent (no attention)"}


def engines_own(basis: str) -> bool:
    """An answer that is vLLM's own: asked of it, or read from its code verified by hash (not assumed)."""
    return basis.startswith("asked") or "verified by hash" in basis


def said(basis: str, version: str, assumed: str = "assumed: eaglectl's table") -> str:
    """How an answer about vLLM is known, in a few words."""
    if basis.startswith("asked"):
        return f"asked of vLLM {version}"
    return f"vLLM {version}'s code, verified by hash" if engines_own(basis) else assumed


def release_key(version: str | None) -> tuple[int, ...] | None:
    """A release's numbers, three at least ("0.32.0+cpu" -> (0, 32, 0), "0.8" -> (0, 8, 0)); None when it names
    none."""
    m = re.match(r"[0-9]+(?:\.[0-9]+)*", version or "")
    if not m:
        return None
    key = tuple(int(x) for x in m.group().split("."))
    return key + (0,) * (3 - len(key))


def captures_in(row: TargetCapture, release: str) -> bool | None:
    """Whether `release` captures from the row's architecture (None: the release is not a version)."""
    key = release_key(release)
    if key is None:
        return None
    return row.since is not None and release_key(row.since) <= key  # type: ignore[operator]


@dataclass(frozen=True)
class TargetSupport:
    """Whether vLLM's model class for the target captures EAGLE-3 aux states (implements SupportsEagle3)."""

    architecture: str | None  # the target's config.json `architectures[0]` (as vLLM resolved it, when asked)
    model_class: str | None  # vLLM's class for it
    module: str | None  # the file that defines the class, under vllm/
    supports_eagle3: bool | None  # None: undecided
    kind: str | None  # attention | hybrid | recurrent (facts.TargetCapture.kind); None: unknown
    num_layers: int | None  # as vLLM counts them (ModelConfig.get_total_num_hidden_layers); asked only
    version: str  # the vLLM release the answer is for (asked: its version)
    basis: str  # "asked vLLM X (its own code)" | TARGET_ASSUMED
    since: str | None = None  # the first release that captures from it (the table), where one does
    error: str | None = None  # why vLLM could not answer (its exception), or why nothing could

    @property
    def asked(self) -> bool:
        return engines_own(self.basis)

    @property
    def later(self) -> str | None:
        """The release that adds the capture, when it is later than the one this answer is for."""
        since, now = release_key(self.since), release_key(self.version)
        return self.since if since is not None and now is not None and since > now else None

    def describe(self) -> str:
        """One human line (inspect's target section)."""
        kind = f" ({KINDS.get(self.kind, self.kind)})" if self.kind and self.kind != "attention" else ""
        who = f"vLLM class {self.model_class}{kind}" if self.model_class else \
            f"architecture {self.architecture or '(none named)'}"
        if self.supports_eagle3 is None:
            what = "EAGLE-3 capture undecided" + (f" ({self.error})" if self.error else "")
        elif self.supports_eagle3:
            what = "captures EAGLE-3 aux states (SupportsEagle3)"
        else:
            what = "no EAGLE-3 capture (no SupportsEagle3)" + (f", from vLLM {self.later}" if self.later else "")
        layers = f"; {self.num_layers} layers as vLLM counts them" if self.num_layers is not None else ""
        basis = f"asked vLLM {self.version}" if self.basis.startswith("asked") else said(self.basis, self.version)
        return f"{who}: {what}{layers}; {basis}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def table_support(config: dict[str, Any] | None, release: str | None = None, error: str | None = None
                  ) -> TargetSupport | None:
    """The table's answer for a target config at `release` (eaglectl's reference release by default); `error` is
    why vLLM itself could not answer, kept beside it. None without a config."""
    if config is None:
        return None
    release = release or REFERENCE["vllm"]
    archs = config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    row = target_capture(arch)
    if row is None:
        why = "no architectures in the target's config.json" if arch is None else \
            f"{arch} is not in eaglectl's table"
        return TargetSupport(arch, None, None, None, None, None, release, TARGET_ASSUMED,
                             error="; ".join(x for x in (error, why) if x))
    return TargetSupport(arch, row.model_class, row.module, captures_in(row, release), row.kind, None, release,
                         TARGET_ASSUMED, since=row.since, error=error)


def support_from_worker(raw: dict[str, Any] | None, version: str, config: dict[str, Any] | None
                        ) -> TargetSupport | None:
    """What the worker's vLLM said of the target; where it could not resolve it, the table's answer (assumed) with
    vLLM's reason kept. The table adds the release that added the capture."""
    if not raw:
        return table_support(config)
    error = _one_line(raw.get("error"))
    if raw.get("supports_eagle3") is None:
        return table_support(config, error=f"vLLM {version} could not resolve the target: {error or 'no class'}") \
            or TargetSupport(raw.get("architecture"), None, None, None, None, raw.get("num_layers"), version,
                             TARGET_ASSUMED, error=error)
    row = target_capture(raw.get("architecture"))
    kind = "hybrid" if raw.get("hybrid") else "recurrent" if raw.get("attention_free") else "attention"
    module = raw.get("module") or ""
    module = module.removeprefix("vllm.").replace(".", "/") + ".py" if module else None
    return TargetSupport(raw.get("architecture"), raw.get("class"), module, bool(raw["supports_eagle3"]), kind,
                         raw.get("num_layers"), version, f"asked vLLM {version} (its own code)",
                         since=row.since if row is not None else None)


def _one_line(message: str | None, limit: int = 300) -> str | None:
    if not message:
        return None
    text = " ".join(str(message).split())
    text = re.sub(r"Supported architectures: dict_keys\(\[.*?\]\)", "", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"
