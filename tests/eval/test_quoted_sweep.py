"""The quoted v6e-1 sweep: the committed JSON is what the shipped upstream Markdown parses to."""

from __future__ import annotations

import hashlib
from pathlib import Path

from eval.generation.quoted_sweep import parse_sweep, quoted_rows, quoted_table

REFERENCE = Path(__file__).resolve().parents[2] / "eval" / "data" / "reference"


def test_the_markdown_is_the_upstream_file():
    # The sha256 shared/data/SHA256SUMS records for reference/2026-09-24-v6e1-SWEEP.md.
    digest = hashlib.sha256((REFERENCE / "2026-09-24-v6e1-SWEEP.md").read_bytes()).hexdigest()
    assert digest == "4f03f1bc51bc85ade5eded6f03e1d353d8a868d9c1a5486604fbc1dae744e4d9"


def test_the_committed_json_rederives_from_the_markdown():
    assert quoted_rows() == parse_sweep((REFERENCE / "2026-09-24-v6e1-SWEEP.md").read_text(encoding="utf-8"))


def test_rows_carry_source_and_date_and_print_as_quoted():
    rows = quoted_rows()
    assert len(rows) == 16 and all(
        row["date"] == "2026-09-24" and "c7f96daf" in row["source"] for row in rows
    )
    e4b_sst2 = next(row for row in rows if (row["arm"], row["task"]) == ("e4b", "sst2"))
    assert e4b_sst2["accuracy"] == 0.94 and e4b_sst2["accuracy_range"] == [0.91, 0.967]
    table = quoted_table(rows)
    assert table.startswith("Quoted, not measured here")
    assert "| e4b (quoted) | sst2 | 300 | 94.0% (91.0%–96.7%) | 12 | study 2026-09-24 |" in table
