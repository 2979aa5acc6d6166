"""Fitting a calibration for one key and storing it: pure calibration, no HTTP and no engine.

Each fit stores the calibration (``mode`` ``temperature``: T; ``temperature_bias`` and ``affine``: T
and one bias per option; ``state_prior``: the bias that divides out the mean of the reads, fitted without gold answers;
``calibration.bias``) fitted on all n decisions (each with a gold answer, but for ``state_prior``),
and reports held-out ECE (15 bins) before and after: a seeded random half fits the same mode, the
other half is scored uncalibrated and calibrated, beside the ECE floor of its calibrated probabilities
(``calibration.metrics.ece_floor``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from calibration.bias import AffineScaler, StatePriorScaler, TemperatureBiasScaler
from calibration.metrics import N_BINS, ece, ece_floor
from calibration.probe import ProbeScaler
from calibration.store import (
    BIAS_MODES,
    CALIBRATION_MODES,
    FEATURE_MODES,
    Calibration,
    CalibrationKey,
    CalibrationStore,
)
from calibration.temperature import TemperatureScaler, as_logits

Gold = bool | int | str
"""A true answer: noul true/false, a choice option's name, a score level (0-based)."""

MIN_GOLD = 10
"""Fewest decisions with a gold answer a calibration is fitted on."""
NOUL_GOLD = {True: 0, "true": 0, "yes": 0, False: 1, "false": 1, "no": 1}
DEFAULT_MODES: dict[str, tuple[str, int]] = {"noul": ("probe", 32), "choice": ("probe", 16)}
"""Per question type, (mode, fewest gold answers): the mode a fit gets when the caller names none,
every decision it is fitted on comes with the answer slot's hidden state (the local engine), and it
has at least that many gold answers; ``temperature`` otherwise and for the types not listed. Chosen
per type on the dev split by rules committed before each run, confirmed on held-out records
(docs/calibration.md): round 1 (evidence/few-shot/rule.md) made choice questions ``temperature_bias``
from 32 and kept temperature for yes/no and score; round 2 (a mode chosen per fit by cross-validation)
changed nothing; round 3 (evidence/few-shot/round-3/rule.md) made choice questions ``probe`` from 32;
round 4 (evidence/few-shot/round-4/rule.md: the probe averaged over fits on resampled gold answers,
ECE read over all splits pooled) made yes/no and choice questions ``probe`` from 32 and kept
temperature for score; round 5 (evidence/few-shot/round-5/rule.md: a type's ECE the mean of its
tasks', confirmed on the fresh split) moved choice's start to 16."""
DEFAULT_MODES_WITHOUT_FEATURES: dict[str, tuple[str, int]] = {"choice": ("temperature_bias", 32)}
"""``DEFAULT_MODES`` where a decision comes without the hidden state (a vLLM engine; a decision
recorded before the state was): round 5's rule without the probe, confirmed on the fresh split
(choice 56.4% → 62.1%, nothing regresses; evidence/few-shot/round-5/fresh-confirm-without-features.md).
Round 4's reading of ECE had kept temperature for every type."""
DEFAULT_MAX_OPTIONS = 6
"""The most options a key gets a default other than temperature: the most the rules' tasks had
(emotion's six). Beyond that the defaults are untested, and the probe's weights grow with the
options (576 numbers each per fit on SmolLM2-135M; ten fits are ~8 MB of stored text at 255); a
caller may still name any mode."""


def gold_index(question_type: str, options: Sequence[str], gold: Gold) -> int:
    """The option index a true answer names; ValueError when it names none."""
    if question_type == "noul":
        key = gold.lower() if isinstance(gold, str) else gold
        if isinstance(key, bool) or key in ("true", "false", "yes", "no"):
            return NOUL_GOLD[key]
        raise ValueError(f"a noul answer is true or false, not {gold!r}")
    if question_type == "score":
        level = (
            gold
            if isinstance(gold, int) and not isinstance(gold, bool)
            else int(gold)
            if isinstance(gold, str) and gold.isdigit()
            else None
        )
        if level is None or not 0 <= level < len(options):
            raise ValueError(f"a score answer is a level from 0 to {len(options) - 1}, not {gold!r}")
        return level
    if isinstance(gold, str) and gold in options:
        return list(options).index(gold)
    raise ValueError(f"{gold!r} is not one of the options")


