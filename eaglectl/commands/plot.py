"""`--plot FILE.png` for drift and smoke: matplotlib (the optional `plot` extra), Agg, written atomically."""

from __future__ import annotations

import io
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..errors import MissingDependencyError
from ..io.atomic import write_file
from ..text import short_names

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def require_matplotlib() -> ModuleType:
    """Checked before any work starts, so a missing extra never costs a long run."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependencyError("--plot needs matplotlib", hint="pip install 'eaglectl-cli[plot]'") from None
    return plt


def _save(fig: Figure, path: str) -> None:
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=120, bbox_inches="tight")
    write_file(path, png.getvalue())


def plot_drift(doc: dict[str, Any], path: str) -> None:
    """Sink, self and recent mass and the fed-back state's RMS by depth; one line per drafter and
    condition, the 95 % interval shaded."""
    plt = require_matplotlib()
    runs = doc["runs"]
    paths = list(dict.fromkeys(r["drafter"] for r in runs))
    names = dict(zip(paths, short_names(paths), strict=True))
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
    panels = [("sink_mass", "attention on the sink"), ("self_mass", "attention on own chain"),
              ("recent_mass", f"attention on last {doc['recent_window']} context"),
              ("state_rms", "RMS of the state fed back")]
    for ax, (metric, title) in zip(axes.flat, panels, strict=True):
        for run in runs:
            xs = [d["depth"] for d in run["depths"] if d[metric] is not None]
            ys = [d[metric] for d in run["depths"] if d[metric] is not None]
            label = names[run["drafter"]] + (f" @{run['context_length']}" if run.get("context_length") else
                                             f" [{run['template']}]" if run.get("template") else "")
            line = ax.plot(xs, ys, marker="o", label=label)[0]
            ci = [d[f"{metric}_ci"] for d in run["depths"] if d[metric] is not None]
            if all(c[0] is not None for c in ci):
                ax.fill_between(xs, [c[0] for c in ci], [c[1] for c in ci], color=line.get_color(), alpha=0.15)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("draft depth")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"eaglectl drift ({doc['protocol']})")
    _save(fig, path)
    plt.close(fig)


def plot_smoke(doc: dict[str, Any], path: str) -> None:
    """Per-position acceptance per config, AL by context length, speedup by concurrency (panels with
    no data are left out)."""
    plt = require_matplotlib()
    configs = [{"name": "drafter", **doc}] + [b for b in doc["baselines"] if b.get("per_position_acceptance")]
    panels = [title for title, shown in (("per-position acceptance", True), ("acceptance length by context length",
              doc.get("by_context_length")), ("speedup over no speculation", doc.get("speedup"))) if shown]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    ax = axes[0][0]
    for c in configs:
        per = c.get("per_position_acceptance") or []
        ax.plot(range(1, len(per) + 1), per, marker="o", label=c["name"])
    ax.set_xlabel("draft position")
    ax.set_ylim(0, 1)
    if doc.get("by_context_length"):
        ax = axes[0][1]
        for c in [{"name": "drafter", **doc}] + [b for b in doc["baselines"] if b.get("by_context_length")]:
            mine = c["by_context_length"]
            ax.plot([r["context_length"] for r in mine], [r["mean_acceptance_length"] for r in mine], marker="o",
                    label=c["name"])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context tokens")
    if doc.get("speedup"):
        ax = axes[0][-1]
        for name in dict.fromkeys(s["config"] for s in doc["speedup"]):
            mine = [s for s in doc["speedup"] if s["config"] == name]
            ax.plot([s["concurrency"] for s in mine], [s["speedup"] for s in mine], marker="o", label=name)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
    for a, title in zip(axes.flat, panels, strict=True):
        a.set_title(title)
        a.legend(fontsize=8)
        a.grid(alpha=0.3)
    fig.suptitle(f"eaglectl smoke ({doc['engine']}, k={doc['num_speculative_tokens']})")
    _save(fig, path)
    plt.close(fig)
