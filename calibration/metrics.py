"""Scoring metrics for probabilistic decisions, one convention each (stated here, once).

scikit-learn computes Brier, NLL and AUROC; only ECE (and the one-line accuracy) is written here,
because scikit-learn has no top-class ECE (``calibration_curve`` bins one class's probability).

- ``*_score`` is higher-better; ``*_loss``, ``*_error`` and ``ece`` are lower-better. Logs are natural.
- Inputs: ``probabilities`` is an (n, k) array whose rows sum to 1; ``gold`` holds the index of the
  true class per row (the gold answer's option index).
- **ECE** is top-class expected calibration error (the literature's "top-label" ECE) on ``n_bins``
  equal-width bins of the top probability, bins ``(lo, hi]`` with the first bin closed ``[0, 1/n_bins]``; empty bins are skipped;
  ECE = Σ_b (n_b / n) · |accuracy_b − mean confidence_b|. Always print ``n_bins`` beside the value
  (15 by default; 10 for the public-suite tables).
- **Brier** is multiclass: Σ_k (p_k − y_k)², averaged over rows (2× the binary Brier score on
  two classes): scikit-learn's ``brier_score_loss`` with ``scale_by_half=False``.
- **NLL** is the mean of −log p(true class): scikit-learn's ``log_loss``, which clips p to
  [eps, 1 − eps] with eps the float64 machine epsilon (≈2.2e-16).
- **AUROC** (noul) is scikit-learn's ``roc_auc_score`` of P(true) against the true answers.
- Score questions (levels 0…k−1 in order, ``gold`` the gold level): the **expected level** is
  Σᵢ i·pᵢ (the ``score`` a Jev answer carries); **level MAE** is the mean |expected level − gold level|;
  **level Spearman** is the rank correlation of the expected level with the gold level (scipy's
  ``spearmanr``: Pearson's r of the ranks, tied values sharing their average rank). It is undefined
  where either side is constant (all reads at one expected level, or one gold level throughout, or a
  single row): it is then ``nan``, never 0, so an average over splits must skip it. Accuracy of the
  most probable level is :func:`accuracy_score`; ECE stays the top-class ECE above.

scikit-learn (and ``scipy.stats``) is imported inside the functions that use it: importing
``sklearn.metrics`` takes seconds, and the service imports this module at start-up for ECE only."""

from __future__ import annotations

import numpy as np

N_BINS = 15
SUITE_N_BINS = 10


def _check(probabilities, gold) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(probabilities, dtype=float)
    y = np.asarray(gold, dtype=int)
    if p.ndim != 2 or y.shape != (p.shape[0],):
        raise ValueError("probabilities must be (n, k) and gold (n,)")
    if p.shape[0] == 0:
        raise ValueError("no rows to score")
    return p, y


def accuracy_score(probabilities, gold) -> float:
    """Share of rows whose most probable class is the true one (ties: the first class)."""
    p, y = _check(probabilities, gold)
    return float(np.mean(p.argmax(axis=1) == y))


def macro_f1_score(probabilities, gold) -> float:
    """Mean over the options of each option's F1 (its most probable answers against its gold
    answers), every column of ``probabilities`` counted: an option never answered scores 0 (so
    answering one class everywhere shows), and one neither answered nor gold scores 0 too (a task
    scored on a sample that lacks one of its classes is marked down, not rescaled).

    >>> macro_f1_score([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7]], [0, 1, 1])
    0.6666666666666666
    """
    p, y = _check(probabilities, gold)
    chosen = p.argmax(axis=1)
    scores = []
    for option in range(p.shape[1]):
        hits = int(np.sum((chosen == option) & (y == option)))
        answered, true = int(np.sum(chosen == option)), int(np.sum(y == option))
        scores.append(2 * hits / (answered + true) if answered + true else 0.0)
    return float(np.mean(scores))


def reliability_bins(probabilities, gold, n_bins: int = N_BINS) -> list[dict]:
    """The non-empty ECE bins of top-class confidence, in order: ``bin``, ``lo``, ``hi``, ``count``,
    mean ``confidence`` and ``accuracy`` (what a reliability diagram draws, and what :func:`ece` sums).

    >>> [(b["bin"], b["count"], b["accuracy"]) for b in reliability_bins([[0.9, 0.1], [0.6, 0.4]], [0, 1], n_bins=10)]
    [(5, 1, 0.0), (8, 1, 1.0)]
    """
    p, y = _check(probabilities, gold)
    confidence = p.max(axis=1)
    correct = (p.argmax(axis=1) == y).astype(float)
    # (lo, hi] bins: ceil maps a confidence on an edge to the bin it closes (the 1e-9 absorbs float
    # error such as 0.3 * 10 = 3.0000000000000004); 0 joins the first bin.
    bins = np.clip(np.ceil(confidence * n_bins - 1e-9).astype(int) - 1, 0, n_bins - 1)
    return [
        {
            "bin": b,
            "lo": b / n_bins,
            "hi": (b + 1) / n_bins,
            "count": int(mask.sum()),
            "confidence": float(confidence[mask].mean()),
            "accuracy": float(correct[mask].mean()),
        }
        for b in range(n_bins)
        if (mask := bins == b).any()
    ]


def ece(probabilities, gold, n_bins: int = N_BINS) -> float:
    """Top-class expected calibration error over :func:`reliability_bins`.

    >>> round(ece([[0.9, 0.1], [0.6, 0.4]], [0, 1], n_bins=10), 4)
    0.35
    """
    n = len(np.asarray(gold))
    total = 0.0
    for b in reliability_bins(probabilities, gold, n_bins):
        total += b["count"] / n * abs(b["accuracy"] - b["confidence"])
    return float(total)


