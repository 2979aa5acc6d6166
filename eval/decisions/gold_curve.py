"""How many gold answers a calibration needs: ECE after N decisions with known gold answers, per task.

The protocol (the reference study's): for each of ``splits`` random splits of a task's records into
two halves, fit a temperature on N records with their gold answers drawn from the first half (N = 0
means T = 1) and score ECE (15 bins) on the whole second half. Report the mean and standard deviation
over splits, and a reliability diagram per task (held-out half of split 0: raw, and after 50).

Reads come from record rows (``eval.evidence.rows``, e.g. ``a.jsonl.gz`` of ``decide eval agree``), so
every figure regenerates offline.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from calibration.metrics import N_BINS, ece, reliability_bins
from calibration.temperature import TemperatureScaler, apply_temperature, as_logits
from eval.decisions.tasks import TASKS
from eval.evidence.rows import load_rows, rows_arrays

GOLD_COUNTS = (0, 25, 50, 100, 150)
SPLITS = 20


def task_arrays(rows: Sequence[dict], task: str) -> tuple[np.ndarray, np.ndarray]:
    """Label logits (log raw probabilities, the task's option order) and gold indices of the task's
    successful original-order rows (``load_rows`` order: by id)."""
    mine = [
        row for row in rows if row["task"] == task and row["variant"] == "original" and row["status"] == "ok"
    ]
    if not mine:
        return np.zeros((0, len(TASKS[task].options))), np.zeros(0, dtype=int)
    p, gold = rows_arrays(mine)
    return as_logits(p), gold


def split(length: int, seed: int, index: int) -> tuple[np.ndarray, np.ndarray]:
    """Split ``index`` of the seeded sequence: (pool to draw gold answers from, held-out half)."""
    order = np.random.default_rng([seed, index]).permutation(length)
    return order[: length // 2], order[length // 2 :]


def draw(pool: np.ndarray, n: int, seed: int, index: int) -> np.ndarray:
    """The N records with gold answers of split ``index``: seeded by the split and N alone, so asking
    for other N values (or fewer) never changes which records a given N uses."""
    return np.random.default_rng([seed, index, n]).choice(pool, size=n, replace=False) if n else pool[:0]


def gold_curve(
    logits: np.ndarray,
    gold: np.ndarray,
    *,
    counts=GOLD_COUNTS,
    splits: int = SPLITS,
    seed: int = 0,
    n_bins: int = N_BINS,
) -> dict:
    """ECE on the held-out half after fitting on N gold answers, for each N, over ``splits`` splits.

    Rows must come in a fixed order (the scorers sort by id): the splits index into them.
    """
    half = len(gold) // 2
    results: dict[int, list[float]] = {n: [] for n in counts if n <= half}
    temperatures: dict[int, list[float]] = {n: [] for n in results}
    for index in range(splits):
        pool, held_out = split(len(gold), seed, index)
        for n in results:
            fit = draw(pool, n, seed, index)
            t = TemperatureScaler().fit(logits[fit], gold[fit]).temperature_ if n else 1.0
            temperatures[n].append(t)
            results[n].append(ece(apply_temperature(logits[held_out], t), gold[held_out], n_bins))
    return {
        "n_bins": n_bins,
        "splits": splits,
        "held_out": len(gold) - half,
        "points": [
            {
                "n_gold": n,
                "ece_mean": float(np.mean(values)),
                "ece_std": float(np.std(values)),
                "ece_split0": values[0],
                "temperature_median": float(np.median(temperatures[n])),
                "temperature_split0": temperatures[n][0],
            }
            for n, values in results.items()
        ],
    }


def run_gold_curve(
    records: Path, out: Path, *, tasks: Sequence[str] = tuple(TASKS), splits: int = SPLITS, seed: int = 0
) -> dict:
    """Curves, reliability diagrams and figures for every task present in ``records`` (a record file
    or run directory): gold-curve.{json,md,png} and reliability-<task>.png in ``out``."""
    from eval.evidence.figures import plot_gold_curves, plot_reliability

    rows = load_rows(records)
    report = {"source": str(records), "seed": seed, "tasks": {}}
    out.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        logits, gold = task_arrays(rows, task)
        if len(gold) < 2 * max(GOLD_COUNTS[1:3]):
            continue
        curve = gold_curve(logits, gold, splits=splits, seed=seed)
        _, held_out = split(len(gold), seed, 0)
        t50 = next(p for p in curve["points"] if p["n_gold"] == 50)["temperature_split0"]
        diagrams = {
            "raw": reliability_bins(apply_temperature(logits[held_out], 1.0), gold[held_out]),
            "after_50": reliability_bins(apply_temperature(logits[held_out], t50), gold[held_out]),
            "temperature_50": t50,
        }
        report["tasks"][task] = {"n": len(gold), "curve": curve, "reliability": diagrams}
        plot_reliability(
            diagrams,
            out / f"reliability-{task}.png",
            title=f"{task}: held-out half, raw vs T fitted on 50 gold answers",
        )
    plot_gold_curves(report, out / "gold-curve.png")
    (out / "gold-curve.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "gold-curve.md").write_text(gold_curve_table(report))
    return report


def gold_curve_table(report: dict) -> str:
    counts = sorted({p["n_gold"] for t in report["tasks"].values() for p in t["curve"]["points"]})
    splits = next(iter(report["tasks"].values()))["curve"]["splits"] if report["tasks"] else SPLITS
    lines = [
        f"ECE ({N_BINS} bins) on the held-out half after fitting T on N gold answers; mean ± sd over {splits} splits.",
        "",
        "| task | n | " + " | ".join(f"N = {n}" for n in counts) + " | median T at 50 |",
        "|---|---|" + "---|" * len(counts) + "---|",
    ]
    for task, entry in report["tasks"].items():
        points = {p["n_gold"]: p for p in entry["curve"]["points"]}
        cells = [
            f"{points[n]['ece_mean']:.3f} ± {points[n]['ece_std']:.3f}" if n in points else "—"
            for n in counts
        ]
        t50 = points.get(50, {}).get("temperature_median")
        lines.append(
            f"| {task} | {entry['n']} | "
            + " | ".join(cells)
            + (f" | {t50:.2f} |" if t50 is not None else " | — |")
        )
    return "\n".join(lines) + "\n"
