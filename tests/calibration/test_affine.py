"""The affine mode and the default mode after N gold answers, on the embedded model's committed reads."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from calibration.bias import AffineScaler, TemperatureBiasScaler
from calibration.fit import (
    DEFAULT_MAX_OPTIONS,
    DEFAULT_MODES,
    DEFAULT_MODES_WITHOUT_FEATURES,
    default_mode,
    fit_and_store,
    refit_from_store,
    refit_mode,
)
from calibration.open import open_store
from calibration.store import Calibration, CalibrationKey
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


def with_states(logits, gold, d: int = 16) -> list[tuple[list[float], int, tuple[float, ...]]]:
    """Gold rows as a store gives them to a refit, each with a hidden state (a stand-in: which mode a
    fit gets is at stake here, not what the state carries)."""
    states = np.random.default_rng(0).normal(size=(len(gold), d))
    return [(np.exp(z).tolist(), int(y), tuple(h)) for z, y, h in zip(logits, gold, states)]


def test_a_refit_without_a_mode_takes_the_default_of_its_type_and_n(tmp_path):
    logits, gold = emotion_reads()
    rows = with_states(logits, gold)
    store = open_store(tmp_path / "calibration.sqlite3")
    choice = CalibrationKey("smol", "rev", "choice", 6, None, read_version="decide-prompt/7+prior")
    mode, fewest = DEFAULT_MODES["choice"]  # rows with hidden states
    below = refit_from_store(store, choice, None, rows[: fewest - 1])
    at = refit_from_store(store, choice, None, rows[:fewest])
    assert (below.mode, at.mode) == ("temperature", mode)
    assert below.mode_chosen_by == at.mode_chosen_by == "default"  # no mode named: the defaults chose
    # Stored and read back from SQLite as the mode, bias and n it was fitted with.
    stored = store.lookup(choice)
    assert (stored.mode, stored.n, len(stored.bias), stored.probe_dimension) == (mode, fewest, 6, 16)
    # Without the states (a vLLM engine) round 5's rule without the probe: temperature_bias for
    # choice from 32, temperature below that and for the other types.
    plain, plain_fewest = DEFAULT_MODES_WITHOUT_FEATURES["choice"]
    without = [row[:2] for row in rows]
    vllm = replace(choice, domain="vllm")
    below = refit_from_store(store, vllm, None, without[: plain_fewest - 1])
    at = refit_from_store(store, vllm, None, without[:plain_fewest])
    assert (below.mode, at.mode) == ("temperature", plain) == ("temperature", "temperature_bias")
    assert at.probe_dimension is None and len(at.bias) == 6
    # With every decision's hidden state: yes/no and choice questions get the probe, score keeps temperature.
    assert default_mode("noul", 200, 2, features=True) == DEFAULT_MODES["noul"][0] == "probe"
    assert default_mode("choice", 200, 6, features=True) == DEFAULT_MODES["choice"][0] == "probe"
    assert default_mode("score", 200, 5, features=True) == default_mode("score", 200, 5) == "temperature"
    assert (
        default_mode("noul", 200, 2) == "temperature" and default_mode("choice", 200, 6) == "temperature_bias"
    )
    # A type-level key (no options for a per-option bias or W) keeps temperature.
    assert (
        default_mode("choice", 200, None, features=True) == default_mode("choice", 200, None) == "temperature"
    )
    # Past the option counts the rules were chosen on, no default but temperature (a caller may name any).
    assert default_mode("choice", 200, DEFAULT_MAX_OPTIONS + 1, features=True) == "temperature"
    assert default_mode("choice", 200, DEFAULT_MAX_OPTIONS + 1) == "temperature"


def test_feedback_refits_keep_a_mode_the_caller_named_and_move_a_default_one_on(new_store):
    logits, gold = emotion_reads()
    rows = with_states(logits, gold)
    mode, fewest = DEFAULT_MODES["choice"]  # rows with hidden states
    key = CalibrationKey("smol", "rev", "choice", 6, None, read_version="decide-prompt/7+prior")
    named, defaulted = replace(key, domain="named"), replace(key, domain="defaulted")
    store = new_store()
    # Both temperature fits on one answer fewer than the default's: one because its caller asked,
    # one because that is below the default's count.
    pairs, states = [row[:2] for row in rows[: fewest - 1]], [row[2] for row in rows[: fewest - 1]]
    fit_and_store(store, named, pairs, source="examples", mode="temperature", features=states)
    fit_and_store(store, defaulted, pairs, source="examples", features=states)
    store.close()
    store = new_store()  # who chose is read back from the store, not remembered by this process
    assert [(store.lookup(k).mode, store.lookup(k).mode_chosen_by) for k in (named, defaulted)] == [
        ("temperature", "caller"),
        ("temperature", "default"),
    ]
    for k in (named, defaulted):  # what POST /v1/feedback does when a refit is due
        refit_from_store(store, k, refit_mode(store.lookup(k)), rows[:fewest])
    assert (store.lookup(named).mode, store.lookup(named).mode_chosen_by) == ("temperature", "caller")
    assert (store.lookup(defaulted).mode, store.lookup(defaulted).mode_chosen_by) == (mode, "default")
    assert store.lookup(defaulted).n == fewest and len(store.lookup(defaulted).bias) == 6


def test_a_named_mode_is_kept_and_a_default_one_is_not():
    fitted = Calibration(
        "cal_1", "smol", "rev", "choice", 3, None, 1.0, 40, None, None, None, None, None,
        "feedback", "2026-12-01T00:00:00+00:00", "decide-prompt/7+prior",
        mode="affine", bias=(0.0, 0.0, 0.0),
    )  # fmt: skip
    assert refit_mode(fitted) == "affine"  # mode_chosen_by's default: the caller's
    assert refit_mode(replace(fitted, mode_chosen_by="default")) is None  # the defaults again, at the new n
    assert refit_mode(None) is None  # a key with no fit of its own
