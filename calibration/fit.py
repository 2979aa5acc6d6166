"""Fitting a calibration for one key and storing it: pure calibration, no HTTP and no engine.

Each fit stores the calibration (``mode`` ``temperature``: T; ``temperature_bias``: T and one bias per
option, ``calibration.bias``) fitted on all n decisions with a gold answer, and reports held-out ECE
(15 bins) before and after: a seeded random half fits the same mode, the other half is scored raw and
calibrated, beside the ECE floor of its calibrated probabilities (``calibration.metrics.ece_floor``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from calibration.bias import TemperatureBiasScaler
from calibration.metrics import N_BINS, ece, ece_floor
from calibration.store import MODES, Calibration, CalibrationKey, CalibrationStore
from calibration.temperature import TemperatureScaler, as_logits

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


def scaler_for(mode: str) -> TemperatureScaler | TemperatureBiasScaler:
    """An unfitted scaler of calibration ``mode``."""
    if mode == "temperature":
        return TemperatureScaler()
    if mode == "temperature_bias":
        return TemperatureBiasScaler()
    raise ValueError(f"mode is one of {', '.join(MODES)}, not {mode!r}")


def fit_and_store(
    store: CalibrationStore, key: CalibrationKey, rows: list[tuple[list[float], int]], *, source: str, seed: int = 0, mode: str = "temperature"
) -> Calibration:
    """Fit ``mode`` on all ``rows`` (raw probabilities, gold index), score a held-out half, store."""
    if len(rows) < MIN_GOLD:
        raise ValueError(f"{len(rows)} decisions with a gold answer; a calibration needs at least {MIN_GOLD}")
    if mode == "temperature_bias" and key.option_count is None:
        raise ValueError("a temperature_bias calibration needs an option count: its biases are per option")
    logits = [as_logits(probabilities) for probabilities, _ in rows]
    labels = np.array([gold for _, gold in rows])
    scaler = scaler_for(mode).fit(logits, labels)

    order = np.random.default_rng(seed).permutation(len(rows))
    fit_half, score_half = order[: len(rows) // 2], order[len(rows) // 2 :]
    half = scaler_for(mode).fit([logits[i] for i in fit_half], labels[fit_half])
    raw = _padded([np.exp(logits[i]) / np.exp(logits[i]).sum() for i in score_half])
    calibrated = _padded([half.predict_proba(logits[i]) for i in score_half])
    return store.add_calibration(
        key,
        temperature=scaler.temperature_,
        n=scaler.n_samples_,
        source=source,
        mode=mode,
        bias=getattr(scaler, "bias_", None),
        nll_before=scaler.nll_before_,
        nll_after=scaler.nll_after_,
        heldout_n=len(score_half),
        heldout_ece_before=ece(raw, labels[score_half], N_BINS),
        heldout_ece_after=ece(calibrated, labels[score_half], N_BINS),
        heldout_ece_floor=ece_floor(calibrated, N_BINS, seed=seed)["median"],
    )
