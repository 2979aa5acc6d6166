"""Metrics against hand-computed values and their stated conventions."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest

from calibration import metrics
from calibration.metrics import accuracy_score, brier_loss, ece, nll_loss


def test_doctests():
    assert doctest.testmod(metrics).failed == 0


def test_ece_bins_are_left_open_right_closed():
    # 10 bins. 0.3 closes (0.2, 0.3]; 0.31 opens (0.3, 0.4]: the two rows never share a bin.
    two = [[0.3, 0.3, 0.3, 0.1], [0.31, 0.29, 0.2, 0.2]]
    assert ece(two, [0, 1], n_bins=10) == pytest.approx(0.5 * abs(1 - 0.3) + 0.5 * abs(0 - 0.31))
    # 0.35 and 0.4 share (0.3, 0.4]: accuracy 1/2 against mean confidence 0.375.
    shared = [[0.35, 0.33, 0.32], [0.4, 0.3, 0.3]]
    assert ece(shared, [0, 1], n_bins=10) == pytest.approx(abs(0.5 - 0.375))


def test_ece_hand_computed_on_15_bins():
    p = [[0.95, 0.05], [0.92, 0.08], [0.55, 0.45], [0.52, 0.48]]
    y = [0, 1, 0, 1]
    # bins of width 1/15: 0.95 → (14/15, 1], 0.92 → (13/15, 14/15], 0.55 → (8/15, 9/15], 0.52 → (7/15, 8/15]
    expected = 0.25 * (abs(1 - 0.95) + abs(0 - 0.92) + abs(1 - 0.55) + abs(0 - 0.52))
    assert ece(p, y) == pytest.approx(expected)


def test_perfectly_calibrated_bins_have_zero_ece():
    rng = np.random.default_rng(0)
    conf = rng.choice([0.6, 0.8], size=20000)
    correct = rng.random(20000) < conf
    p = np.stack([conf, 1 - conf], axis=1)
    y = np.where(correct, 0, 1)
    assert ece(p, y) < 0.01


def test_brier_and_nll_hand_computed():
    p = [[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]
    y = [0, 1]
    assert brier_loss(p, y) == pytest.approx(((0.09 + 0.04 + 0.01) + (0.01 + 0.81 + 0.64)) / 2)
    assert nll_loss(p, y) == pytest.approx(-(math.log(0.7) + math.log(0.1)) / 2)
    assert accuracy_score(p, y) == 0.5


def test_shapes_are_checked():
    with pytest.raises(ValueError):
        ece([0.5, 0.5], [0])
    with pytest.raises(ValueError):
        brier_loss(np.zeros((0, 2)), [])


def test_ours_agree_with_scikit_learn():
    from sklearn.metrics import brier_score_loss, log_loss, roc_auc_score

    rng = np.random.default_rng(7)
    logits = rng.normal(size=(500, 3))
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    y = rng.integers(0, 3, 500)
    assert nll_loss(p, y) == pytest.approx(log_loss(y, p, labels=[0, 1, 2]))
    binary = p[:, :2] / p[:, :2].sum(axis=1, keepdims=True)
    yb = rng.integers(0, 2, 500)
    # multiclass Brier on two classes is twice the binary Brier of P(class 1)
    assert brier_loss(binary, yb) == pytest.approx(2 * brier_score_loss(yb, binary[:, 1]))
    assert metrics.auroc_score(binary[:, 1], yb) == pytest.approx(roc_auc_score(yb, binary[:, 1]))
