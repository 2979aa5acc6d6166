"""Temperature + per-option bias, the prior correction and the state prior."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.bias import (
    StatePriorScaler,
    TemperatureBiasScaler,
    apply_prior,
    apply_temperature_bias,
    option_prior,
)
from calibration.temperature import TemperatureScaler, nll_at


def leaning_draws(temperature: float, bias, n: int, seed: int):
    """Reads whose true answers follow softmax(z / T + b): a model that leans away from some options."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 2.0, size=(n, len(bias)))
    p = apply_temperature_bias(logits, temperature, bias)
    gold = np.array([rng.choice(len(bias), p=row) for row in p])
    return logits, gold


def test_recovers_a_known_temperature_and_bias():
    bias = np.array([1.0, -0.5, 0.0, -0.5])
    logits, gold = leaning_draws(2.0, bias, 8000, seed=3)
    scaler = TemperatureBiasScaler(l2=0.0).fit(logits, gold)
    assert scaler.temperature_ == pytest.approx(2.0, rel=0.1)
    assert scaler.bias_ == pytest.approx(bias - bias.mean(), abs=0.1)
    assert scaler.bias_.sum() == pytest.approx(0.0, abs=1e-9)


def test_beats_temperature_alone_on_held_out_reads_when_the_model_leans():
    bias = np.array([1.5, -1.0, -0.5])
    logits, gold = leaning_draws(1.5, bias, 1050, seed=4)
    fit, held = slice(0, 50), slice(50, None)
    with_bias = TemperatureBiasScaler().fit(logits[fit], gold[fit])
    alone = TemperatureScaler().fit(logits[fit], gold[fit])
    nll_bias = -np.log(with_bias.predict_proba(logits[held])[np.arange(1000), gold[held]]).mean()
    assert nll_bias < nll_at(logits[held], gold[held], alone.temperature_)
    accuracy_bias = (with_bias.predict_proba(logits[held]).argmax(1) == gold[held]).mean()
    assert (
        accuracy_bias > (logits[held].argmax(1) == gold[held]).mean()
    )  # a bias can move the top option; T cannot


def test_the_penalty_shrinks_the_bias_and_fit_nll_never_beats_the_unpenalised_fit():
    logits, gold = leaning_draws(1.0, [0.8, -0.8], 60, seed=5)
    free, shrunk = (
        TemperatureBiasScaler(l2=0.0).fit(logits, gold),
        TemperatureBiasScaler(l2=1.0).fit(logits, gold),
    )
    assert np.abs(shrunk.bias_).sum() < np.abs(free.bias_).sum()
    assert free.nll_after_ <= shrunk.nll_after_ + 1e-9 and free.nll_after_ <= free.nll_before_


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="one option count"):
        TemperatureBiasScaler().fit([[0.0, 1.0], [0.0, 1.0, 2.0]], [0, 1])
    with pytest.raises(ValueError, match="outside its row"):
        TemperatureBiasScaler().fit([[0.0, 1.0]], [2])
    with pytest.raises(ValueError, match="l2"):
        TemperatureBiasScaler(l2=-1.0)
    with pytest.raises(ValueError, match="options"):
        apply_prior([[0.5, 0.5]], [0.2, 0.3, 0.5])
    with pytest.raises(ValueError, match="above 0"):
        option_prior([[1.0, 0.0]])


def test_dividing_out_the_prior_undoes_a_lean_the_model_has_on_every_state():
    """A model that multiplies option 0 by 4 on every read: its content-free reads measure that factor,
    and dividing it out gives back the unbiased probabilities."""
    rng = np.random.default_rng(6)
    honest = rng.dirichlet([1, 1, 1], size=200)
    lean = np.array([4.0, 1.0, 1.0])
    leaning = honest * lean / (honest * lean).sum(axis=1, keepdims=True)
    content_free = np.tile(lean / lean.sum(), (3, 1))  # no content: only the lean is left
    prior = option_prior(content_free)
    assert prior == pytest.approx([2 / 3, 1 / 6, 1 / 6])
    assert apply_prior(leaning, prior) == pytest.approx(honest)
    assert apply_prior(leaning, prior).sum(axis=1) == pytest.approx(np.ones(200))


