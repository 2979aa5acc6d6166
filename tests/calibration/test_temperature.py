"""Temperature fit: recovers a known temperature, never worse than T = 1, agrees with a grid."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.temperature import TemperatureScaler, apply_temperature, as_logits, nll_at


def draws(temperature: float, n: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 2.0, size=(n, k))
    p = apply_temperature(logits, temperature)
    gold = np.array([rng.choice(k, p=row) for row in p])
    return logits, gold


@pytest.mark.parametrize("temperature", [0.4, 1.0, 3.0])
def test_recovers_a_known_temperature(temperature):
    logits, gold = draws(temperature, 6000, 4, seed=int(temperature * 10))
    fitted = TemperatureScaler().fit(logits, gold).temperature_
    assert fitted == pytest.approx(temperature, rel=0.12)


@pytest.mark.slow  # a fine grid search over temperatures
def test_never_worse_than_t1_and_matches_a_grid_search():
    for seed in range(5):
        logits, gold = draws(2.0, 80, 3, seed=seed)
        scaler = TemperatureScaler().fit(logits, gold)
        assert scaler.nll_after_ <= scaler.nll_before_ + 1e-12
        assert scaler.nll_before_ == pytest.approx(nll_at(logits, gold, 1.0))
        grid = np.exp(np.linspace(np.log(0.05), np.log(20), 4001))
        best = grid[np.argmin([nll_at(logits, gold, t) for t in grid])]
        assert scaler.temperature_ == pytest.approx(best, rel=0.01)


def test_pooled_option_counts_fit_one_temperature():
    two, y2 = draws(2.0, 3000, 2, seed=1)
    five, y5 = draws(2.0, 3000, 5, seed=2)
    rows = [*two, *five]
    gold = np.concatenate([y2, y5])
    assert TemperatureScaler().fit(rows, gold).temperature_ == pytest.approx(2.0, rel=0.12)


def test_shift_invariance_lets_probabilities_stand_in_for_logprobs():
    logprobs = np.array([[-3.0, -5.0, -4.0]])
    probabilities = np.exp(logprobs) / np.exp(logprobs).sum()
    assert apply_temperature(as_logits(probabilities), 2.5) == pytest.approx(apply_temperature(logprobs, 2.5))


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        TemperatureScaler().fit([[0.0, np.inf]], [0])
    with pytest.raises(ValueError):
        TemperatureScaler().fit([[0.0, 1.0]], [2])
    with pytest.raises(ValueError):
        TemperatureScaler(t_min=2.0)
