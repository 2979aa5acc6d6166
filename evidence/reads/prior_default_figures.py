"""Figures docs/reads.md quotes about the prior-correction default, from committed records only.

Reads evidence/reads/prior-default (the shipped default, original order) and the decide-prompt/4 rows
of evidence/reads/layouts-3-4 (the same reads, answered raw before the default) and prints: AG News's
label mass, how often Sci/Tech is the least probable option in the raw read, the answers' predicted
counts per task, emotion's `love` answers against its records, majority rates, and the largest
difference between the two runs' raw reads.

Run: PYTHONPATH=. python evidence/reads/prior_default_figures.py > evidence/reads/prior-default/figures.txt
"""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

from eval.evidence import RECORDS, load_rows, raw_probabilities, row_key

HERE = Path(__file__).parent
DEFAULT = HERE / "prior-default/decide-prompt-4/default" / RECORDS
BEFORE = HERE / "layouts-3-4/decide-prompt-4/default" / RECORDS


def main() -> None:
    rows = load_rows(DEFAULT)
    original = [row for row in rows if row["variant"] == "original" and row["status"] == "ok"]
    by_task = {task: [row for row in original if row["task"] == task] for task in ("sst2", "ag_news", "emotion", "irony")}
    ag_news = by_task["ag_news"]
    print(f"ag_news label mass, median over {len(ag_news)} records: {statistics.median(r['reading']['label_mass'] for r in ag_news):.4f}")
    least = [r for r in ag_news if min(raw := raw_probabilities(r), key=raw.__getitem__) == "Sci/Tech"]
    print(f"ag_news raw read: Sci/Tech least probable on {len(least)} of {len(ag_news)} records "
          f"({sum(r['gold'] == 'Sci/Tech' for r in least)} of {sum(r['gold'] == 'Sci/Tech' for r in ag_news)} Sci/Tech records)")  # fmt: skip
    for task, records in by_task.items():
        gold = Counter(r["gold"] for r in records)
        majority, count = gold.most_common(1)[0]
        print(f"{task}: majority {majority} {count}/{len(records)} = {count / len(records):.1%}; answers {dict(Counter(r['predicted'] for r in records).most_common())}")
    emotion = by_task["emotion"]
    love = [r for r in emotion if r["predicted"] == "love"]
    print(f"emotion: love answered {len(love)} times, {sum(r['gold'] == 'love' for r in love)} right; {sum(r['gold'] == 'love' for r in emotion)} love records")
    before = {row_key(row): row for row in load_rows(BEFORE)}
    difference = max(abs(p - before[row_key(row)]["probabilities"][o]) for row in rows for o, p in raw_probabilities(row).items())
    print(f"largest raw-read difference from layouts-3-4 (all {len(rows)} rows, both orders): {difference:.1e}")


if __name__ == "__main__":
    main()
