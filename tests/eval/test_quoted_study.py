"""The study's quoted GSM8K/BFCL and QAT tables: every number re-derives from the published cells,
agrees with the table's own arithmetic, carries its source and date, and prints labelled quoted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eval.generation.quoted_study import (
    DOCS,
    docs_section,
    generation_rows,
    generation_table,
    parse_generation,
    parse_quantization,
    quantization_rows,
    quantization_table,
)
from tests.eval.support import stored_run

ROOT = Path(__file__).resolve().parents[2]
COMMIT = re.compile(r"[0-9a-f]{40}")
DATE = re.compile(r"2026-\d\d-\d\d")


def test_every_number_rederives_from_the_published_cells():
    for row in generation_rows():
        assert parse_generation(row["columns"]).items() <= row.items(), row["columns"]
    for row in quantization_rows():
        assert parse_quantization(row["table"], row["columns"]).items() <= row.items(), row["columns"]


def test_every_row_names_its_source_file_commit_and_date():
    rows = generation_rows() + quantization_rows()
    assert len(generation_rows()) == 37 and len(quantization_rows()) == 26
    for row in rows:
        source = row["source"]
        assert source["repository"] == "xbill9/gemma4-dev" and COMMIT.fullmatch(source["commit"])
        assert (
            source["url"] == f"https://github.com/xbill9/gemma4-dev/blob/{source['commit']}/{source['path']}"
        )
        assert DATE.fullmatch(row["date"])
    # The evidence files' names carry their run date; the rows say the same.
    for row in generation_rows():
        assert Path(row["source"]["path"]).name.startswith(row["date"])


def test_each_published_difference_is_what_its_discordant_counts_give():
    # A paired difference is exactly (test only − reference only) / n; the table rounds it to 3 places.
    for row in generation_rows():
        exact = (row["test_only"] - row["reference_only"]) / row["n"]
        assert abs(row["difference"] - exact) <= 0.0005 + 1e-9, row["columns"]
        # The two accuracies are rounded separately, so their difference may be off by one more step.
        assert abs(row["test_accuracy"] - row["reference_accuracy"] - exact) <= 0.0010 + 1e-9, row["columns"]
        lo, hi = row["difference_range"]
        assert lo <= row["difference"] <= hi and row["reference_only"] + row["test_only"] <= row["n"]
        assert row["n"] == {"gsm8k": 1319, "bfcl_simple": 400}[row["task"]]


def test_a_reference_reads_the_same_in_every_row_that_pairs_against_it():
    seen: dict[tuple, float] = {}
    for row in generation_rows():
        key = (row["source"]["path"], row["reference"], row["task"])
        assert seen.setdefault(key, row["reference_accuracy"]) == row["reference_accuracy"], key
    # The 2,048-token E2B bf16 reference and the QAT bf16 arm read against it: one value each.
    assert seen[(generation_rows()[0]["source"]["path"], "E2B bf16", "gsm8k")] == 0.910
    assert seen[(generation_rows()[0]["source"]["path"], "E2B QAT bf16", "gsm8k")] == 0.897


def test_each_suite_difference_matches_its_bf16_reference():
    rows = quantization_rows()
    # E2B's bf16 reference is in the v5e table; E4B's and 12B's were read on v6e, in the W4A16 table.
    bf16 = {
        r["size"]: r["suite_accuracy"] for r in rows if r["table"] == "v5e-builds" and r["build"] == "bf16"
    }
    for r in rows:  # E2B's v6e bf16 read (0.685) is another chip's: the v5e one stands.
        if r["table"] == "v6e-w4a16" and r["bf16_accuracy"]:
            bf16.setdefault(r["size"], r["bf16_accuracy"])
    assert bf16 == {"E2B": 0.683, "E4B": 0.731, "12B": 0.76}
    for row in rows:
        if row.get("difference_points") is None:  # a reference row, or the speed table
            continue
        reference = row["bf16_accuracy"] if row["table"] == "v6e-w4a16" else bf16[row["size"]]
        rounded = (row["suite_accuracy"] - reference) * 100
        # Paired differences come from unrounded accuracies: within 0.15 points of the rounded ones.
        assert abs(rounded - row["difference_points"]) <= 0.15, row["columns"]
        lo, hi = row["difference_range_points"]
        assert lo <= row["difference_points"] <= hi, row["columns"]
    speeds = [r["output_tokens_per_s"] for r in rows if r["table"] == "v5e-builds"]
    assert len(speeds) == 18 and all(s["1"] < s["4"] < s["16"] for s in speeds)
    # The W4A16 speed table covers the same four exports as its suite table; only 31B has no bf16.
    kernel = {r["size"]: r for r in rows if r["table"] == "v6e-w4a16-speed"}
    suite = {r["size"]: r for r in rows if r["table"] == "v6e-w4a16"}
    assert kernel.keys() == suite.keys() == {"E2B", "E4B", "12B", "31B"}
    assert all((kernel[s]["speed_vs_bf16"] is None) == (suite[s]["bf16_accuracy"] is None) for s in kernel)


def test_a_row_that_is_not_the_published_layout_is_refused():
    with pytest.raises(ValueError, match="not a study comparison row"):
        parse_generation({"comparison": "e2b gsm8k", "95% range": "-0.1 to 0.1", "n": "1"})
    with pytest.raises(ValueError, match="unknown quoted quantization table"):
        parse_quantization("v7-builds", {})


def test_printed_rows_are_labelled_quoted_with_their_source():
    generation, quantization = generation_table(), quantization_table()
    for table, count in ((generation, 37), (quantization, 26)):
        assert table.startswith("Quoted, not measured here")
        data = [line for line in table.splitlines() if line.startswith("| ") and "study 2026-" in line]
        assert len(data) == count and all("(quoted)" in line for line in data)
    assert (
        "| 12B W8A8 rounded (quoted) | bfcl_simple | 2,048 | 400 | 12B W8A8+emb4 (QAT) | 0.955 | 0.882 "
        "| -0.072 (-0.100 to -0.048) | 30 / 1 | study 2026-09-30 |" in generation
    )
    assert (
        "| 12B | w8a8emb4 (quoted) | 0.761 | +0.1 (−0.6 to +0.8) | 57 / 219 / 675 | study 2026-09-29/30 |"
        in (quantization)
    )
    assert "blob/1628f325e163c625ac0cab025f280248612ed7b2/QUANTIZATION.md" in quantization


def test_the_docs_show_the_tables_the_data_give():
    for relative, (name, render) in DOCS.items():
        section = docs_section((ROOT / relative).read_text(encoding="utf-8"), name)
        assert section == "\n" + render() + "\n", (
            f"{relative} is stale: python -m eval.generation.quoted_study --write"
        )


def test_decide_eval_quoted_prints_a_family_or_refuses_an_unknown_one():
    from typer.testing import CliRunner

    from eval.cli import app

    result = CliRunner().invoke(app, ["eval", "quoted", "generation"])
    assert result.exit_code == 0 and result.output == generation_table()
    result = CliRunner().invoke(app, ["eval", "quoted"])
    assert result.exit_code == 0 and result.output.count("Quoted, not measured here") == 5
    result = CliRunner().invoke(app, ["eval", "quoted", "speed"])
    assert result.exit_code == 2 and "family" in result.output and "'speed'" in result.output


def test_the_generation_table_prints_the_quoted_tables_after_our_runs(tmp_path):
    from typer.testing import CliRunner

    from eval.cli import app

    ref = stored_run(tmp_path / "ref", "smollm2", [False] * 20)
    run = stored_run(tmp_path / "run", "gemma3", [True] * 10 + [False] * 10)
    args = ["eval", "generation-table", "--reference", str(ref), "--run", str(run), "--quoted"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    ours, _, quoted = result.output.partition("Quoted, not measured here")
    assert "gemma3" in ours and "(quoted)" not in ours
    assert generation_table() in result.output and "v6e-1 sweep" in quoted
