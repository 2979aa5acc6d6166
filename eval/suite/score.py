"""The suite's scorecard from a run's records: per subset, per question type and overall.

Pooled accuracy (Wilson 95% interval) and macro accuracy, families complete, ECE on 10 bins (as the
published tables), Brier, ECE after 50 gold answers (20 splits) and medians over subsets; score
subsets' MAE and Spearman; distribution subsets' Jensen–Shannon divergence and total variation;
family-clustered bootstrap intervals (:mod:`eval.suite.scorecard`); and "Jev minus arm" with an unpaired
two-proportion 95% interval against ``eval/data/reference/published_jev_nimble.json`` (Jev 1.13.0 as
published by Bespoke Labs).
"""

from __future__ import annotations

import json
import math
import statistics
from importlib import resources
from pathlib import Path

import numpy as np

from calibration.metrics import SUITE_N_BINS, brier_loss, ece, level_absolute_error
from calibration.temperature import as_logits
from eval.decisions.gold_curve import gold_curve
from eval.decisions.score import Z95, wilson_interval
from eval.evidence.manifest import MANIFEST, RunRefused
from eval.evidence.rows import RECORDS, load_rows, rows_arrays
from eval.suite.scorecard import (
    families_complete,
    family_bootstrap,
    js_divergence_bits,
    level_spearman,
    total_variation,
)

RESAMPLES = 1000


def published_jev() -> dict:
    return json.loads(
        resources.files("eval.data.reference").joinpath("published_jev_nimble.json").read_text()
    )


def jev_minus_arm(
    jev_accuracy: float, jev_n: int, arm_accuracy: float, arm_n: int
) -> tuple[float, float, float]:
    """Difference of two independent proportions with its normal 95% interval (unpaired)."""
    se = math.sqrt(jev_accuracy * (1 - jev_accuracy) / jev_n + arm_accuracy * (1 - arm_accuracy) / arm_n)
    difference = jev_accuracy - arm_accuracy
    return difference, difference - Z95 * se, difference + Z95 * se


def _group_scores(rows: list[dict], jev: tuple[float, int] | None) -> dict:
    correct = sum(row["predicted"] == row["gold"] for row in rows)
    lo, hi = wilson_interval(correct, len(rows))
    result = {"n": len(rows), "accuracy": correct / len(rows), "accuracy_ci95": [lo, hi]}
    if jev is not None:
        difference, d_lo, d_hi = jev_minus_arm(jev[0], jev[1], result["accuracy"], len(rows))
        result |= {"jev_accuracy": jev[0], "jev_minus_arm": difference, "jev_minus_arm_ci95": [d_lo, d_hi]}
    return result


def score_suite(run: Path, *, seed: int = 0, resamples: int = RESAMPLES) -> dict:
    """The scorecard of a suite run: per subset, per question type and overall; see the module docstring
    and :mod:`eval.suite.scorecard` for each figure's definition."""
    every = load_rows(run / RECORDS)
    rows = [row for row in every if row["status"] == "ok"]
    if not rows:
        raise RunRefused(f"{run}: no successful reads to score")
    errors = sum(1 for row in every if row["status"] != "ok")
    published = published_jev()["subsets"]
    manifest_path = run / MANIFEST
    checksums = json.loads(manifest_path.read_text()).get("checksums", {}) if manifest_path.is_file() else {}
    subsets, per_subset = {}, {}
    for subset in sorted({row["subset"] for row in rows}):
        mine = [row for row in rows if row["subset"] == subset]
        p, y = rows_arrays(mine)
        per_subset[subset] = (mine, p, y)
        jev = published.get(subset)
        entry = _group_scores(mine, (jev["jev_acc"], jev["n"]) if jev else None)
        complete, families = families_complete(
            [row["predicted"] == row["gold"] for row in mine], [row["family"] for row in mine]
        )
        entry |= {
            "question_type": mine[0]["question_type"],
            "families": families,
            "families_complete": complete,
        }
        entry |= {"ece": ece(p, y, SUITE_N_BINS), "brier": brier_loss(p, y)}
        if len(mine) >= 100:
            points = gold_curve(as_logits(p), y, counts=(50,), splits=20, seed=seed, n_bins=SUITE_N_BINS)[
                "points"
            ]
            entry["ece_after_50"] = points[0]["ece_mean"]
        if jev:
            entry |= {"jev_ece": jev["jev_ece"], "jev_brier": jev["jev_brier"]}
        if subset in checksums:
            entry["checksum"] = checksums[subset]["status"]
        subsets[subset] = entry

    statistic = _scorecard_statistic(per_subset)
    n = sum(len(mine) for mine, _, _ in per_subset.values())
    point = statistic(np.arange(n))
    strata = [subset for subset, (mine, _, _) in per_subset.items() for _ in mine]
    families = [row["family"] for mine, _, _ in per_subset.values() for row in mine]
    intervals = family_bootstrap(strata, families, statistic, resamples=resamples, seed=seed)
    for (group, name, metric), value in point.items():
        if group == "subset" and metric not in subsets[name]:
            subsets[name][metric] = value
    for (group, name, metric), interval in intervals.items():
        if group == "subset":
            subsets[name][f"{metric}_family_ci95"] = None if interval is None else list(interval)

    def pooled(question_type: str | None) -> dict | None:
        chosen = [row for row in rows if question_type is None or row["question_type"] == question_type]
        if not chosen:
            return None
        names = sorted({row["subset"] for row in chosen})
        jev = None
        if set(names) <= set(published):
            count = sum(published[s]["n"] for s in names)
            jev = (sum(published[s]["jev_acc"] * published[s]["n"] for s in names) / count, count)
        entry = _group_scores(chosen, jev) | {"subsets": len(names)}
        key = question_type or "all"
        entry["macro_accuracy"] = point[("group", key, "macro_accuracy")]
        if jev is not None:
            entry["jev_macro_accuracy"] = statistics.fmean(published[s]["jev_acc"] for s in names)
        for metric in ("accuracy", "macro_accuracy"):
            interval = intervals[("group", key, metric)]
            entry[f"{metric}_family_ci95"] = None if interval is None else list(interval)
        return entry

    question_types = {name: entry for name in ("noul", "choice", "score") if (entry := pooled(name))}
    after = [s["ece_after_50"] for s in subsets.values() if "ece_after_50" in s]
    return {
        "run": str(run),
        "n_bins": SUITE_N_BINS,
        "errors": errors,
        "bootstrap": {
            "resamples": resamples,
            "seed": seed,
            "cluster": "family, resampled within each subset",
            "interval": "percentile 2.5-97.5",
        },
        "checksums": checksums,
        "subsets": subsets,
        "question_types": question_types,
        "overall": pooled(None),
        "median_ece": statistics.median(s["ece"] for s in subsets.values()),
        "median_ece_after_50": statistics.median(after) if after else None,
        "median_brier": statistics.median(s["brier"] for s in subsets.values()),
    }