def test_a_state_prior_fitted_without_gold_undoes_a_lean_on_real_states():
    """Balanced classes, reads that favour the true option, times a lean towards option 0 on every
    state: the mean of the reads carries the lean, so dividing it out recovers accuracy; the fit
    never sees a gold answer, and is the same stored as a bias as applied as a divided prior."""
    rng = np.random.default_rng(8)
    n, k = 600, 4
    gold = rng.integers(0, k, size=n)
    honest = rng.dirichlet(np.ones(k), size=n) * np.where(np.arange(k) == gold[:, None], 4.0, 1.0)
    leaning = honest * np.array([12.0, 1, 1, 1])
    leaning /= leaning.sum(axis=1, keepdims=True)
    logits = np.log(leaning)
    fit, held = slice(0, 300), slice(300, n)
    scaler = StatePriorScaler().fit(logits[fit])
    calibrated = scaler.predict_proba(logits[held])
    uncalibrated_accuracy = np.mean(leaning[held].argmax(axis=1) == gold[held])
    honest_accuracy = np.mean(honest[held].argmax(axis=1) == gold[held])
    assert (
        uncalibrated_accuracy + 0.1 < np.mean(calibrated.argmax(axis=1) == gold[held])
        and np.mean(calibrated.argmax(axis=1) == gold[held]) > honest_accuracy - 0.05
    )
    assert (
        scaler.temperature_ == 1.0
        and scaler.n_samples_ == 300
        and scaler.bias_.sum() == pytest.approx(0.0, abs=1e-9)
    )
    assert calibrated == pytest.approx(apply_prior(leaning[held], option_prior(leaning[fit])))
    assert StatePriorScaler().fit(logits[fit], gold[fit]).bias_ == pytest.approx(
        scaler.bias_
    )  # the gold answers are not used
    with pytest.raises(ValueError, match="one option count"):
        StatePriorScaler().fit([[0.0, -1.0], [0.0, -1.0, -2.0]])


def test_fit_and_store_fits_a_state_prior_without_gold_and_scores_only_rows_with_gold(tmp_path):
    """Stored in a real SQLite file: no gold, no held-out scores; some gold, scored on those alone;
    a calibration mode that needs gold, given a row without it, is refused."""
    from calibration.fit import fit_and_store
    from calibration.open import open_store
    from calibration.store import CalibrationKey

    rng = np.random.default_rng(9)
    gold = rng.integers(0, 3, size=40)
    p = (
        rng.dirichlet(np.ones(3), size=40)
        * np.where(np.arange(3) == gold[:, None], 3.0, 1.0)
        * np.array([5.0, 1, 1])
    )
    p /= p.sum(axis=1, keepdims=True)
    store = open_store(tmp_path / "c.sqlite3")
    key = CalibrationKey("m", "r", "choice", 3, read_version="v")
    without_gold = fit_and_store(
        store, key, [(row.tolist(), None) for row in p], source="states", mode="state_prior"
    )
    assert without_gold.heldout_n is None and without_gold.nll_before is None and without_gold.n == 40
    assert list(without_gold.bias) == pytest.approx(StatePriorScaler().fit(np.log(p)).bias_)
    half = [(row.tolist(), int(y) if i % 2 else None) for i, (row, y) in enumerate(zip(p, gold))]
    some = fit_and_store(store, key, half, source="states", mode="state_prior")
    assert (
        0 < some.heldout_n < 20 and some.heldout_ece_after is not None and some.nll_after < some.nll_before
    )  # the lean undone
    assert list(some.bias) == pytest.approx(
        list(without_gold.bias)
    )  # the gold answers change nothing in the fit
    with pytest.raises(ValueError, match="needs a gold answer for every decision"):
        fit_and_store(store, key, half, source="examples", mode="temperature_bias")
