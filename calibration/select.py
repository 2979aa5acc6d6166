"""Choosing a fit's mode from the caller's own gold answers: the candidate with the lowest
cross-validated log-loss (``CrossValidatedScaler``).

Which mode helps depends on how much the read knows. Where it separates the options (SST-2, emotion)
a bias per option moves answers the right way; where it carries no signal (the irony yes/no read:
AUC 0.51 on the dev records) a slope fitted on 50 answers fits noise and moves answers at random,
and the best a fit can do is answer about the gold class frequencies. Rather than fix one mode per
question type, ``CrossValidatedScaler`` asks the gold answers: each candidate is fitted on all folds
but one and scored (NLL) on the one left out, over ``SELECT_FOLDS`` seeded folds (leave-one-out
below that many answers), and the candidate with the lowest mean held-out NLL is fitted on every
answer. Ties go to the simpler candidate (``SELECT_CANDIDATES`` order).

Every candidate has a stored form the service already applies (``STORED_MODE``): ``identity`` is
T = 1, ``gold_prior`` a ``temperature_bias`` with T at its bound (``calibration.bias``).
"""

from __future__ import annotations

import numpy as np

from calibration.bias import AffineScaler, GoldPriorScaler, TemperatureBiasScaler, _one_count
from calibration.temperature import TemperatureScaler, nll_at

SELECT_FOLDS = 5
SELECT_CANDIDATES = ("identity", "temperature", "gold_prior", "temperature_bias", "affine")
"""Simplest first: a tie on held-out NLL goes to the earlier one."""
STORED_MODE = {
    "identity": "temperature",
    "temperature": "temperature",
    "gold_prior": "temperature_bias",
    "temperature_bias": "temperature_bias",
    "affine": "affine",
}
"""The calibration mode (``calibration.store.CALIBRATION_MODES``) each candidate is stored as."""


class IdentityScaler(TemperatureScaler):
    """The read as it is (T = 1): the candidate that fits nothing."""

    def fit(self, logits, gold) -> IdentityScaler:
        self.temperature_ = 1.0
        self.n_samples_ = len(gold)
        self.nll_before_ = self.nll_after_ = nll_at(list(logits), gold, 1.0)
        return self


def candidate(name: str):
    """An unfitted scaler of candidate ``name``."""
    makers = {
        "identity": IdentityScaler,
        "temperature": TemperatureScaler,
        "gold_prior": GoldPriorScaler,
        "temperature_bias": TemperatureBiasScaler,
        "affine": AffineScaler,
    }
    if name not in makers:
        raise ValueError(f"a candidate is one of {', '.join(SELECT_CANDIDATES)}, not {name!r}")
    return makers[name]()


class CrossValidatedScaler:
    """Fit every candidate fold by fold, keep the one with the lowest held-out NLL, fit it on all rows.

    Attributes set by ``fit``: ``selected_`` (the candidate), ``mode_`` (its stored mode),
    ``cv_nll_`` (candidate → mean held-out NLL), and the chosen fit's ``temperature_``, ``bias_``
    (None for the temperature candidates), ``n_samples_``, ``nll_before_`` and ``nll_after_``.
    Rows must have one option count (the bias candidates have one bias per option).
    """

    def __init__(
        self, candidates: tuple[str, ...] = SELECT_CANDIDATES, folds: int = SELECT_FOLDS, seed: int = 0
    ) -> None:
        if folds < 2:
            raise ValueError("cross-validation needs at least 2 folds")
        for name in candidates:
            candidate(name)
        self.candidates, self.folds, self.seed = tuple(candidates), folds, seed

    def fit(self, logits, gold) -> CrossValidatedScaler:
        z, y = _one_count(logits, gold)
        if len(y) < 2:
            raise ValueError("cross-validation needs at least 2 gold answers")
        folds = min(self.folds, len(y))
        fold = np.random.default_rng(self.seed).permutation(len(y)) % folds
        self.cv_nll_ = {}
        for name in self.candidates:
            held_out = np.zeros(len(y))
            for f in range(folds):
                train, test = fold != f, fold == f
                p = candidate(name).fit(z[train], y[train]).predict_proba(z[test])
                held_out[test] = -np.log(np.clip(p[np.arange(test.sum()), y[test]], 1e-300, 1.0))
            self.cv_nll_[name] = float(held_out.mean())
        best = min(self.cv_nll_.values())
        self.selected_ = next(name for name in self.candidates if self.cv_nll_[name] <= best + 1e-12)
        self.mode_ = STORED_MODE[self.selected_]
        chosen = candidate(self.selected_).fit(z, y)
        self._chosen = chosen
        self.temperature_ = chosen.temperature_
        self.bias_ = getattr(chosen, "bias_", None)
        self.n_samples_ = chosen.n_samples_
        self.nll_before_ = nll_at(z, y, 1.0)
        self.nll_after_ = chosen.nll_after_
        return self

    def predict_proba(self, logits) -> np.ndarray:
        return self._chosen.predict_proba(logits)
