"""How many labels a calibration needs: ECE after N labelled decisions, per task.

The protocol (the reference study's): for each of ``splits`` random splits of a task's records into
two halves, fit a temperature on N records drawn from the first half (N = 0 means T = 1) and score
ECE (15 bins) on the whole second half. Report the mean and standard deviation over splits, and a
reliability diagram per task (held-out half of split 0: raw, and after 50 labels).

Reads come from per-record evidence (``RecordRead`` JSON lines, e.g. ``a.jsonl`` of
``decide eval agree``), so every figure regenerates offline.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from calibration.metrics import N_BINS, ece
from calibration.temperature import TemperatureScaler, apply_temperature, as_logits
from eval.tasks import TASKS

LABEL_COUNTS = (0, 25, 50, 100, 150)
SPLITS = 20


def task_arrays(reads: Sequence[dict], task: str) -> tuple[np.ndarray, np.ndarray]:
    """Label logits (log raw probabilities, option order of the task) and gold indices."""
    options = list(TASKS[task].options)
    rows = [read for read in reads if read["task"] == task and read.get("variant", "original") == "original"]
    rows = sorted(rows, key=lambda read: read["id"])  # a fixed order, whatever order the reads were written in
    logits = np.array([as_logits([read["probabilities"][option] for option in options]) for read in rows])
    return logits, np.array([options.index(read["gold"]) for read in rows])


def split(length: int, seed: int, index: int) -> tuple[np.ndarray, np.ndarray]:
    """Split ``index`` of the seeded sequence: (pool to draw labels from, held-out half)."""
    order = np.random.default_rng([seed, index]).permutation(length)
    return order[: length // 2], order[length // 2 :]


def draw(pool: np.ndarray, n: int, seed: int, index: int) -> np.ndarray:
    """The N labelled records of split ``index``: seeded by the split and N alone, so asking for
    other N values (or fewer) never changes which records a given N uses."""
    return np.random.default_rng([seed, index, n]).choice(pool, size=n, replace=False) if n else pool[:0]


def label_curve(
    logits: np.ndarray, labels: np.ndarray, *, counts=LABEL_COUNTS, splits: int = SPLITS, seed: int = 0, n_bins: int = N_BINS
) -> dict:
    """ECE on the held-out half after fitting on N labels, for each N, over ``splits`` splits.

    Rows must come in a fixed order (the scorers sort by id): the splits index into them.
    """
    half = len(labels) // 2
    results: dict[int, list[float]] = {n: [] for n in counts if n <= half}
    temperatures: dict[int, list[float]] = {n: [] for n in results}
    for index in range(splits):
        pool, held_out = split(len(labels), seed, index)
        for n in results:
            fit = draw(pool, n, seed, index)
            t = TemperatureScaler().fit(logits[fit], labels[fit]).temperature_ if n else 1.0
            temperatures[n].append(t)
            results[n].append(ece(apply_temperature(logits[held_out], t), labels[held_out], n_bins))
    return {
        "n_bins": n_bins,
        "splits": splits,
        "held_out": len(labels) - half,
        "points": [
            {
                "labels": n,
                "ece_mean": float(np.mean(values)),
                "ece_std": float(np.std(values)),
                "ece_split0": values[0],
                "temperature_median": float(np.median(temperatures[n])),
                "temperature_split0": temperatures[n][0],
            }
            for n, values in results.items()
        ],
    }


def reliability(probabilities: np.ndarray, labels: np.ndarray, n_bins: int = N_BINS) -> list[dict]:
    """Per non-empty bin of top-label confidence ((lo, hi], first closed): count, confidence, accuracy."""
    confidence = probabilities.max(axis=1)
    correct = probabilities.argmax(axis=1) == labels
    bins = np.clip(np.ceil(confidence * n_bins - 1e-9).astype(int) - 1, 0, n_bins - 1)
    return [
        {"bin": int(b), "lo": b / n_bins, "hi": (b + 1) / n_bins, "count": int(mask.sum()), "confidence": float(confidence[mask].mean()), "accuracy": float(correct[mask].mean())}
        for b in range(n_bins)
        if (mask := bins == b).any()
    ]


def run_label_curve(reads_path: Path, out: Path, *, tasks: Sequence[str] = tuple(TASKS), splits: int = SPLITS, seed: int = 0) -> dict:
    """Curves, reliability diagrams and figures for every task present in ``reads_path``."""
    from eval.figures import plot_label_curves, plot_reliability

    reads = [json.loads(line) for line in reads_path.read_text(encoding="utf-8").splitlines() if line]
    report = {"source": str(reads_path), "seed": seed, "tasks": {}}
    out.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        logits, labels = task_arrays(reads, task)
        if len(labels) < 2 * max(LABEL_COUNTS[1:3]):
            continue
        curve = label_curve(logits, labels, splits=splits, seed=seed)
        _, held_out = split(len(labels), seed, 0)
        t50 = next(p for p in curve["points"] if p["labels"] == 50)["temperature_split0"]
        diagrams = {
            "raw": reliability(apply_temperature(logits[held_out], 1.0), labels[held_out]),
            "after_50": reliability(apply_temperature(logits[held_out], t50), labels[held_out]),
            "temperature_50": t50,
        }
        report["tasks"][task] = {"n": len(labels), "curve": curve, "reliability": diagrams}
        plot_reliability(diagrams, out / f"reliability-{task}.png", title=f"{task}: held-out half, raw vs T fitted on 50 labels")
    plot_label_curves(report, out / "label-curve.png")
    (out / "label-curve.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "label-curve.md").write_text(label_curve_table(report))
    return report


def label_curve_table(report: dict) -> str:
    counts = sorted({p["labels"] for t in report["tasks"].values() for p in t["curve"]["points"]})
    splits = next(iter(report["tasks"].values()))["curve"]["splits"] if report["tasks"] else SPLITS
    lines = [
        f"ECE ({N_BINS} bins) on the held-out half after fitting T on N labels; mean ± sd over {splits} splits.",
        "",
        "| task | n | " + " | ".join(f"N = {n}" for n in counts) + " | median T at 50 |",
        "|---|---|" + "---|" * len(counts) + "---|",
    ]
    for task, entry in report["tasks"].items():
        points = {p["labels"]: p for p in entry["curve"]["points"]}
        cells = [f"{points[n]['ece_mean']:.3f} ± {points[n]['ece_std']:.3f}" if n in points else "—" for n in counts]
        t50 = points.get(50, {}).get("temperature_median")
        lines.append(f"| {task} | {entry['n']} | " + " | ".join(cells) + (f" | {t50:.2f} |" if t50 is not None else " | — |"))
    return "\n".join(lines) + "\n"
