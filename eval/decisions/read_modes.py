"""What a read mode costs against exact reads of the same model, from agreement evidence only.

Reads the record rows and ``manifest.json`` of ``decide eval agree`` runs (a = the reference, exact
reads; b = the read mode under test) and tabulates per task: same-label counts, reads
with every label returned, ECE (15 bins) of each and their difference, and median latency.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np

from calibration.metrics import N_BINS, accuracy_score, ece
from eval.decisions.agree import agreement_reads
from eval.decisions.tasks import TASKS
from eval.evidence.manifest import MANIFEST, write_json
from eval.evidence.rows import load_rows, rows_arrays


def mode_rows(run: Path) -> list[dict]:
    """One row per task for one agreement run directory."""
    manifest = json.loads((run / MANIFEST).read_text())
    reads = agreement_reads(run)
    a, b = load_rows(reads["a"], timings=True), load_rows(reads["b"], timings=True)  # median latency
    b_by_key = {(read["task"], read["id"], read["variant"]): read for read in b}
    rows = []
    for task in TASKS:
        a_task = [read for read in a if read["task"] == task]
        if not a_task:
            continue
        b_task = [b_by_key[(read["task"], read["id"], read["variant"])] for read in a_task]
        pa, y = rows_arrays(a_task)
        pb, _ = rows_arrays(b_task)
        ece_a, ece_b = ece(pa, y, N_BINS), ece(pb, y, N_BINS)
        rows.append(
            {
                "task": task,
                "read_mode": manifest["engines"]["b"]["read_mode"],
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


def write_read_modes(runs: list[Path], out: Path | None = None) -> list[dict]:
    """The rows of every agreement run, also written to ``out`` as JSON when given."""
    rows = [row for run in runs for row in mode_rows(run)]
    if out is not None:
        write_json(out, rows)
    return rows
