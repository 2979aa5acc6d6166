"""Cumulative-logit calibration of score reads: one ordinal fit on decisions with gold levels.

A score question's levels 0…k−1 are ordered; ``temperature_bias`` treats them as k unrelated options
(one bias each). This fit uses the order. From each read it takes one number, the read's **expected
level** s = Σᵢ i·pᵢ (``calibration.metrics.expected_level``, the ``score`` a Jev answer carries), and
models the gold level with the proportional-odds (cumulative-logit) model

    P(y ≤ j) = σ(θⱼ − a·(s − c)),   j = 0…k−2,   θ₀ < θ₁ < … < θ_{k−2},

with c = (k−1)/2 the middle of the scale (a fixed shift, so the thresholds sit around 0 and the weak
prior below pulls towards a symmetric scale), a the slope and σ the logistic function. The
calibrated probability of level j is P(y ≤ j) − P(y ≤ j−1).

Why the expected level as the score: it moves up whenever any of the read's mass moves to a higher
level (it orders reads by first-order stochastic dominance: every cut j of the scale counts), which is
the read's ordering information. The log-odds between the upper and lower halves of the scale sees
one cut only: mass moving from level 3 to 4, or from 0 to 1, leaves it unchanged, and the middle
level of an odd scale belongs to neither half. The expected level is also bounded (0 to k−1), so a
read's far tail (a probability of 1e-9 or 1e-5 on a level it rules out) barely moves it, where the
log-odds of a sure read is set by that tail (the half it rules out holds nothing else). What one number drops is the read's spread: two reads with
the same expected level get the same calibrated distribution, whose spread the fit learns from the
gold levels.

Parameterisation and fit: θ₀ = b₀ and θⱼ = θⱼ₋₁ + exp(dⱼ), so every (a, b₀, d) gives ordered
thresholds. ``fit`` minimises the mean NLL + (``l2``/n)·(a² + Σθⱼ²) with L-BFGS and the exact
gradient. The penalty is a weak Gaussian prior with a fixed total weight (it fades as n grows): it
keeps the fit finite where the likelihood has no optimum. Degenerate inputs, what happens:

- a level no gold answer takes: at an end of the scale its threshold moves out until the prior holds
  it (that level gets a small, non-zero probability); in the middle its two thresholds close up
  (exp(d) → 0: that level's probability goes to about 0). Nothing raises.
- every read at one expected level (s constant): a and the thresholds cannot be told apart; the prior
  settles them (a ≈ 0), and the fit returns about the gold levels' frequencies for every read.
- one gold level throughout: the probability of that level approaches 1 for every read, held back by
  the prior.

A negative slope is allowed (reads that rank the gold levels backwards); it is what the gold answers
say. ``fit`` raises ``RuntimeError`` if the optimiser ends on non-finite parameters. Nothing is learnt
in ``__init__``; like the other fits, this one needs neither the service nor the store, and takes
label log-probs (or the log of label probabilities: each row is renormalised).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit, softmax

from calibration.metrics import expected_level
from calibration.temperature import nll_at

ORDINAL_L2 = 0.01
"""Default total weight of the Gaussian prior on the slope and thresholds (a prior sd of about 7)."""


def _levels(logits) -> tuple[np.ndarray, np.ndarray, int]:
    """(level probabilities (n, k), centred expected levels (n,), k) of rows of one level count."""
    widths = {len(row) for row in logits}
    if len(widths) != 1:
        raise ValueError(f"a cumulative fit needs one level count; rows have {sorted(widths)}")
    z = np.asarray([np.asarray(row, dtype=float) for row in logits])
    if not np.all(np.isfinite(z)):
        raise ValueError("logits must be finite")
    k = z.shape[1]
    if k < 2:
        raise ValueError("a score has at least 2 levels")
    p = softmax(z, axis=1)
    return p, expected_level(p) - (k - 1) / 2, k


def thresholds_from(b0: float, log_gaps: np.ndarray) -> np.ndarray:
    """θ₀ = b₀, θⱼ = θⱼ₋₁ + exp(dⱼ): ordered thresholds from unconstrained parameters."""
    return b0 + np.concatenate([[0.0], np.cumsum(np.exp(log_gaps))])


def level_probabilities(score, slope: float, thresholds) -> np.ndarray:
    """P(y = j) for j = 0…k−1 (k = len(thresholds) + 1) at each centred ``score``, rows summing to 1.

    >>> level_probabilities([0.0], 1.0, [-1.0, 1.0]).round(4).tolist()
    [[0.2689, 0.4621, 0.2689]]
    """
    u = np.asarray(thresholds, dtype=float)[None, :] - slope * np.asarray(score, dtype=float)[:, None]
    n = len(u)
    # Cumulative probabilities with 0 and 1 at the ends; a level's probability is a difference of two.
    cumulative = np.concatenate([np.zeros((n, 1)), expit(u), np.ones((n, 1))], axis=1)
    upper = np.concatenate([np.ones((n, 1)), expit(-u), np.zeros((n, 1))], axis=1)  # 1 − cumulative
    # Past the middle both cumulative probabilities are near 1: their difference loses its digits,
    # the difference of the upper tails keeps them.
    lo_cut, hi_cut = cumulative[:, :-1], cumulative[:, 1:]
    p = np.where(lo_cut > 0.5, upper[:, :-1] - upper[:, 1:], hi_cut - lo_cut)
    return np.clip(p, 0.0, 1.0)


def penalised_nll(
    params: np.ndarray, score: np.ndarray, gold: np.ndarray, l2: float
) -> tuple[float, np.ndarray]:
    """The objective ``fit`` minimises and its gradient, at ``params`` = (a, b₀, d₁…d_{k−2}), for centred
    scores and gold levels: mean NLL + (l2/n)·(a² + Σθⱼ²)."""
    slope, b0, log_gaps = params[0], params[1], params[2:]
    theta = thresholds_from(b0, log_gaps)
    n, k = len(gold), len(theta) + 1
    rows = np.arange(n)
    weight = l2 / n
    likelihood = np.maximum(level_probabilities(score, slope, theta)[rows, gold], 1e-300)
    value = -np.log(likelihood).mean() + weight * (slope**2 + theta @ theta)
    # dF_j/du_j = F_j (1 − F_j) at each threshold, 0 at the two ends.
    u = theta[None, :] - slope * score[:, None]
    density = np.concatenate([np.zeros((n, 1)), expit(u) * expit(-u), np.zeros((n, 1))], axis=1)
    upper, lower = density[rows, gold + 1], density[rows, gold]  # at θ_y and θ_{y−1}
    # −log(F_y − F_{y−1}): d/dθ_y = −f_y / P, d/dθ_{y−1} = +f_{y−1} / P, d/da = s (f_y − f_{y−1}) / P.
    grad_theta = np.zeros(k + 1)
    np.add.at(grad_theta, gold + 1, -upper / likelihood)
    np.add.at(grad_theta, gold, lower / likelihood)
    grad_theta = grad_theta[1:-1] / n + 2 * weight * theta
    grad_slope = float(score @ ((upper - lower) / likelihood)) / n + 2 * weight * slope
    # θ_j = b₀ + Σ_{i≤j} exp(dᵢ): d/db₀ sums every θ's gradient; d/ddᵢ sums those from θᵢ on.
    grad_gaps = np.exp(log_gaps) * np.cumsum(grad_theta[::-1])[::-1][1:]
    return float(value), np.concatenate([[grad_slope, grad_theta.sum()], grad_gaps])


def apply_cumulative_logit(logits, slope: float, thresholds) -> np.ndarray:
    """The calibrated level probabilities of reads (label log-probs, (n, k)) under a fitted (a, θ)."""
    _, s, k = _levels(logits)
    if len(thresholds) != k - 1:
        raise ValueError(f"{len(thresholds)} thresholds fit {len(thresholds) + 1} levels, not {k}")
    return level_probabilities(s, slope, thresholds)


class CumulativeLogitScaler:
    """Fit the cumulative-logit model on (n, k) label logits of score reads; apply it to new ones.

    Attributes set by ``fit``: ``slope_`` (a), ``thresholds_`` (k−1, increasing), ``n_samples_``,
    ``nll_before_`` (the reads as they are) and ``nll_after_`` (unpenalised NLL at the fit) on the fit set.
    """

    def __init__(self, l2: float = ORDINAL_L2) -> None:
        if l2 <= 0:
            raise ValueError("l2 must be > 0: the prior keeps a fit on a level no gold answer takes finite")
        self.l2 = l2

    def fit(self, logits, gold) -> CumulativeLogitScaler:
        p, s, k = _levels(logits)
        y = np.asarray(gold, dtype=int)
        if y.shape != (len(p),) or not len(y):
            raise ValueError("need one gold level per row and at least one row")
        if np.any((y < 0) | (y >= k)):
            raise ValueError("a gold level is outside the scale")
        n = len(y)
        # Start at a = 1 with thresholds half-way between levels: the read's expected level, rounded.
        start = np.concatenate([[1.0, 0.5 - (k - 1) / 2], np.zeros(k - 2)])
        result = minimize(penalised_nll, start, args=(s, y, self.l2), jac=True, method="L-BFGS-B")
        if not np.all(np.isfinite(result.x)):
            raise RuntimeError(f"cumulative-logit fit failed: {result.message}")
        self.slope_ = float(result.x[0])
        self.thresholds_ = thresholds_from(result.x[1], result.x[2:])
        self.n_samples_ = n
        self.nll_before_ = nll_at(np.log(np.clip(p, 1e-300, 1.0)), y, 1.0)
        fitted = level_probabilities(s, self.slope_, self.thresholds_)
        self.nll_after_ = float(-np.log(np.maximum(fitted[np.arange(n), y], 1e-300)).mean())
        return self

    def predict_proba(self, logits) -> np.ndarray:
        return apply_cumulative_logit(logits, self.slope_, self.thresholds_)
