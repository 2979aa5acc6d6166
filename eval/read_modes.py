"""What a read mode costs against exact reads of the same model, from agreement evidence only.

Reads ``a.jsonl``/``b.jsonl`` and ``manifest.json`` written by ``decide eval agree`` (a = the
reference, exact reads; b = the mode under test) and tabulates per task: same-label counts, reads
with every label returned, ECE (15 bins) of each and their difference, and median latency.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np

from calibration.metrics import N_BINS, accuracy_score, ece
from eval.tasks import TASKS


def load_reads(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def as_arrays(reads: list[dict], task: str) -> tuple[np.ndarray, np.ndarray]:
    options = list(TASKS[task].options)
    probabilities = np.array([[read["probabilities"][option] for option in options] for read in reads])
    labels = np.array([options.index(read["gold"]) for read in reads])
    return probabilities, labels


def mode_rows(run: Path) -> list[dict]:
    """One row per task for one agreement run directory."""
    manifest = json.loads((run / "manifest.json").read_text())
    a, b = load_reads(run / "a.jsonl"), load_reads(run / "b.jsonl")
    b_by_key = {(read["id"], read["variant"]): read for read in b}
    rows = []
    for task in TASKS:
        a_task = [read for read in a if read["task"] == task]
        if not a_task:
            continue
        b_task = [b_by_key[(read["id"], read["variant"])] for read in a_task]
        pa, y = as_arrays(a_task, task)
        pb, _ = as_arrays(b_task, task)
        ece_a, ece_b = ece(pa, y, N_BINS), ece(pb, y, N_BINS)
        rows.append(
            {
                "task": task,
                "mode": manifest["engines"]["b"]["read_mode"],
                "engine": f"{manifest['engines']['b']['kind']}:{manifest['engines']['b']['read_mode']} (k={manifest['engines']['b']['top_k']})",
                "n": len(a_task),
                "same_label": int(sum(ra["predicted"] == rb["predicted"] for ra, rb in zip(a_task, b_task))),
                "all_labels_returned": int(sum(read["reading"]["exact"] for read in b_task)),
                "accuracy_exact": accuracy_score(pa, y),
                "accuracy_mode": accuracy_score(pb, y),
                "ece_exact": ece_a,
                "ece_mode": ece_b,
                "ece_difference": ece_b - ece_a,
                "max_abs_dp": float(np.max(np.abs(pa - pb))),
                "median_latency_ms_exact": statistics.median(read["latency_ms"] for read in a_task),
                "median_latency_ms_mode": statistics.median(read["latency_ms"] for read in b_task),
            }
        )
    return rows


def read_modes_table(rows: list[dict]) -> str:
    lines = [
        f"| task | b engine | n | same label as exact | all labels returned | ECE exact / b ({N_BINS} bins) | ECE b − exact | max abs dp |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['task']} | {row['engine']} | {row['n']} | {row['same_label']} of {row['n']} | "
            f"{row['all_labels_returned']} of {row['n']} | {row['ece_exact']:.3f} / {row['ece_mode']:.3f} | "
            f"{row['ece_difference']:+.4f} | {row['max_abs_dp']:.1e} |"
        )
    return "\n".join(lines) + "\n"
