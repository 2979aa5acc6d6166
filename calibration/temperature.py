"""Temperature scaling of label log-probs: fit on decisions with gold answers, apply to new ones.

Parameterisation: p_i ∝ exp(z_i / T), where z are a decision's label log-probs (any per-row shift is
irrelevant, so the log of the label probabilities works as well). T > 1 softens, T < 1 sharpens.
``fit`` minimises the mean NLL over log T on [log t_min, log t_max] (0.05–20 by default) with a
bounded scalar optimiser; it raises ``RuntimeError`` if the optimiser fails. Nothing is learnt in
``__init__``; the fit module needs neither the service nor the store.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax

T_MIN, T_MAX = 0.05, 20.0


def as_logits(probabilities) -> np.ndarray:
    """Label probabilities → label log-probs (clipped at 1e-300 so a 0 stays finite)."""
    return np.log(np.clip(np.asarray(probabilities, dtype=float), 1e-300, 1.0))


def _groups(logits, gold) -> list[tuple[np.ndarray, np.ndarray]]:
    """Rows grouped by option count: decisions of one question type may have different counts."""
    rows = [np.asarray(row, dtype=float) for row in logits]
    y = np.asarray(gold, dtype=int)
    if len(rows) != len(y) or not rows:
        raise ValueError("need one gold index per row and at least one row")
    groups = []
    for k in sorted({len(row) for row in rows}):
        index = [i for i, row in enumerate(rows) if len(row) == k]
        groups.append((np.stack([rows[i] for i in index]), y[index]))
    return groups


def nll_at(logits, gold, temperature: float) -> float:
    """Mean negative log-likelihood of the ``gold`` indices under softmax(logits / temperature).

    ``logits`` is an (n, k) array, or a list of rows of different lengths.
    """
    groups = _groups(logits, gold)
    total = sum(-log_softmax(z / temperature, axis=1)[np.arange(len(y)), y].sum() for z, y in groups)
    return float(total / sum(len(y) for _, y in groups))


class TemperatureScaler:
    """Fit a temperature on (n, k) label logits; apply it to new ones.

    Attributes set by ``fit``: ``temperature_``, ``n_samples_``, ``nll_before_`` (at T = 1) and
    ``nll_after_`` (at the fitted T) on the fit set.
    """

    def __init__(self, t_min: float = T_MIN, t_max: float = T_MAX) -> None:
        if not 0 < t_min < 1 < t_max:
            raise ValueError("need 0 < t_min < 1 < t_max")
        self.t_min = t_min
        self.t_max = t_max

    def fit(self, logits, gold) -> TemperatureScaler:
        """``logits``: (n, k), or n rows of varying length (pooled option counts); ``gold``: (n,) indices."""
        groups = _groups(logits, gold)
        if not all(np.all(np.isfinite(z)) for z, _ in groups):
            raise ValueError("logits must be finite")
        if any(np.any((y < 0) | (y >= z.shape[1])) for z, y in groups):
            raise ValueError("a gold index is outside its row")
        z, y = list(logits), gold
        result = minimize_scalar(
            lambda log_t: nll_at(z, y, math.exp(log_t)),
            bounds=(math.log(self.t_min), math.log(self.t_max)),
            method="bounded",
            options={"xatol": 1e-6},
        )
        if not result.success:
            raise RuntimeError(f"temperature fit failed: {result.message}")
        before = nll_at(z, y, 1.0)
        temperature = math.exp(result.x)
        after = nll_at(z, y, temperature)
        if after > before:  # the bounded search can stop near a boundary; T = 1 is always available
            temperature, after = 1.0, before
        self.temperature_ = temperature
        self.n_samples_ = len(gold)
        self.nll_before_ = before
        self.nll_after_ = after
        return self

    def predict_proba(self, logits) -> np.ndarray:
        return apply_temperature(logits, self.temperature_)


def apply_temperature(logits, temperature: float) -> np.ndarray:
    """softmax(logits / T), row by row."""
    z = np.asarray(logits, dtype=float)
    return np.exp(log_softmax(z / temperature, axis=-1))
