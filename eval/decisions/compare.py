"""``decide eval compare RUN_A RUN_B``: two runs over the same records, paired.

Per task: same-label count, accuracy difference (B − A) with a paired bootstrap 95% interval
(10,000 resamples of records, fixed seed) and the exact McNemar test on discordant records. Runs over
different data (sha256) or served from different images (engine or service image; manifests
before ``images`` recorded one ``image_digest``, read as the engine image) are refused unless explicitly allowed, and
then the report says so in its first line.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy.stats import binomtest

from eval.evidence.manifest import MANIFEST, images_of
from eval.evidence.rows import RECORDS, load_rows

RESAMPLES = 10_000
SEED = 20260924


class ComparisonRefused(ValueError):
    pass


def paired_bootstrap(
    correct_a: np.ndarray, correct_b: np.ndarray, *, resamples: int = RESAMPLES, seed: int = SEED
) -> tuple[float, float, float]:
    """Accuracy difference B − A and its percentile 95% interval over paired resamples of records."""
    a = np.asarray(correct_a, dtype=float)
    b = np.asarray(correct_b, dtype=float)
    if a.shape != b.shape or a.size == 0:
        raise ValueError("paired outcomes must be non-empty and of equal length")
    rng = np.random.default_rng(seed)
    index = rng.integers(0, len(a), size=(resamples, len(a)))
    differences = b[index].mean(axis=1) - a[index].mean(axis=1)
    lo, hi = np.percentile(differences, [2.5, 97.5])
    return float(b.mean() - a.mean()), float(lo), float(hi)


def mcnemar_exact(correct_a: np.ndarray, correct_b: np.ndarray) -> dict:
    """Exact (binomial) McNemar test on the discordant pairs."""
    a = np.asarray(correct_a, dtype=bool)
    b = np.asarray(correct_b, dtype=bool)
    only_a = int(np.sum(a & ~b))
    only_b = int(np.sum(~a & b))
    discordant = only_a + only_b
    p = binomtest(only_a, discordant, 0.5).pvalue if discordant else 1.0
    return {"only_a_right": only_a, "only_b_right": only_b, "p_value": float(p)}


def compare_runs(run_a: Path, run_b: Path, *, allow_different_image: bool = False) -> dict:
    manifest_a = json.loads((run_a / MANIFEST).read_text())
    manifest_b = json.loads((run_b / MANIFEST).read_text())
    warnings = []
    if manifest_a["data_sha256"] != manifest_b["data_sha256"]:
        message = "the runs read different data (sha256 differs)"
        if not allow_different_image:
            raise ComparisonRefused(message + "; pass --allow-different-image to compare anyway")
        warnings.append(message)
    images_a, images_b = images_of(manifest_a), images_of(manifest_b)
    for role in ("engine", "service"):
        a, b = getattr(images_a, role), getattr(images_b, role)
        if a != b:
            message = f"the runs were served from different {role} images ({a} vs {b})"
            if not allow_different_image:
                raise ComparisonRefused(message + "; pass --allow-different-image to compare anyway")
            warnings.append(message)
    rows_a = {
        (r["task"], r["id"]): r
        for r in load_rows(run_a / RECORDS)
        if r["status"] == "ok" and r["variant"] == "original"
    }
    rows_b = {
        (r["task"], r["id"]): r
        for r in load_rows(run_b / RECORDS)
        if r["status"] == "ok" and r["variant"] == "original"
    }
    only_a, only_b = len(rows_a.keys() - rows_b.keys()), len(rows_b.keys() - rows_a.keys())
    if only_a or only_b:
        # The runs must answer the same records: a paired comparison over a subset would be biased.
        raise ComparisonRefused(f"the runs read different records ({only_a} only in A, {only_b} only in B)")
    mismatched = [key for key in rows_a if rows_a[key]["gold"] != rows_b[key]["gold"]]
    if mismatched:
        raise ComparisonRefused(
            f"the runs disagree on gold answers for {len(mismatched)} records, e.g. {mismatched[0]}"
        )
    tasks = {}
    for task in sorted({row["task"] for row in rows_a.values()}):
        keys = sorted(key for key, row in rows_a.items() if row["task"] == task)
        if not keys:
            continue
        a = np.array([rows_a[k]["predicted"] == rows_a[k]["gold"] for k in keys])
        b = np.array([rows_b[k]["predicted"] == rows_b[k]["gold"] for k in keys])
        difference, lo, hi = paired_bootstrap(a, b)
        tasks[task] = {
            "n": len(keys),
            "same_label": int(sum(rows_a[k]["predicted"] == rows_b[k]["predicted"] for k in keys)),
            "accuracy_a": float(a.mean()),
            "accuracy_b": float(b.mean()),
            "difference": difference,
            "difference_ci95": [lo, hi],
            "mcnemar": mcnemar_exact(a, b),
        }
    return {
        "a": str(run_a),
        "b": str(run_b),
        "warnings": warnings,
        "resamples": RESAMPLES,
        "seed": SEED,
        "tasks": tasks,
    }


def compare_table(report: dict) -> str:
    lines = [f"WARNING: {w}." for w in report["warnings"]]
    lines += [
        f"A = {report['a']}, B = {report['b']}; paired bootstrap ({report['resamples']:,} resamples, seed {report['seed']}), exact McNemar.",
        "",
        "| task | same label | accuracy A | accuracy B | B − A (95% CI) | discordant A only / B only | McNemar p |",
        "|---|---|---|---|---|---|---|",
    ]
    for task, t in report["tasks"].items():
        lo, hi = t["difference_ci95"]
        m = t["mcnemar"]
        lines.append(
            f"| {task} | {t['same_label']:,} of {t['n']:,} | {t['accuracy_a']:.1%} | {t['accuracy_b']:.1%} | "
            f"{t['difference'] * 100:+.1f} pts ({lo * 100:+.1f} to {hi * 100:+.1f}) | {m['only_a_right']} / {m['only_b_right']} | {m['p_value']:.3g} |"
        )
    return "\n".join(lines) + "\n"
