"""Fitting a calibration for one key and storing it: pure calibration, no HTTP and no engine.

Each fit stores the temperature fitted on all n decisions with a gold answer, and reports held-out ECE
(15 bins) before and after: a seeded random half fits a temperature, the other half is scored at T = 1
and at that temperature.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from calibration.metrics import N_BINS, ece
from calibration.store import Calibration, CalibrationKey, CalibrationStore
from calibration.temperature import TemperatureScaler, apply_temperature, as_logits

Gold = bool | int | str
"""A true answer: noul true/false, a choice option's name, a score level (0-based)."""

MIN_GOLD = 10
"""Fewest decisions with a gold answer a calibration is fitted on."""
NOUL_GOLD = {True: 0, "true": 0, "yes": 0, False: 1, "false": 1, "no": 1}


def gold_index(question_type: str, options: Sequence[str], gold: Gold) -> int:
    """The option index a true answer names; ValueError when it names none."""
    if question_type == "noul":
        key = gold.lower() if isinstance(gold, str) else gold
        if isinstance(key, bool) or key in ("true", "false", "yes", "no"):
            return NOUL_GOLD[key]
        raise ValueError(f"a noul answer is true or false, not {gold!r}")
    if question_type == "score":
        level = gold if isinstance(gold, int) and not isinstance(gold, bool) else int(gold) if isinstance(gold, str) and gold.isdigit() else None
        if level is None or not 0 <= level < len(options):
            raise ValueError(f"a score answer is a level from 0 to {len(options) - 1}, not {gold!r}")
        return level
    if isinstance(gold, str) and gold in options:
        return list(options).index(gold)
    raise ValueError(f"{gold!r} is not one of the options")


def _padded(probabilities: list[np.ndarray]) -> np.ndarray:
    """Rows of different option counts as one array; zero columns change no top label."""
    width = max(len(row) for row in probabilities)
    return np.array([np.pad(row, (0, width - len(row))) for row in probabilities])


def fit_and_store(store: CalibrationStore, key: CalibrationKey, rows: list[tuple[list[float], int]], *, source: str, seed: int = 0) -> Calibration:
    """Fit T on all ``rows`` (raw probabilities, gold index), score a held-out half, store."""
    if len(rows) < MIN_GOLD:
        raise ValueError(f"{len(rows)} decisions with a gold answer; a calibration needs at least {MIN_GOLD}")
    logits = [as_logits(probabilities) for probabilities, _ in rows]
    labels = np.array([gold for _, gold in rows])
    scaler = TemperatureScaler().fit(logits, labels)

    order = np.random.default_rng(seed).permutation(len(rows))
    fit_half, score_half = order[: len(rows) // 2], order[len(rows) // 2 :]
    half = TemperatureScaler().fit([logits[i] for i in fit_half], labels[fit_half])
    raw = _padded([np.exp(logits[i]) / np.exp(logits[i]).sum() for i in score_half])
    calibrated = _padded([apply_temperature(logits[i], half.temperature_) for i in score_half])
    return store.add_calibration(
        key,
        temperature=scaler.temperature_,
        n=scaler.n_samples_,
        source=source,
        nll_before=scaler.nll_before_,
        nll_after=scaler.nll_after_,
        heldout_n=len(score_half),
        heldout_ece_before=ece(raw, labels[score_half], N_BINS),
        heldout_ece_after=ece(calibrated, labels[score_half], N_BINS),
    )