FigureKey = tuple[str, str, str]


def _scorecard_statistic(per_subset: dict[str, tuple[list[dict], np.ndarray, np.ndarray]]):
    """The function :func:`eval.suite.scorecard.family_bootstrap` resamples: record indices (into the
    subsets' rows, concatenated in order) → every bootstrapped figure, keyed (``subset``, name, metric)
    or (``group``, question type or ``all``, ``accuracy``/``macro_accuracy``)."""
    names = list(per_subset)
    offsets = np.cumsum([0] + [len(mine) for mine, _, _ in per_subset.values()])
    code = np.concatenate([np.full(len(mine), i) for i, (mine, _, _) in enumerate(per_subset.values())])
    correct = np.concatenate([p.argmax(axis=1) == y for _, p, y in per_subset.values()]).astype(float)
    types = {name: mine[0]["question_type"] for name, (mine, _, _) in per_subset.items()}
    # Brier is a mean of per-record terms, so resamples average these instead of calling scikit-learn.
    brier = [((p - np.eye(p.shape[1])[y]) ** 2).sum(axis=1) for _, p, y in per_subset.values()]
    # Per-record distances to the human distribution (NaN where a record has none).
    distances = {}
    for i, (mine, p, _) in enumerate(per_subset.values()):
        has = np.array(["distribution" in row for row in mine])
        if has.any():
            human = np.array(
                [[row["distribution"][o] for o in row["options"]] for row, h in zip(mine, has) if h]
            )
            js, tv = np.full(len(mine), np.nan), np.full(len(mine), np.nan)
            js[has], tv[has] = js_divergence_bits(p[has], human), total_variation(p[has], human)
            distances[i] = (js, tv)

    def statistic(indices: np.ndarray) -> dict[FigureKey, float | None]:
        drawn = code[indices]
        counts = np.bincount(drawn, minlength=len(names))
        hits = np.bincount(drawn, correct[indices], minlength=len(names))
        values: dict[FigureKey, float | None] = {}
        for i, name in enumerate(names):
            values[("subset", name, "accuracy")] = hits[i] / counts[i]
            local = indices[drawn == i] - offsets[i]
            _, p, y = per_subset[name]
            values[("subset", name, "ece")] = ece(p[local], y[local], SUITE_N_BINS)
            values[("subset", name, "brier")] = float(np.mean(brier[i][local]))
            if types[name] == "score":
                values[("subset", name, "mae")] = level_absolute_error(p[local], y[local])
                values[("subset", name, "spearman")] = level_spearman(p[local], y[local])
            if i in distances:
                for metric, per_record in zip(("js_divergence_bits", "total_variation"), distances[i]):
                    chosen = per_record[local]
                    values[("subset", name, metric)] = (
                        float(np.nanmean(chosen)) if not np.isnan(chosen).all() else None
                    )
        for group in ("all", "noul", "choice", "score"):
            members = [i for i, name in enumerate(names) if group in ("all", types[name])]
            if members:
                values[("group", group, "accuracy")] = hits[members].sum() / counts[members].sum()
                values[("group", group, "macro_accuracy")] = float(np.mean(hits[members] / counts[members]))
        return values

    return statistic
