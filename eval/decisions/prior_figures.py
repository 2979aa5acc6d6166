"""``decide eval prior-figures``: the figures docs/prompts-and-labels.md quotes about the prior-correction default,
from a run's record rows only.

From the original-order rows of a run read with the default (choice questions prior-corrected):
AG News's median label mass, how often Sci/Tech is the least probable option in the model's own
read, each task's majority rate and answer counts, how often emotion's answers say ``love`` against
its records; then the largest difference between the run's raw reads and those of ``before`` (the
same reads answered raw, every row and both orders), which shows the correction changed answers,
not reads. Lines for a task the run does not hold are left out.
"""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

from eval.decisions.tasks import TASKS
from eval.evidence.rows import RecordRow, load_rows, raw_probabilities, row_key


def prior_figures(run: Path, before: Path) -> list[str]:
    """The figures as printed lines (``run`` and ``before``: run directories or record files)."""
    rows = load_rows(run)
    original = [row for row in rows if row["variant"] == "original" and row["status"] == "ok"]
    by_task: dict[str, list[RecordRow]] = {task: [] for task in TASKS}  # in the shipped tasks' order
    for row in original:
        by_task.setdefault(row["task"], []).append(row)
    by_task = {task: records for task, records in by_task.items() if records}
    lines = []
    if ag_news := by_task.get("ag_news"):
        mass = statistics.median(row["reading"]["label_mass"] for row in ag_news)
        lines.append(f"ag_news label mass, median over {len(ag_news)} records: {mass:.4f}")
        least = [
            row for row in ag_news if min(raw := raw_probabilities(row), key=raw.__getitem__) == "Sci/Tech"
        ]
        lines.append(
            f"ag_news raw read: Sci/Tech least probable on {len(least)} of {len(ag_news)} records "
            f"({sum(row['gold'] == 'Sci/Tech' for row in least)} of "
            f"{sum(row['gold'] == 'Sci/Tech' for row in ag_news)} Sci/Tech records)"
        )
    for task, records in by_task.items():
        majority, count = Counter(row["gold"] for row in records).most_common(1)[0]
        answers = dict(Counter(row["predicted"] for row in records).most_common())
        lines.append(
            f"{task}: majority {majority} {count}/{len(records)} = {count / len(records):.1%}; answers {answers}"
        )
    if emotion := by_task.get("emotion"):
        love = [row for row in emotion if row["predicted"] == "love"]
        lines.append(
            f"emotion: love answered {len(love)} times, {sum(row['gold'] == 'love' for row in love)} right; "
            f"{sum(row['gold'] == 'love' for row in emotion)} love records"
        )
    earlier = {row_key(row): row for row in load_rows(before)}
    difference = max(
        abs(p - earlier[row_key(row)]["probabilities"][option])
        for row in rows
        for option, p in raw_probabilities(row).items()
    )
    lines.append(
        f"largest raw-read difference from {before} (all {len(rows)} rows, both orders): {difference:.1e}"
    )
    return lines
