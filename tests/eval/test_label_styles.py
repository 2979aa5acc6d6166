"""``decide eval label-styles`` on the embedded model: one run per style set, rows from its records."""

from __future__ import annotations

import json

import pytest

from eval.evidence import RECORDS, load_rows
from eval.label_styles import label_styles_table, run_label_styles

pytestmark = pytest.mark.anyio


async def test_style_sets_run_and_tabulate(local_engine, tmp_path):
    rows = await run_label_styles(local_engine, tmp_path, style_sets=["words", "trie"], tasks=["ag_news"], limit=3)
    by_set = {row["style_set"]: row for row in rows}
    # "Sci/Tech" is not one token: the words set falls back to codes, the trie set reads the names
    assert by_set["words"]["label_styles_used"] == {"codes": 6}
    assert by_set["trie"]["label_styles_used"] == {"trie": 6}
    for name, row in by_set.items():
        records = load_rows(tmp_path / name / RECORDS)
        original = {r["id"]: r for r in records if r["variant"] == "original"}
        reversed_ = {r["id"]: r for r in records if r["variant"] == "reversed"}
        assert row["original"]["n"] == 3 and row["paired"] == 3
        assert row["original"]["correct"] == sum(r["predicted"] == r["gold"] for r in original.values())
        assert row["reversed_changes"] == sum(original[i]["predicted"] != reversed_[i]["predicted"] for i in original)
        assert json.loads((tmp_path / name / "manifest.json").read_text())["args"]["label_styles"][:2] == list({"words": ("words", "codes"), "trie": ("words", "trie")}[name])
    assert json.loads((tmp_path / "label-styles.json").read_text()) == json.loads(json.dumps(rows))
    table = label_styles_table(rows)
    assert "| trie | decide-prompt/3 | ag_news | 3 |" in table and "of 3" in table


async def test_unknown_style_set_is_named(local_engine, tmp_path):
    with pytest.raises(ValueError, match="letters"):
        await run_label_styles(local_engine, tmp_path, style_sets=["letters"])
