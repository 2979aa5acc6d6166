"""The mode chosen per fit by cross-validation, and the gold-prior fit, on the embedded model's
committed dev reads (evidence/few-shot/round-2)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from calibration.bias import GoldPriorScaler
from calibration.select import SELECT_CANDIDATES, STORED_MODE, CrossValidatedScaler
from calibration.store import CalibrationKey
from calibration.temperature import T_MAX, nll_at
from eval.decisions.few_shot import DEV_RUNS, task_reads
from eval.evidence.rows import load_rows
from service.pipeline.decide import calibrated_probabilities

ROOT = Path(__file__).resolve().parents[2]


def reads(task: str) -> tuple[np.ndarray, np.ndarray]:
    question_type = {"irony": "noul", "sst2": "choice"}[task]
    return task_reads(load_rows(ROOT / DEV_RUNS[question_type]), task)


def test_where_the_read_knows_nothing_the_fit_answers_the_gold_majority():
    # The irony read's P(yes) has AUROC 0.51 (read-signal.md); it answers "yes" on 8 of 200 records.
    logits, gold = reads("irony")
    fit = CrossValidatedScaler().fit(logits[:100], gold[:100])
    assert fit.selected_ == "gold_prior" and fit.mode_ == "temperature_bias"
    assert fit.temperature_ == pytest.approx(T_MAX)
    answers = fit.predict_proba(logits).argmax(axis=1)
    majority = np.bincount(gold[:100]).argmax()
    assert np.all(answers == majority)
    assert np.mean(logits.argmax(axis=1) == majority) < 1  # the read alone did not


def test_where_the_read_separates_the_options_a_bias_is_kept_and_moves_answers_right():
    # SST-2's read leans to "positive" (161 of 200 answers, 102 true) but separates well (AUROC 0.86).
    logits, gold = reads("sst2")
    order = np.random.default_rng(0).permutation(len(gold))
    train, held = order[:100], order[100:]
    fit = CrossValidatedScaler().fit(logits[train], gold[train])
    assert fit.selected_ in ("temperature_bias", "affine")
    assert fit.cv_nll_[fit.selected_] < fit.cv_nll_["temperature"] < fit.cv_nll_["gold_prior"]
    accuracy = np.mean(fit.predict_proba(logits[held]).argmax(axis=1) == gold[held])
    assert accuracy > np.mean(logits[held].argmax(axis=1) == gold[held]) + 0.05


def test_the_choice_is_the_lowest_held_out_nll_and_identity_is_scored_without_a_fit():
    logits, gold = reads("sst2")
    fit = CrossValidatedScaler().fit(logits[:60], gold[:60])
    assert set(fit.cv_nll_) == set(SELECT_CANDIDATES)
    assert fit.cv_nll_[fit.selected_] == min(fit.cv_nll_.values())
    # Identity fits nothing, so its held-out NLL is the read's own NLL; every fitted candidate's is
    # scored on folds it never saw, so none may equal its in-sample NLL.
    assert fit.cv_nll_["identity"] == pytest.approx(nll_at(logits[:60], gold[:60], 1.0))
    assert fit.nll_before_ == pytest.approx(fit.cv_nll_["identity"])
    assert fit.nll_after_ < fit.cv_nll_[fit.selected_]
    # Fewer answers than folds: leave-one-out, still a choice among all candidates.
    few = CrossValidatedScaler().fit(logits[:4], gold[:4])
    assert few.n_samples_ == 4 and few.selected_ in SELECT_CANDIDATES


def test_the_selected_fit_round_trips_through_the_store_in_a_mode_the_service_applies(new_store):
    store = new_store()
    for task, count in (("irony", 2), ("sst2", 2)):
        logits, gold = reads(task)
        fit = CrossValidatedScaler().fit(logits[:80], gold[:80])
        key = CalibrationKey("smol", "rev", "choice", count, task, read_version="decide-prompt/7")
        store.add_calibration(
            key, temperature=fit.temperature_, n=fit.n_samples_, source="examples", mode=fit.mode_,
            bias=fit.bias_, mode_chosen_by="default", nll_before=fit.nll_before_, nll_after=fit.nll_after_,
        )  # fmt: skip
        stored = new_store().lookup(key)  # another connection reads it back
        assert (stored.mode, stored.n) == (STORED_MODE[fit.selected_], 80)
        raw = np.exp(logits[80:])
        served = np.array([calibrated_probabilities(row, stored, None) for row in raw])
        np.testing.assert_allclose(served, fit.predict_proba(logits[80:]), atol=1e-12)


def test_the_gold_prior_answers_about_the_gold_frequencies():
    logits, gold = reads("sst2")
    fit = GoldPriorScaler().fit(logits, gold)
    assert fit.temperature_ == pytest.approx(T_MAX)
    frequencies = np.bincount(gold, minlength=2) / len(gold)
    np.testing.assert_allclose(fit.predict_proba(logits).mean(axis=0), frequencies, atol=0.01)


def test_bad_settings_and_rows_are_refused():
    with pytest.raises(ValueError, match="at least 2 folds"):
        CrossValidatedScaler(folds=1)
    with pytest.raises(ValueError, match="a candidate is one of"):
        CrossValidatedScaler(candidates=("temperature", "platt"))
    logits, gold = reads("sst2")
    with pytest.raises(ValueError, match="at least 2 gold answers"):
        CrossValidatedScaler().fit(logits[:1], gold[:1])
    with pytest.raises(ValueError, match="one option count"):
        CrossValidatedScaler().fit([[0.0, -1.0], [0.0, -1.0, -2.0]], [0, 1])
