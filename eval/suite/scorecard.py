"""The suite's scorecard metrics as pure functions, the family-clustered bootstrap, and the published checksums.

Conventions, stated once (they follow Bespoke Labs' ``docs/PUBLIC_BENCHMARKS.md`` for the public suite):

- **Pooled** accuracy is over records (the publishers' "micro"); **macro** accuracy is the unweighted
  mean of subset accuracies.
- Score subsets: the **expected level** is Σ_k k·p_k over levels counted from 0; **MAE** is the mean
  |expected level − gold level|; **Spearman** is the rank correlation of expected level with gold level
  (average ranks for ties; undefined, ``None``, when either side is constant).
- Distribution subsets (``reference.distribution``): per record, **Jensen–Shannon divergence** in bits
  (base-2 logs, so 0 to 1) and **total variation** ½·Σ|p − q| between the model's and the human
  distribution, each averaged over records.
- **Family-clustered bootstrap**: records that share a family (a passage, an article) are not independent,
  so a resample draws whole families with replacement, within each subset (each subset keeps its family
  count, so macro averages stay defined); 95% intervals are the 2.5th and 97.5th percentiles.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from importlib import resources

import numpy as np

from calibration.metrics import level_spearman_score

VERIFIED, MISMATCH, UNKNOWN = "verified", "mismatch", "unknown"


def level_spearman(probabilities, gold_levels) -> float | None:
    """``calibration.metrics.level_spearman_score``, None (JSON null) where it is undefined."""
    value = level_spearman_score(probabilities, gold_levels)
    return None if np.isnan(value) else value


def js_divergence_bits(p, q) -> np.ndarray:
    """Jensen–Shannon divergence per row, in bits (0 for equal rows, 1 for disjoint ones).

    >>> js_divergence_bits([[1.0, 0.0], [0.5, 0.5]], [[0.0, 1.0], [0.5, 0.5]]).tolist()
    [1.0, 0.0]
    """
    from scipy.spatial.distance import jensenshannon

    # scipy returns the JS *distance* (the square root of the divergence).
    return jensenshannon(np.asarray(p, dtype=float), np.asarray(q, dtype=float), base=2, axis=1) ** 2


def total_variation(p, q) -> np.ndarray:
    """½·Σ|p − q| per row.

    >>> total_variation([[0.9, 0.1]], [[0.6, 0.4]]).round(6).tolist()
    [0.3]
    """
    return 0.5 * np.abs(np.asarray(p, dtype=float) - np.asarray(q, dtype=float)).sum(axis=1)


def families_complete(correct: Sequence[bool], families: Sequence[str]) -> tuple[int, int]:
    """(families whose every record is right, families).

    >>> families_complete([True, True, False, True], ["a", "a", "b", "c"])
    (2, 3)
    """
    wrong = {family for family, ok in zip(families, correct, strict=True) if not ok}
    every = set(families)
    return len(every - wrong), len(every)


def family_bootstrap(
    strata: Sequence[str], families: Sequence[str], statistic: Callable[[np.ndarray], dict[str, float | None]], *,
    resamples: int, seed: int,
) -> dict[str, tuple[float, float] | None]:  # fmt: skip
    """95% percentile intervals of every value ``statistic`` returns, over ``resamples`` family-clustered
    resamples of the records.

    ``strata`` (the subset) and ``families`` name each record's stratum and family; a resample draws, in
    every stratum, as many families as it has, with replacement, and passes ``statistic`` the record
    indices drawn (a record repeats as often as its family was drawn). A value that is ``None`` in every
    resample gets ``None``; resamples where it is ``None`` are left out of its interval.
    """
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, not {resamples}")
    keys = list(zip(strata, families, strict=True))
    codes = {key: code for code, key in enumerate(dict.fromkeys(keys))}
    record_family = np.array([codes[key] for key in keys])
    by_stratum: dict[str, list[int]] = {}
    for (stratum, _), code in codes.items():
        by_stratum.setdefault(stratum, []).append(code)
    stratum_families = [np.array(members) for members in by_stratum.values()]
    rng = np.random.default_rng(seed)
    drawn: dict[str, list[float]] = {}
    for _ in range(resamples):
        weight = np.zeros(len(codes), dtype=int)
        for members in stratum_families:
            np.add.at(weight, members[rng.integers(0, len(members), len(members))], 1)
        indices = np.repeat(np.arange(len(keys)), weight[record_family])
        for name, value in statistic(indices).items():
            drawn.setdefault(name, [])
            if value is not None:
                drawn[name].append(value)
    return {
        name: (float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))) if values else None
        for name, values in drawn.items()
    }


def published_checksums() -> dict[str, str]:
    """Subset → the ``dataset_sha256`` its publishers give (``eval/data/reference/suite_checksums.json``)."""
    table = json.loads(resources.files("eval.data.reference").joinpath("suite_checksums.json").read_text())
    return table["dataset_sha256"]


def checksum_status(digest: str, *, published: str | None, manifest: str | None) -> str:
    """``verified`` when the bytes match the published sha256 (and the manifest, if it gives one),
    ``mismatch`` when they differ from either, ``unknown`` when nothing is published for the subset.

    >>> checksum_status("ab", published=None, manifest="ab"), checksum_status("ab", published="ab", manifest="cd")
    ('unknown', 'mismatch')
    """
    if digest != (manifest or digest) or digest != (published or digest):
        return MISMATCH
    return VERIFIED if published is not None else UNKNOWN