def _padded(probabilities: list[np.ndarray]) -> np.ndarray:
    """Rows of different option counts as one array; zero columns change no top class."""
    width = max(len(row) for row in probabilities)
    return np.array([np.pad(row, (0, width - len(row))) for row in probabilities])


def default_mode(question_type: str, n: int, option_count: int | None, *, features: bool = False) -> str:
    """The mode of a fit on ``n`` gold answers that names none: ``DEFAULT_MODES`` where every
    decision comes with the answer slot's hidden state (``features``), else
    ``DEFAULT_MODES_WITHOUT_FEATURES``; temperature below the table's count, past
    ``DEFAULT_MAX_OPTIONS`` options, and on a key without an option count, where a per-option bias
    has no options to belong to."""
    mode, fewest = (DEFAULT_MODES if features else DEFAULT_MODES_WITHOUT_FEATURES).get(
        question_type, ("temperature", 0)
    )
    if n < fewest or option_count is None or option_count > DEFAULT_MAX_OPTIONS:
        return "temperature"
    return mode


def refit_mode(current: Calibration | None) -> str | None:
    """The mode a refit from feedback of ``current``'s key uses: the mode a caller named for the key's
    latest fit (``mode_chosen_by`` ``caller``), kept whatever the defaults say; None, the defaults at the
    refit's n (:func:`fit_and_store`), for a key that got its mode from them or has no fit of its own.
    Who chose is stored, not inferred from the mode: a temperature fit the caller asked for and one the
    defaults gave below 32 answers look the same, and only the second should move on."""
    return current.mode if current is not None and current.mode_chosen_by == "caller" else None


def scaler_for(mode: str) -> TemperatureScaler | TemperatureBiasScaler | StatePriorScaler | ProbeScaler:
    """An unfitted scaler of calibration ``mode`` (a ``FEATURE_MODES`` one fits and predicts on the
    hidden states as well: :func:`fitted_scaler`)."""
    if mode == "temperature":
        return TemperatureScaler()
    if mode == "temperature_bias":
        return TemperatureBiasScaler()
    if mode == "affine":
        return AffineScaler()
    if mode == "state_prior":
        return StatePriorScaler()
    if mode == "probe":
        return ProbeScaler()
    raise ValueError(f"mode is one of {', '.join(CALIBRATION_MODES)}, not {mode!r}")


def fitted_scaler(mode: str, logits: list[np.ndarray], gold: np.ndarray, features: np.ndarray | None, rows):
    """``mode`` fitted on ``rows`` (indices); returns a function of the rows to predict."""
    scaler = scaler_for(mode)
    if mode in FEATURE_MODES:
        scaler.fit([logits[i] for i in rows], gold[rows], features[rows])  # one option count: rows stack
        return scaler, lambda at: scaler.predict_proba(np.stack([logits[i] for i in at]), features[at])
    scaler.fit([logits[i] for i in rows], gold[rows])
    return scaler, lambda at: _padded([scaler.predict_proba(logits[i]) for i in at])


