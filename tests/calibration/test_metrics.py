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


def test_two_class_brier_is_the_sum_over_both_classes():
    # scikit-learn halves the Brier on two classes by default; ours sums (p_k − y_k)² over both.
    assert brier_loss([[0.9, 0.1], [0.6, 0.4]], [0, 1]) == pytest.approx(((0.01 + 0.01) + (0.36 + 0.36)) / 2)


def test_a_class_no_row_is_true_for_still_counts():
    p = [[0.5, 0.3, 0.2], [0.6, 0.1, 0.3]]
    assert brier_loss(p, [0, 0]) == pytest.approx(((0.25 + 0.09 + 0.04) + (0.16 + 0.01 + 0.09)) / 2)
    assert nll_loss(p, [0, 0]) == pytest.approx(-(math.log(0.5) + math.log(0.6)) / 2)


def test_nll_clips_a_zero_probability_at_machine_epsilon():
    eps = np.finfo(float).eps
    assert nll_loss([[1.0, 0.0], [0.5, 0.5]], [1, 0]) == pytest.approx((-math.log(eps) - math.log(0.5)) / 2)


def test_brier_and_nll_match_their_definitions_on_many_rows():
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(500, 4))
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    y = rng.integers(0, 4, 500)
    onehot = np.eye(4)[y]
    assert brier_loss(p, y) == pytest.approx(np.mean(np.sum((p - onehot) ** 2, axis=1)), rel=1e-12)
    assert nll_loss(p, y) == pytest.approx(-np.mean(np.log(p[np.arange(500), y])), rel=1e-12)


def test_auroc_counts_ordered_pairs():
    # positives at 0.9 and 0.4, negatives at 0.5 and 0.1: 3 of the 4 (positive, negative) pairs ordered.
    assert metrics.auroc_score([0.9, 0.4, 0.5, 0.1], [1, 1, 0, 0]) == pytest.approx(0.75)


def test_the_ece_floor_is_what_calibrated_draws_show():
    """The floor's median matches ECEs of answers drawn from the probabilities themselves, and it
    shrinks as n grows (it is sampling noise, not miscalibration)."""
    from calibration.metrics import ece, ece_floor

    rng = np.random.default_rng(2)
    p = rng.dirichlet([1, 1, 1], size=100)
    floor = ece_floor(p, 15, draws=400, seed=0)
    drawn = [ece(p, [rng.choice(3, p=row) for row in p], 15) for _ in range(400)]
    assert floor["lo"] < floor["median"] < floor["hi"]
    assert floor["median"] == pytest.approx(np.median(drawn), abs=0.01)
    assert (floor["n"], floor["n_bins"], floor["draws"]) == (100, 15, 400)
    big = ece_floor(rng.dirichlet([1, 1, 1], size=2500), 15)
    assert big["median"] < floor["median"] / 3  # ~1/√n: 25× the rows, about a fifth of the floor
    assert ece_floor(p, 15, seed=0) == ece_floor(p, 15, seed=0)  # fixed seed: reproducible
    with pytest.raises(ValueError):
        ece_floor(p, 15, draws=0)


def test_level_metrics_by_hand():
    from calibration.metrics import expected_level, level_absolute_error, median_level_error

    p = [[0.0, 0.0, 1.0], [0.5, 0.5, 0.0], [0.2, 0.2, 0.6], [1.0, 0.0, 0.0]]
    gold = [2, 0, 1, 1]
    assert expected_level(p) == pytest.approx([2.0, 0.5, 1.4, 0.0])
    # errors 0, 0.5, 0.4, 1.0
    assert level_absolute_error(p, gold) == pytest.approx(1.9 / 4)
    assert accuracy_score(p, gold) == 0.5  # the most probable level: 2 and 0 right, 2 and 0 wrong
    # gold 0, 1, 1, 2 has median 1: errors 1, 0, 0, 1. On 0, 0, 1, 3, 4 the median 1 errs by
    # 1 + 1 + 0 + 2 + 3 = 7 over five; the mode 0 would err by 8.
    assert median_level_error(gold) == pytest.approx(0.5)
    assert median_level_error([0, 0, 1, 3, 4]) == pytest.approx(7 / 5)


def test_level_spearman_averages_tied_ranks():
    from calibration.metrics import level_spearman_score

    p = [[0.0, 0.0, 1.0], [0.5, 0.5, 0.0], [0.2, 0.2, 0.6], [1.0, 0.0, 0.0]]
    # expected levels 2.0, 0.5, 1.4, 0.0 rank 4, 2, 3, 1; gold 2, 0, 1, 1 ranks 4, 1, 2.5, 2.5
    by_hand = np.corrcoef([4, 2, 3, 1.0], [4, 1, 2.5, 2.5])[0, 1]
    assert level_spearman_score(p, [2, 0, 1, 1]) == pytest.approx(by_hand)
    assert level_spearman_score(p, [0, 2, 1, 3]) == pytest.approx(-1.0)  # 4 levels: gold reversed


@pytest.mark.parametrize(
    ("p", "gold"),
    [
        ([[0.2, 0.8], [0.6, 0.4]], [1, 1]),  # one gold level
        ([[0.5, 0.5], [0.5, 0.5]], [0, 1]),  # one expected level
        ([[0.3, 0.7]], [1]),  # one row
    ],
)
def test_level_spearman_is_nan_where_a_side_is_constant(p, gold):
    import warnings

    from calibration.metrics import level_spearman_score

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nan by the stated rule, not by a scipy warning
        assert math.isnan(level_spearman_score(p, gold))
