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

Degenerate numbers are refused, never averaged into weights: a non-finite feature, no token left after
the sink, or an aux chunk that is zero on every token (nothing to normalise) is an InvalidStatesError
naming the reason. A singular or ill-conditioned system is solved with a larger ridge, then by least
squares, and the statistics say which (`solver`); a solution that is still not finite is refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import ConversionError, InvalidStatesError

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
            if not np.isfinite(c).all():
                t = start + int(np.argwhere(~np.isfinite(c))[0][0])
                raise InvalidStatesError(f"the target states hold a non-finite value at token {t}: refused for "
                                         "calibration (nothing written)")
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
            raise InvalidStatesError("no calibration tokens (every sequence was a single token, and position 0 is "
                                     "left out): too few states to calibrate, nothing written")
        flat = [j for j in range(self.n) if self.rms_max[j] ** 2 <= self.eps * (1 + 1e-9)]
        if flat:
            raise InvalidStatesError(f"aux chunk {flat[0]} is zero on all {self.tokens} calibration tokens (zero "
                                     "variance): too degenerate to calibrate, nothing written")
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
        gamma, stats["solver"] = _ridge_solve(M * m.U, (M * m.C).sum(0))  # (M ⊙ U) γ = (M ⊙ C) 1; U, M symmetric
        stats["fc_output_relative_error"] = m.fc_error(W * gamma)
        return _split(gamma, n), None, stats
    if init == "refit":  # γ = 1, W' the ridge regression of g = W c on u: W' = (W C) (U + λI)⁻¹
        Wn, stats["solver"] = _ridge_solve(m.U, (W @ m.C).T)
        Wn = Wn.T
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


RIDGES = (1e-6, 1e-3, 1e-1)  # λ relative to the mean diagonal: the stated ridge, then two larger ones
RESIDUAL = 1e-6  # a solve whose relative residual ‖(A + λI)x − b‖ / ‖b‖ exceeds this is not trusted


def _ridge_solve(A: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, str]:
    """x with (A + λI) x = b, and how it was found: the ridge λ = 1e-6·tr(A)/D; on a singular or
    ill-conditioned system (the solve fails, or its residual or result is not sound) λ = 1e-3 and 1e-1
    of tr(A)/D; then the least-squares solution of A x = b. A result that is still not finite (or a
    system with no scale at all) is refused."""
    D = A.shape[0]
    scale = float(np.trace(A)) / D
    if not np.isfinite(A).all() or not np.isfinite(b).all() or not scale > 0:
        raise InvalidStatesError("the calibration system is degenerate (no variance in the states, or non-finite "
                                 "statistics): nothing written")
    bnorm = float(np.linalg.norm(b)) or 1.0
    for rel in RIDGES:
        K = A + rel * scale * np.eye(D)
        try:
            x = np.linalg.solve(K, b)
        except np.linalg.LinAlgError:
            continue
        if np.isfinite(x).all() and float(np.linalg.norm(K @ x - b)) <= RESIDUAL * bnorm:
            return x, f"ridge {rel:g}" if rel == RIDGES[0] else f"ridge {rel:g} (the {RIDGES[0]:g} solve was singular)"
    x = np.linalg.lstsq(A, b, rcond=None)[0]
    if not np.isfinite(x).all():
        raise InvalidStatesError("the calibration system is singular and has no finite least-squares solution: "
                                 "nothing written")
    return x, "lstsq (every ridge solve was singular)"
