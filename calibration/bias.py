"""Two corrections beyond a temperature, for weak models whose label reads lean towards some options.

**Temperature + per-option bias** (mode ``temperature_bias``): p ∝ exp(z / T + b), with z a decision's
label log-probs and b one bias per option (in option order). ``fit`` minimises mean NLL + ``l2`` · Σ b²
over (log T, b) with L-BFGS and the exact gradient. The penalty keeps b small on few gold answers and fixes
the one free direction (adding a constant to every b changes nothing): the fitted b sums to zero.
A bias belongs to one option order, so every row must have the same option count.

**Affine** (mode ``affine``, few-shot): the same map, p ∝ exp(z / T + b), fitted with a prior toward
the identity (T = 1, b = 0) instead: mean NLL + (λ/n)·((log T)² + Σ b²), λ = ``AFFINE_PRIOR``. That
is a Gaussian prior of fixed total weight (sd 1/√(2λ) ≈ 0.7 nats on log T and on each bias at λ = 1):
on 4 gold answers the fit stays near the read and moves an answer only where they agree; by 50 the
data outweigh it fifty to one. ``temperature_bias``'s penalty is per decision (0.01 · Σ b² beside the
mean NLL, no pull on T), so it keeps its full weight at any n and leaves T free: on few gold answers
T runs to a bound and b to whatever separates them. The two share the stored form (T, b) and
:func:`apply_temperature_bias`: only the fit differs, so ``affine`` is ``temperature_bias`` with a
prior that fades with n, not a twin (docs/calibration.md).

**Gold prior** (``GoldPriorScaler``, a candidate of the cross-validated choice, stored as
``temperature_bias``): the same form with T pinned at its upper bound (20), so the read moves a
probability by a twentieth of its log-odds and the biases, fitted on the gold answers, carry the
answer: about the gold class frequencies. What a fit should fall back to where the read carries no
signal (calibration/select.py).

**Prior correction** (no gold answers): the model's prior q over the options is the mean
of its label probabilities on content-free states (e.g. "", "N/A", "[MASK]"), read with the same
question and prompt layout; a decision's probabilities are divided by q and renormalised,
p'_i ∝ p_i / q_i (contextual calibration). q depends on the question's prompt, so it is measured per
question and per prompt version; measuring it (reading the states) is the caller's part.

**State prior** (mode ``state_prior``, no gold answers): the same division, with q the mean of the
model's label probabilities on the caller's own states of the question (examples without gold answers,
or the decisions already served). In-domain states carry the bias the task's text induces, which content-free
states can miss (on AG News under decide-prompt/3 the question leaned to one option on real articles,
not on "N/A"; docs/prompts-and-labels.md).
It assumes the options are about equally frequent among those states: on a task whose gold answers are
skewed it pulls answers towards the rare options. Stored in the form ``temperature_bias`` has, with
T = 1 and b = −log q (centred), so it is applied, listed and refitted like any stored fit.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import minimize
from scipy.special import log_softmax, softmax

from calibration.metrics import nll_loss
from calibration.temperature import T_MAX, T_MIN, nll_at

BIAS_L2 = 0.01
"""Default L2 weight on the biases, on the scale of the mean NLL (nats per decision)."""
AFFINE_PRIOR = 1.0
"""λ, the total weight of the affine fit's prior toward T = 1, b = 0 (fixed before the dev run:
evidence/few-shot/rule.md)."""

CONTENT_FREE_STATES = ("", "N/A", "[MASK]")
"""States with no content: what the model answers on them is its prior over the options."""


def apply_temperature_bias(logits, temperature: float, bias) -> np.ndarray:
    """softmax(logits / T + b), row by row."""
    z = np.asarray(logits, dtype=float)
    return np.exp(log_softmax(z / temperature + np.asarray(bias, dtype=float), axis=-1))


class TemperatureBiasScaler:
    """Fit T and per-option biases on (n, k) label logits; apply them to new ones.

    Attributes set by ``fit``: ``temperature_``, ``bias_`` (k,), ``n_samples_``, ``nll_before_``
    (T = 1, b = 0) and ``nll_after_`` (unpenalised NLL at the fit) on the fit set.
    """

    def __init__(self, l2: float = BIAS_L2, t_min: float = T_MIN, t_max: float = T_MAX) -> None:
        if l2 < 0:
            raise ValueError("l2 must be ≥ 0")
        self.l2, self.t_min, self.t_max = l2, t_min, t_max

    def fit(self, logits, gold) -> TemperatureBiasScaler:
        z, y = _one_count(logits, gold)
        return self._fit(z, y, bias_weight=self.l2, log_t_weight=0.0)

    def _fit(self, z: np.ndarray, y: np.ndarray, *, bias_weight: float, log_t_weight: float):
        """Minimise mean NLL + bias_weight · Σ b² + log_t_weight · (log T)² over (log T, b)."""
        n, k = z.shape
        onehot = np.eye(k)[y]

        def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
            log_t, b = theta[0], theta[1:]
            t = math.exp(log_t)
            u = z / t + b
            logp = log_softmax(u, axis=1)
            value = -logp[np.arange(n), y].mean() + bias_weight * float(b @ b) + log_t_weight * log_t**2
            residual = (softmax(u, axis=1) - onehot) / n  # d mean NLL / d u
            grad_b = residual.sum(axis=0) + 2 * bias_weight * b
            grad_log_t = float((residual * (-z / t)).sum()) + 2 * log_t_weight * log_t
            return value, np.concatenate([[grad_log_t], grad_b])

        bounds = [(math.log(self.t_min), math.log(self.t_max))] + [(None, None)] * k
        result = minimize(loss, np.zeros(k + 1), jac=True, method="L-BFGS-B", bounds=bounds)
        if not np.all(np.isfinite(result.x)):
            raise RuntimeError(f"temperature + bias fit failed: {result.message}")
        temperature, bias = math.exp(result.x[0]), result.x[1:] - result.x[1:].mean()
        self.temperature_ = temperature
        self.bias_ = bias
        self.n_samples_ = n
        self.nll_before_ = nll_at(z, y, 1.0)
        self.nll_after_ = float(-log_softmax(z / temperature + bias, axis=1)[np.arange(n), y].mean())
        return self

    def predict_proba(self, logits) -> np.ndarray:
        return apply_temperature_bias(logits, self.temperature_, self.bias_)


def _one_count(logits, gold) -> tuple[np.ndarray, np.ndarray]:
    """(n, k) logits and (n,) gold indices of rows of one option count; ValueError otherwise."""
    widths = {len(row) for row in logits}
    if len(widths) != 1:
        raise ValueError(f"a per-option bias needs one option count; rows have {sorted(widths)}")
    z = np.asarray([np.asarray(row, dtype=float) for row in logits])
    y = np.asarray(gold, dtype=int)
    if len(z) != len(y) or not len(y):
        raise ValueError("need one gold index per row and at least one row")
    if not np.all(np.isfinite(z)):
        raise ValueError("logits must be finite")
    if np.any((y < 0) | (y >= z.shape[1])):
        raise ValueError("a gold index is outside its row")
    return z, y


class AffineScaler(TemperatureBiasScaler):
    """Fit T and per-option biases with a prior toward the identity (module docstring); the same
    attributes and ``predict_proba`` as ``TemperatureBiasScaler``."""

    def __init__(self, prior: float = AFFINE_PRIOR, t_min: float = T_MIN, t_max: float = T_MAX) -> None:
        if prior <= 0:
            raise ValueError("prior must be > 0: it is what holds a fit on a few gold answers near the read")
        super().__init__(0.0, t_min, t_max)
        self.prior = prior

    def fit(self, logits, gold) -> AffineScaler:
        z, y = _one_count(logits, gold)
        weight = self.prior / len(y)  # a fixed total weight: on the mean-NLL scale it fades as 1/n
        return self._fit(z, y, bias_weight=weight, log_t_weight=weight)


class GoldPriorScaler(TemperatureBiasScaler):
    """``temperature_bias`` with T pinned at ``T_MAX``: the biases, about the gold class log-frequencies,
    answer; the read barely moves them (module docstring)."""

    def __init__(self, l2: float = BIAS_L2) -> None:
        super().__init__(l2, T_MAX, T_MAX)


def option_prior(probabilities) -> np.ndarray:
    """The model's prior over the options: the mean of its label probabilities over reads of one
    question (content-free states, or the caller's states; rows of one option count), renormalised."""
    p = np.asarray(probabilities, dtype=float)
    if p.ndim != 2 or not len(p):
        raise ValueError("need the reads as an (m, k) array, m ≥ 1")
    prior = p.mean(axis=0)
    if not np.all(prior > 0):
        raise ValueError("a prior needs every option's probability above 0")
    return prior / prior.sum()


def state_prior_bias(probabilities) -> np.ndarray:
    """The per-option bias that divides the states' prior out: b = −log q, centred (softmax(z + b)
    with z the label log-probs equals ``apply_prior``)."""
    bias = -np.log(option_prior(probabilities))
    return bias - bias.mean()


def apply_prior(probabilities, prior) -> np.ndarray:
    """Divide the prior out and renormalise, row by row: p'_i ∝ p_i / q_i."""
    p = np.asarray(probabilities, dtype=float)
    q = np.asarray(prior, dtype=float)
    if p.shape[-1] != q.shape[-1]:
        raise ValueError(f"the prior has {q.shape[-1]} options, the probabilities {p.shape[-1]}")
    corrected = p / q
    return corrected / corrected.sum(axis=-1, keepdims=True)


class StatePriorScaler:
    """Fit the state prior on (n, k) label logits of reads without gold answers; apply it to new ones.

    The same attributes as ``TemperatureBiasScaler`` (``temperature_`` is 1): the fit is stored and
    applied as a bias. Gold indices (−1 where there is none) do not enter the fit; the NLLs
    before and after are taken over the rows that have one (None when none has).
    """

    def fit(self, logits, gold=None) -> StatePriorScaler:
        if len({len(row) for row in logits}) != 1:
            raise ValueError("a state prior needs rows of one option count, at least one")
        z = np.asarray([np.asarray(row, dtype=float) for row in logits])
        if not np.all(np.isfinite(z)):
            raise ValueError("logits must be finite")
        self.temperature_ = 1.0
        self.bias_ = state_prior_bias(softmax(z, axis=1))
        self.n_samples_ = len(z)
        y = np.full(len(z), -1) if gold is None else np.asarray(gold, dtype=int)
        has_gold = y >= 0
        self.nll_before_ = nll_loss(softmax(z[has_gold], axis=1), y[has_gold]) if has_gold.any() else None
        self.nll_after_ = nll_loss(self.predict_proba(z[has_gold]), y[has_gold]) if has_gold.any() else None
        return self

    def predict_proba(self, logits) -> np.ndarray:
        return apply_temperature_bias(logits, 1.0, self.bias_)