def fit_and_store(
    store: CalibrationStore,
    key: CalibrationKey,
    rows: list[tuple[list[float], int | None]],
    *,
    source: str,
    seed: int = 0,
    mode: str | None = None,
    shared: bool = False,
    features: list | None = None,
) -> Calibration:
    """Fit ``mode`` on all ``rows`` (uncalibrated probabilities, gold index), score a held-out half, store
    under ``key``, or among the shared fits (``key.as_shared()``) when ``shared``. ``mode`` None:
    :func:`default_mode` at ``len(rows)``, stored as ``mode_chosen_by`` ``default``; a named mode is
    stored as the caller's. ``features``: each row's answer-slot hidden state or None; a
    ``FEATURE_MODES`` fit needs every row's, and the defaults offer one only where every row has it.

    ``state_prior`` needs no gold answers (a row's gold may be None): it fits on every row, and the
    held-out scores and NLLs are reported over the rows that have one (None when none has).
    """
    chosen_by = "caller" if mode is not None else "default"
    has_features = (
        features is not None and len(features) == len(rows) and all(f is not None for f in features)
    )
    mode = mode or default_mode(key.question_type, len(rows), key.option_count, features=has_features)
    needs_gold = mode != "state_prior"
    if needs_gold and any(gold is None for _, gold in rows):
        raise ValueError(
            f"a {mode} calibration needs a gold answer for every decision; only state_prior fits without"
        )
    if len(rows) < MIN_GOLD:
        what = "decisions with a gold answer" if needs_gold else "decisions"
        raise ValueError(f"{len(rows)} {what}; a calibration needs at least {MIN_GOLD}")
    if mode in BIAS_MODES and key.option_count is None:
        raise ValueError(f"a {mode} calibration needs an option count: its biases are per option")
    if mode in FEATURE_MODES and not has_features:
        missing = len(rows) if features is None else sum(f is None for f in features)
        raise ValueError(
            f"a {mode} calibration reads the answer slot's hidden state, and {missing} of {len(rows)} decisions "
            "have none: only an engine that returns it (the local engine) can fit one"
        )
    logits = [as_logits(probabilities) for probabilities, _ in rows]
    gold = np.array([-1 if index is None else index for _, index in rows])  # -1: no gold answer
    state = np.asarray(features, dtype=float) if mode in FEATURE_MODES else None
    has_gold = gold >= 0
    scaler, _ = fitted_scaler(mode, logits, gold, state, np.arange(len(rows)))

    order = np.random.default_rng(seed).permutation(len(rows))
    fit_half, score_half = order[: len(rows) // 2], order[len(rows) // 2 :]
    _, predict = fitted_scaler(mode, logits, gold, state, fit_half)
    scored = [i for i in score_half if has_gold[i]]
    metrics: dict = {"heldout_n": len(scored) or None}
    if scored:
        uncalibrated = _padded([np.exp(logits[i]) / np.exp(logits[i]).sum() for i in scored])
        calibrated = predict(scored)
        metrics |= {
            "heldout_ece_before": ece(uncalibrated, gold[scored], N_BINS),
            "heldout_ece_after": ece(calibrated, gold[scored], N_BINS),
            "heldout_ece_floor": ece_floor(calibrated, N_BINS, seed=seed)["median"],
        }
    return store.add_calibration(
        key.as_shared() if shared else key, temperature=scaler.temperature_, n=scaler.n_samples_, source=source, mode=mode, bias=getattr(scaler, "bias_", None),
        mode_chosen_by=chosen_by, probe=getattr(scaler, "probe_", None), nll_before=scaler.nll_before_, nll_after=scaler.nll_after_, **metrics,
    )  # fmt: skip


def refit_from_store(
    store: CalibrationStore,
    key: CalibrationKey,
    mode: str | None,
    gold_rows: list[tuple] | None = None,
    *,
    shared: bool = False,
) -> Calibration:
    """Fit ``key`` again from what the store holds of its tenant: its feedback (``gold_rows``, when the
    caller has already read them, with ``features=True``: each decision's hidden state where it has one), or for ``state_prior`` its recorded decisions, whose reads need no
    gold answer. ``mode`` None: :func:`default_mode` at the number of gold answers, stored as the
    defaults' choice. ``shared`` publishes the fit among the shared fits instead of the tenant's own.

    A state prior is one bias per option position, so it is fitted on the decisions asked with the
    latest decision's options in its order: others (another question with as many options, or the
    same options reordered) would average different options into one position."""
    if mode == "state_prior":
        recorded = store.recorded(key)
        latest = recorded[-1][0] if recorded else None
        return fit_and_store(
            store,
            key,
            [(uncalibrated, None) for options, uncalibrated in recorded if options == latest],
            source="decisions",
            mode=mode,
            shared=shared,
        )
    rows = store.gold_rows(key, features=True) if gold_rows is None else gold_rows
    return fit_and_store(
        store,
        key,
        [(probabilities, gold) for probabilities, gold, *_ in rows],
        source="feedback",
        mode=mode,
        shared=shared,
        features=[row[2] if len(row) > 2 else None for row in rows],
    )