def brier_loss(probabilities, gold) -> float:
    """Multiclass Brier: mean over rows of Σ_k (p_k − y_k)² (not halved on two classes).

    >>> round(brier_loss([[0.9, 0.1], [0.6, 0.4]], [0, 1]), 4)
    0.37
    """
    from sklearn.metrics import brier_score_loss

    p, y = _check(probabilities, gold)
    # scikit-learn's labels= (its word for the classes) fixes the k columns even when some class never
    # occurs among the gold answers.
    return float(brier_score_loss(y, p, labels=np.arange(p.shape[1]), scale_by_half=False))


def auroc_score(p_true, is_true) -> float:
    """Area under the ROC curve of P(true) for noul decisions (scikit-learn's ``roc_auc_score``)."""
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(np.asarray(is_true, dtype=int), np.asarray(p_true, dtype=float)))


def nll_loss(probabilities, gold) -> float:
    """Mean negative log-likelihood of the true class (natural log; scikit-learn's ``log_loss``).

    >>> round(nll_loss([[0.9, 0.1], [0.6, 0.4]], [0, 1]), 4)
    0.5108
    """
    from sklearn.metrics import log_loss

    p, y = _check(probabilities, gold)
    return float(log_loss(y, p, labels=np.arange(p.shape[1])))


def expected_level(probabilities) -> np.ndarray:
    """Σᵢ i·pᵢ per row of an (n, k) array of level probabilities, levels counted from 0.

    >>> expected_level([[0.5, 0.0, 0.5], [0.1, 0.2, 0.7]]).round(6).tolist()
    [1.0, 1.6]
    """
    p = np.asarray(probabilities, dtype=float)
    if p.ndim != 2:
        raise ValueError("probabilities must be (n, k)")
    return p @ np.arange(p.shape[1])


def level_absolute_error(probabilities, gold) -> float:
    """Mean |expected level − gold level| (the level MAE; lower is better).

    >>> round(level_absolute_error([[0.5, 0.0, 0.5], [0.1, 0.2, 0.7]], [2, 1]), 4)
    0.8
    """
    p, y = _check(probabilities, gold)
    return float(np.mean(np.abs(expected_level(p) - y)))


def level_spearman_score(probabilities, gold) -> float:
    """Spearman rank correlation of the expected level with the gold level; ``nan`` where either
    side is constant (no ranking to correlate).

    Expected levels 1.6, 1.0, 0.2 rank 3, 2, 1; gold levels 2, 1, 1 rank 3, 1.5, 1.5 (the tie
    shares its average rank); Pearson's r of those ranks is √3/2:

    >>> round(level_spearman_score([[0.1, 0.2, 0.7], [0.5, 0.0, 0.5], [0.8, 0.2, 0.0]], [2, 1, 1]), 4)
    0.866
    >>> level_spearman_score([[0.1, 0.9], [0.9, 0.1]], [1, 1])
    nan
    """
    from scipy.stats import spearmanr

    p, y = _check(probabilities, gold)
    predicted = expected_level(p)
    # spearmanr warns and returns nan on a constant side; the check says so without the warning.
    if np.ptp(predicted) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(spearmanr(predicted, y).statistic)


def median_level_error(gold) -> float:
    """The level MAE of the best constant answer: always the median gold level (the constant that
    minimises a mean absolute error; with two middle levels any value between them gives this MAE).
    It is the ordinal counterpart of the majority baseline (the constant that maximises accuracy),
    taken, like it, on the scored records themselves.

    >>> median_level_error([0, 1, 1, 4])
    1.0
    """
    y = np.asarray(gold, dtype=float)
    if y.ndim != 1 or not len(y):
        raise ValueError("gold must be (n,), n ≥ 1")
    return float(np.mean(np.abs(y - np.median(y))))


FLOOR_DRAWS = 200


def ece_floor(probabilities, n_bins: int = N_BINS, *, draws: int = FLOOR_DRAWS, seed: int = 0) -> dict:
    """The ECE that perfectly calibrated reads show at this n and these bins: its finite-sample floor.

    Method: keep the probabilities, draw the true answers from them (each row's answer ~ its own
    probabilities, so the reads are calibrated by construction), compute :func:`ece` on those
    answers; repeat ``draws`` times with a fixed ``seed``. Top-class ECE only sees whether the top
    option is right, so each draw is "right with probability max p". Returns the ``median`` and the
    95% range (``lo``, ``hi``: 2.5th and 97.5th percentiles) with ``n``, ``n_bins`` and ``draws``.
    An ECE inside the range is what sampling noise alone gives at this n; only an ECE above ``hi``
    shows miscalibration.
    """
    p, _ = _check(probabilities, np.zeros(len(np.asarray(probabilities)), dtype=int))
    if draws < 1:
        raise ValueError("draws must be ≥ 1")
    confidence = p.max(axis=1)
    bins = np.clip(np.ceil(confidence * n_bins - 1e-9).astype(int) - 1, 0, n_bins - 1)
    right = np.random.default_rng(seed).random((draws, len(p))) < confidence
    confidence_sums = np.bincount(bins, weights=confidence, minlength=n_bins)
    # Per draw and bin: |Σ right − Σ confidence| / n, summed over bins (empty bins add 0).
    right_sums = np.stack([np.bincount(bins, weights=draw, minlength=n_bins) for draw in right.astype(float)])
    values = np.abs(right_sums - confidence_sums).sum(axis=1) / len(p)
    lo, median, hi = np.percentile(values, [2.5, 50, 97.5])
    return {
        "median": float(median),
        "lo": float(lo),
        "hi": float(hi),
        "n": len(p),
        "n_bins": n_bins,
        "draws": draws,
    }
