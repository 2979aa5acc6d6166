"""`decide eval debias` on the embedded engine: a tiny real run, its counts and its table."""

from __future__ import annotations

import json

import pytest

from eval.decisions.debias import question_options, run_debias
from eval.evidence.rows import load_rows

pytestmark = pytest.mark.anyio


@pytest.mark.slow  # two tasks read under two settings, every rotation
async def test_a_tiny_run_counts_reads_and_engine_calls(local_engine, tmp_path):
    report = await run_debias(
        local_engine, tmp_path, tasks=["sst2", "ag_news"], limit=2, settings=["none", "all"]
    )
    none, rotated = report["settings"]["none"]["tasks"], report["settings"]["all"]["tasks"]
    assert none["ag_news"]["reads_per_question"] == 1 and rotated["ag_news"]["reads_per_question"] == 4
    assert rotated["sst2"]["reads_per_question"] == 2
    assert (
        rotated["ag_news"]["engine_calls_per_question"] == none["ag_news"]["engine_calls_per_question"] == 1
    )
    assert rotated["ag_news"]["rotations"] == 4 and 0.25 <= rotated["ag_news"]["rotation_agreement_mean"] <= 1
    assert rotated["sst2"]["reversed_pairs"] == 2 and rotated["sst2"]["n"] == 2
    # Two options: the reversed order is one of the rotations, so the rotated answer cannot change.
    assert rotated["sst2"]["reversed_changes"] == 0
    rows = load_rows(tmp_path / "all")
    assert {row["reading"]["rotations"] for row in rows if row["task"] == "ag_news"} == {4}
    assert json.loads((tmp_path / "debias.json").read_text()) == json.loads(json.dumps(report))
    assert "| all | ag_news | 4 | 2 |" in (tmp_path / "debias.md").read_text()
    again = await run_debias(
        local_engine, tmp_path, tasks=["sst2", "ag_news"], limit=2, settings=["none", "all"]
    )
    assert (
        again["settings"]["all"]["tasks"]["ag_news"]["reads_per_question"] == 4
    )  # resumed: earlier counts kept


def test_settings_are_checked():
    assert question_options("reverse", 4) == {"x_debias": "rotate_reverse"}
    assert question_options("none", 4) == {} and question_options("3", 2) == {
        "x_debias": "rotate",
        "x_rotations": 2,
    }
    with pytest.raises(ValueError, match="none, all, reverse or an integer"):
        question_options("1", 4)
