"""The affine mode and the default mode after N gold answers, on the embedded model's committed reads."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from calibration.bias import AffineScaler, TemperatureBiasScaler
from calibration.fit import DEFAULT_MODES, default_mode, refit_from_store, refit_mode
from calibration.open import open_store
from calibration.store import CalibrationKey
from eval.decisions.few_shot import DEV_RUNS, task_reads
from eval.evidence.rows import load_rows

ROOT = Path(__file__).resolve().parents[2]


def emotion_reads() -> tuple[np.ndarray, np.ndarray]:
    """Prior-corrected decide-prompt/7 reads of the emotion dev records (six options)."""
    return task_reads(load_rows(ROOT / DEV_RUNS["choice"]), "emotion")


def test_a_few_gold_answers_move_affine_less_than_temperature_bias():
    logits, gold = emotion_reads()
    rng = np.random.default_rng(0)
    for split in range(5):
        fit = rng.choice(len(gold), size=4, replace=False)
        affine = AffineScaler().fit(logits[fit], gold[fit])
        free = TemperatureBiasScaler().fit(logits[fit], gold[fit])
        # The prior toward T = 1, b = 0 is what holds four answers back; the per-decision L2 barely does.
        assert np.abs(affine.bias_).max() < np.abs(free.bias_).max(), split
        assert abs(math.log(affine.temperature_)) <= abs(math.log(free.temperature_)) + 1e-9, split


def test_the_prior_fades_as_gold_answers_accumulate():
    logits, gold = emotion_reads()
    fit = np.random.default_rng(1).choice(len(gold), size=150, replace=False)
    affine = AffineScaler().fit(logits[fit], gold[fit])
    free = TemperatureBiasScaler().fit(logits[fit], gold[fit])
    assert affine.nll_after_ < affine.nll_before_
    # On 150 answers the fixed total weight is 1/150 of the data's: the two fits nearly agree.
    assert affine.nll_after_ == pytest.approx(free.nll_after_, abs=0.02)
    assert np.corrcoef(affine.bias_, free.bias_)[0, 1] > 0.95


def test_affine_needs_a_prior():
    with pytest.raises(ValueError, match="prior must be > 0"):
        AffineScaler(prior=0.0)


def test_a_refit_without_a_mode_takes_the_default_of_its_type_and_n(tmp_path):
    logits, gold = emotion_reads()
    rows = [(np.exp(z).tolist(), int(y)) for z, y in zip(logits, gold)]
    store = open_store(tmp_path / "calibration.sqlite3")
    choice = CalibrationKey("smol", "rev", "choice", 6, None, read_version="decide-prompt/7+prior")
    mode, fewest = DEFAULT_MODES["choice"]
    below = refit_from_store(store, choice, None, rows[: fewest - 1])
    at = refit_from_store(store, choice, None, rows[:fewest])
    assert (below.mode, at.mode) == ("temperature", mode)
    # Stored and read back from SQLite as the mode, bias and n it was fitted with.
    stored = store.lookup(choice)
    assert (stored.mode, stored.n, len(stored.bias)) == (mode, fewest, 6)
    # Keys no default covers: a type-level key (no options for a bias) and a yes/no key.
    assert default_mode("choice", 200, None) == "temperature"
    assert default_mode("noul", 200, 2) == "temperature"


def test_feedback_refits_follow_the_defaults_unless_the_caller_picked_another_mode():
    mode, fewest = DEFAULT_MODES["choice"]
    assert refit_mode(None, "choice", fewest, 3) == mode
    assert refit_mode("temperature", "choice", fewest, 3) == mode  # a key on the defaults moves on
    assert refit_mode("temperature", "choice", fewest - 1, 3) == "temperature"
    assert refit_mode("affine", "choice", fewest, 3) == "affine"
    assert refit_mode("state_prior", "noul", fewest, 2) == "state_prior"
