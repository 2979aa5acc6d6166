"""Cumulative-logit calibration of score reads: recovery, held-out gains, and the degenerate fits."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
from scipy.optimize import check_grad
from scipy.special import expit

from calibration import ordinal
from calibration.metrics import ece, expected_level, level_absolute_error
from calibration.ordinal import (
    CumulativeLogitScaler,
    apply_cumulative_logit,
    level_probabilities,
    penalised_nll,
)
from calibration.temperature import as_logits

K = 5
SLOPE, THRESHOLDS = 2.0, np.array([-2.5, -0.5, 0.5, 3.0])


def reads_at(levels: np.ndarray) -> np.ndarray:
    """Reads whose expected level is ``levels`` exactly: mass split between the two nearest levels."""
    low = np.clip(np.floor(levels).astype(int), 0, K - 2)
    rows = np.arange(len(levels))
    p = np.zeros((len(levels), K))
    p[rows, low] = 1 - (levels - low)
    p[rows, low + 1] += levels - low
    return p


def ordinal_draws(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Reads with expected levels spread over the scale, gold levels drawn from the known model."""
    rng = np.random.default_rng(seed)
    p = reads_at(rng.uniform(0, K - 1, n))
    truth = level_probabilities(expected_level(p) - (K - 1) / 2, SLOPE, THRESHOLDS)
    return p, np.array([rng.choice(K, p=row) for row in truth])


def test_doctests():
    assert doctest.testmod(ordinal).failed == 0


def test_recovers_a_known_slope_and_thresholds():
    p, gold = ordinal_draws(6000, seed=1)
    scaler = CumulativeLogitScaler().fit(as_logits(p), gold)
    assert scaler.slope_ == pytest.approx(SLOPE, rel=0.1)
    assert scaler.thresholds_ == pytest.approx(THRESHOLDS, abs=0.15)
    assert scaler.nll_after_ < scaler.nll_before_


def test_the_gradient_is_the_objectives():
    p, gold = ordinal_draws(300, seed=2)
    score = expected_level(p) - (K - 1) / 2
    for seed in range(3):
        params = np.random.default_rng(seed).normal(size=K)
        error = check_grad(
            lambda x: penalised_nll(x, score, gold, 0.01)[0],
            lambda x: penalised_nll(x, score, gold, 0.01)[1],
            params,
        )
        assert error < 1e-5 * max(1.0, np.linalg.norm(penalised_nll(params, score, gold, 0.01)[1]))


def test_beats_the_raw_reads_on_held_out_ece_and_mae():
    """A model that reads one level too high and too sure: 0.85 on the level above the true one."""
    rng = np.random.default_rng(3)
    latent = rng.uniform(0, K - 1, 2500)
    truth = level_probabilities(latent - (K - 1) / 2, SLOPE, THRESHOLDS)
    gold = np.array([rng.choice(K, p=row) for row in truth])
    leaning = np.minimum(np.round(latent).astype(int) + 1, K - 1)
    raw = np.full((len(latent), K), 0.15 / (K - 1))
    raw[np.arange(len(latent)), leaning] = 0.85
    fit, held = slice(0, 200), slice(200, None)
    calibrated = (
        CumulativeLogitScaler().fit(as_logits(raw[fit]), gold[fit]).predict_proba(as_logits(raw[held]))
    )
    assert ece(calibrated, gold[held]) < ece(raw[held], gold[held]) / 3
    assert level_absolute_error(calibrated, gold[held]) < level_absolute_error(raw[held], gold[held]) - 0.2


def test_probabilities_sum_to_one_and_thresholds_stay_ordered():
    rng = np.random.default_rng(4)
    logits = rng.normal(0, 4, size=(400, K))  # far-out reads too
    gold = rng.integers(0, K, 400)  # unrelated to the reads: a poor fit, still a valid one
    scaler = CumulativeLogitScaler().fit(logits, gold)
    assert np.all(np.diff(scaler.thresholds_) > 0)
    q = scaler.predict_proba(logits)
    assert np.all(q >= 0) and q.sum(axis=1) == pytest.approx(np.ones(400), abs=1e-12)
    # Far past every threshold a level's probability keeps its digits: P(4) at score −60 is
    # 1 − σ(θ₃ + 60), which 1 minus a cumulative probability would round to 0.
    far = level_probabilities(np.array([-60.0, 0.0, 60.0]), 1.0, THRESHOLDS)
    assert far.sum(axis=1) == pytest.approx(np.ones(3), abs=1e-12)
    assert far[0, 0] == pytest.approx(1.0) and far[2, 4] == pytest.approx(1.0)
    assert far[0, 4] == pytest.approx(expit(-(THRESHOLDS[3] + 60)), rel=1e-9) and far[0, 4] > 0


def test_a_top_level_no_gold_answer_takes_keeps_a_small_finite_probability():
    p, gold = ordinal_draws(200, seed=5)
    capped = np.minimum(gold, K - 2)
    scaler = CumulativeLogitScaler().fit(as_logits(p), capped)
    q = scaler.predict_proba(as_logits(p))
    assert np.all(np.isfinite(scaler.thresholds_)) and np.all(np.diff(scaler.thresholds_) > 0)
    assert 0 < q[:, K - 1].max() < 0.05 and q.sum(axis=1) == pytest.approx(np.ones(200))


def test_a_middle_level_no_gold_answer_takes_gets_about_none():
    p, gold = ordinal_draws(200, seed=6)
    scaler = CumulativeLogitScaler().fit(as_logits(p), np.where(gold == 2, 1, gold))
    assert scaler.predict_proba(as_logits(p))[:, 2].max() < 1e-3
    assert np.all(np.diff(scaler.thresholds_) >= 0)


def test_one_gold_level_or_one_read_throughout_does_not_crash():
    p, gold = ordinal_draws(60, seed=7)
    only = CumulativeLogitScaler().fit(as_logits(p), np.full(60, 3)).predict_proba(as_logits(p))
    assert np.all(only[:, 3] > 0.95)
    same = np.tile(p[:1], (60, 1))  # every read alike: nothing to rank by
    flat = CumulativeLogitScaler().fit(as_logits(same), gold).predict_proba(as_logits(same))
    assert flat[0] == pytest.approx(np.bincount(gold, minlength=K) / 60, abs=0.02)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="one level count"):
        CumulativeLogitScaler().fit([[0.0, 0.0], [0.0, 0.0, 0.0]], [0, 1])
    with pytest.raises(ValueError, match="finite"):
        CumulativeLogitScaler().fit([[0.0, np.inf, 0.0]], [0])
    with pytest.raises(ValueError, match="outside"):
        CumulativeLogitScaler().fit([[0.0, 0.0, 0.0]], [3])
    with pytest.raises(ValueError, match="l2"):
        CumulativeLogitScaler(l2=0.0)
    with pytest.raises(ValueError, match="thresholds fit"):
        apply_cumulative_logit(np.zeros((2, 3)), 1.0, THRESHOLDS)
