"""fc_norm initialisation from target states, streamed (docs/math.md#upgrade-inits).

Every init needs only sufficient statistics of the aux features, accumulated in float64 one block of
tokens at a time — so a capture of a million tokens of a wide target never sits in memory; the cost is
two D×D matrices (D = n·H_t) whatever the token count, and 4·D² flops per token:

- per chunk j: the RMS r_tj of each token's chunk (mean, harmonic mean, min, max);
- U = Σ u uᵀ and C = Σ c uᵀ, with c_t the raw aux features and u_t the per-chunk normalised ones;
- ‖g‖² = Σ ‖W_fc c_t‖², the energy of the 3.0 FC output.

From them: `harmonic` (γ_j = harmonic mean of r_j), `calibrated` ((M ⊙ U) γ = (M ⊙ C) 1 with M = W_fcᵀW_fc),
`refit` (W' = W_fc C (U + λI)⁻¹), and, for any of them, the relative error of the 3.1 FC output against
the 3.0 one, ‖g' − g‖² = tr(A U Aᵀ) − 2 tr(A Cᵀ W_fcᵀ) + ‖g‖² with A the new FC map on u.

Position 0 of every sequence (the sink token, whose norm is an outlier) is left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import ConversionError

BLOCK = 4096  # tokens per float64 update: bounds the working set, not the result


@dataclass
class Moments:
    n: int  # aux chunks
    width: int  # H_t
    eps: float
    W: np.ndarray  # the source's fc.weight (H, n·H_t), float64
    tokens: int = 0
    g_energy: float = 0.0
    U: np.ndarray = field(init=False)
    C: np.ndarray = field(init=False)
    rms_sum: np.ndarray = field(init=False)
    inv_rms_sum: np.ndarray = field(init=False)
    rms_min: np.ndarray = field(init=False)
    rms_max: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        D = self.n * self.width
        self.U, self.C = np.zeros((D, D)), np.zeros((D, D))
        self.rms_sum, self.inv_rms_sum = np.zeros(self.n), np.zeros(self.n)
        self.rms_min, self.rms_max = np.full(self.n, np.inf), np.zeros(self.n)

    def add(self, aux: np.ndarray) -> None:
        """Fold in (T, n·H_t) features of one sequence (its position 0 dropped here)."""
        if aux.ndim != 2 or aux.shape[1] != self.n * self.width:
            raise ConversionError(f"aux features {list(aux.shape)} do not fit {self.n} chunks of {self.width}")
        for start in range(1, aux.shape[0], BLOCK):
            c = np.asarray(aux[start:start + BLOCK], dtype=np.float64)
            chunks = c.reshape(c.shape[0], self.n, self.width)
            rms = np.sqrt((chunks ** 2).mean(-1) + self.eps)  # (T, n)
            u = (chunks / rms[..., None]).reshape(c.shape[0], -1)
            self.U += u.T @ u
            self.C += c.T @ u
            self.g_energy += float(((c @ self.W.T) ** 2).sum())
            self.rms_sum += rms.sum(0)
            self.inv_rms_sum += (1.0 / rms).sum(0)
            self.rms_min = np.minimum(self.rms_min, rms.min(0))
            self.rms_max = np.maximum(self.rms_max, rms.max(0))
            self.tokens += c.shape[0]

    def summary(self) -> dict[str, Any]:
        if not self.tokens:
            raise ConversionError("no calibration tokens (every sequence was a single token)")
        return {"tokens": self.tokens, "sink_excluded": True,
                "rms_mean": [float(x) for x in self.rms_sum / self.tokens],
                "rms_harmonic_mean": [float(x) for x in self.tokens / self.inv_rms_sum],
                "rms_min": [float(x) for x in self.rms_min], "rms_max": [float(x) for x in self.rms_max]}

    def fc_error(self, A: np.ndarray) -> float:
        """‖g' − g‖ / ‖g‖ over the tokens: g = W c (3.0 FC output), g' = A u (3.1 FC output)."""
        base = self.g_energy
        err = float(((A @ self.U) * A).sum()) - 2 * float((A * (self.W @ self.C)).sum()) + base
        return float(np.sqrt(max(err, 0.0) / base)) if base > 0 else 0.0


def accumulate(W: np.ndarray, n: int, width: int, eps: float, sequences: Iterable[np.ndarray]) -> Moments:
    m = Moments(n, width, eps, np.asarray(W, dtype=np.float64))
    for aux in sequences:
        m.add(aux)
    return m


Fit = tuple[list[np.ndarray], "np.ndarray | None", dict[str, Any]]  # (γ per chunk, refitted fc or None, stats)


def fit(init: str, n: int, Ht: int, m: Moments | None = None) -> Fit:
    """γ per chunk, a refitted fc.weight (refit only) and statistics for one init."""
    if init == "ones":
        return [np.ones(Ht, dtype=np.float32) for _ in range(n)], None, {}
    if m is None:
        raise ConversionError(f"--init {init} measures the target's hidden states: pass --target or --states")
    W = m.W
    stats = m.summary()
    ones = np.ones(n * Ht)
    stats["fc_output_relative_error_ones"] = m.fc_error(W * ones)
    if init == "harmonic":
        gamma = np.repeat(np.asarray(stats["rms_harmonic_mean"]), Ht)
        stats["fc_output_relative_error"] = m.fc_error(W * gamma)
        return _split(gamma, n), None, stats
    if init == "calibrated":
        M = W.T @ W
        gamma = _ridge_solve(M * m.U, (M * m.C).sum(0))  # (M ⊙ U) γ = (M ⊙ C) 1; U, M symmetric
        stats["fc_output_relative_error"] = m.fc_error(W * gamma)
        return _split(gamma, n), None, stats
    if init == "refit":  # γ = 1, W' the ridge regression of g = W c on u: W' = (W C) (U + λI)⁻¹
        Wn = _ridge_solve(m.U, (W @ m.C).T).T
        stats["fc_output_relative_error"] = m.fc_error(Wn)
        return _split(ones, n), Wn.astype(np.float32), stats
    raise ConversionError(f"--init {init}: unknown")


def held_out_error(fitted: Fit, m: Moments) -> float:
    """The FC-output relative error of a fitted init on other tokens than it was fitted on."""
    gammas, new_fc, _ = fitted
    gamma = np.concatenate(gammas).astype(np.float64)
    return m.fc_error(new_fc.astype(np.float64) * gamma if new_fc is not None else m.W * gamma)


def _split(gamma: np.ndarray, n: int) -> list[np.ndarray]:
    return [part.astype(np.float32) for part in np.split(gamma, n)]


def _ridge_solve(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    lam = 1e-6 * float(np.trace(A)) / A.shape[0]
    return np.linalg.solve(A + lam * np.eye(A.shape[0]), b)
