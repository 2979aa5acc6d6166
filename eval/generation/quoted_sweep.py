"""The study's published v6e-1 model sweep (run ``2026-09-24-v6e1``), quoted beside our own runs.

``eval/data/reference/2026-09-24-v6e1-SWEEP.md`` is the upstream text byte for byte
(xbill9/gemma4-dev ``jev-tpu/results/2026-09-24-v6e1-SWEEP.md`` @ ``c7f96daf``); it was parsed once,
by :func:`parse_sweep`, into ``eval/data/reference/v6e1-sweep.json``, which the commands read (a test
re-derives the JSON from the Markdown, so the two cannot drift). Every row carries its source and
date and is printed labelled "quoted".

What the table measures: the study's *decision reads* (label log-probabilities) on SST-2, AG News,
emotion and irony, per Gemma arm on a TPU v6e-1. It holds no GSM8K, BFCL or throughput figures; the
study's GSM8K/BFCL reads and QAT build tables (a later v5e run) are quoted by :mod:`eval.generation.quoted_study`.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

SOURCE = (
    "xbill9/gemma4-dev jev-tpu/results/2026-09-24-v6e1-SWEEP.md @ c7f96dafacd803ee4128d955aab83de529795be4"
)
DATE = "2026-09-24"
MARKDOWN = "2026-09-24-v6e1-SWEEP.md"
JSON = "v6e1-sweep.json"
_ACCURACY = re.compile(r"(?P<value>[\d.]+)% \((?P<lo>[\d.]+)%–(?P<hi>[\d.]+)%\)")


def parse_sweep(markdown: str) -> list[dict[str, Any]]:
    """Each table row as ``{"columns": {header: cell text}, "arm", "task", "n", "accuracy",
    "accuracy_range", "source", "date"}`` (accuracy as a fraction)."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        cells = dict(zip(header, (cell.strip() for cell in line.strip("|").split("|"))))
        accuracy = _ACCURACY.fullmatch(cells["Accuracy (95% range)"])
        rows.append({
            "arm": cells["Arm"], "task": cells["Task"], "n": int(cells["n"]),
            "accuracy": round(float(accuracy["value"]) / 100, 6),
            "accuracy_range": [round(float(accuracy[b]) / 100, 6) for b in ("lo", "hi")],
            "columns": cells, "source": SOURCE, "date": DATE,
        })  # fmt: skip
    return rows


def quoted_rows() -> list[dict[str, Any]]:
    return json.loads(resources.files("eval.data.reference").joinpath(JSON).read_text(encoding="utf-8"))


def quoted_table(rows: list[dict[str, Any]] | None = None) -> str:
    rows = quoted_rows() if rows is None else rows
    lines = [
        "Quoted, not measured here: the study's v6e-1 sweep of decision reads (label log-probabilities), "
        f"{DATE}, {SOURCE}.",
        "",
        "| arm (quoted) | task | n | accuracy (95% range) | median ms | source, date |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lo, hi = row["accuracy_range"]
        lines.append(
            f"| {row['arm']} (quoted) | {row['task']} | {row['n']} | {row['accuracy']:.1%} ({lo:.1%}–{hi:.1%}) | "
            f"{row['columns']['Median ms']} | study {row['date']} |"
        )
    return "\n".join(lines) + "\n"
