"""Agreement between two reads of the same records: pure on rows, and end to end on the embedded model."""

from __future__ import annotations

import json

import pytest

from eval.decisions.agree import agreement, margin
from eval.decisions.tasks import spread


def read(id_: str, p_pos: float, returned: int = 2, variant: str = "original") -> dict:
    reading = {"labels_total": 2, "labels_returned": returned, "exact": returned == 2}
    probabilities = {"positive": p_pos, "negative": 1 - p_pos}
    return {"id": id_, "task": "sst2", "variant": variant, "gold": "positive", "options": ["negative", "positive"], "status": "ok",
            "probabilities": probabilities, "reading": reading, "latency_ms": 1.0, "predicted": max(probabilities, key=probabilities.get)}  # fmt: skip


def test_counts_same_labels_and_probability_differences():
    a = [read("sst2-1", 0.9), read("sst2-2", 0.45), read("sst2-3", 0.2)]
    b = [read("sst2-3", 0.25), read("sst2-1", 0.8), read("sst2-2", 0.55, returned=1)]
    row = agreement("sst2", a, b)
    assert (row.n, row.same_label) == (3, 2)
    assert row.max_abs_dp == pytest.approx(0.1)
    assert row.median_abs_dp == pytest.approx(0.1)
    (case,) = row.differing
    assert case["id"] == "sst2-2" and case["a_label"] == "negative" and case["b_label"] == "positive"
    assert case["a_margin"] == pytest.approx(0.1) and case["b_missing_labels"] == 1
    assert row.differing_with_missing_labels == 1


def test_refuses_runs_over_different_records():
    with pytest.raises(ValueError):
        agreement("sst2", [read("sst2-1", 0.9)], [read("sst2-2", 0.9)])
    with pytest.raises(ValueError):
        agreement("sst2", [read("sst2-1", 0.9)], [read("sst2-1", 0.9, variant="reversed")])


def test_margin_and_spread():
    assert margin({"a": 0.5, "b": 0.3, "c": 0.2}) == pytest.approx(0.2)
    assert spread(list(range(300)), 3) == [0, 100, 200]
    assert spread([1, 2], None) == [1, 2]


def test_a_failed_read_is_named_not_compared():
    failed = {**read("sst2-2", 0.5), "status": "error"}
    with pytest.raises(ValueError, match="1 reads failed"):
        agreement("sst2", [read("sst2-2", 0.9)], [failed])


@pytest.mark.slow  # two agreement runs, each reading both sides
@pytest.mark.anyio
async def test_agree_writes_evidence_and_a_second_run_reuses_side_a(tmp_path):
    from eval.decisions.agree import agreement_reads, run_agreement
    from eval.decisions.read_modes import mode_rows
    from eval.evidence.manifest import RunRefused
    from eval.evidence.rows import load_rows

    first, second = tmp_path / "top2", tmp_path / "top5"
    options = {"tasks": ["irony"], "limit": 6, "concurrency": 2}
    rows = await run_agreement("local", "local:topk", top_k=2, out=first, **options)
    assert rows[0].n == 6
    manifest = json.loads((first / "manifest.json").read_text())
    assert manifest["run"] == "agree" and manifest["reads"] == {"a": "a.jsonl.gz", "b": "b.jsonl.gz"}
    assert manifest["images"] == {"engine": None, "service": None}
    a_rows = load_rows(first / "a.jsonl.gz")
    assert len(a_rows) == 6 and all(
        row["status"] == "ok" and row["options"] == ["true", "false"] for row in a_rows
    )

    with pytest.raises(RunRefused, match="limit"):
        await run_agreement(
            "local", "local:topk", top_k=2, out=second, reuse_a=first, **{**options, "limit": 5}
        )
    again = await run_agreement("local", "local:topk", top_k=2, out=second, reuse_a=first, **options)
    assert not (second / "a.jsonl.gz").exists()
    assert agreement_reads(second)["a"] == (first / "a.jsonl.gz").resolve()
    assert json.loads((second / "manifest.json").read_text())["engines"]["a"] == manifest["engines"]["a"]
    assert again[0].n == rows[0].n and len(load_rows(second / "b.jsonl.gz")) == 6
    assert mode_rows(second)[0]["n"] == 6 and mode_rows(second)[0]["read_mode"] == "topk"


@pytest.mark.anyio
async def test_reuse_a_without_out_is_refused_by_name_before_any_engine_opens(tmp_path):
    from eval.decisions.agree import run_agreement

    # An engine spec that cannot open: had anything been opened or read first, that error would win.
    with pytest.raises(ValueError, match="^--reuse-a needs --out"):
        await run_agreement("nothing", "local", tasks=["irony"], reuse_a=tmp_path)


def test_decide_eval_agree_turns_refusals_into_usage_errors(tmp_path):
    from typer.testing import CliRunner

    from opendecide.cli import app

    result = CliRunner().invoke(app, ["eval", "agree", "--a", "nothing", "--reuse-a", str(tmp_path)])
    assert result.exit_code == 2 and "--reuse-a needs --out" in result.output
    # The engine spec's own error is a usage error too, naming the spec.
    result = CliRunner().invoke(app, ["eval", "agree", "--a", "nothing", "--tasks", "irony"])
    assert result.exit_code == 2 and "unknown engine 'nothing'" in result.output
