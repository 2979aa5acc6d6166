"""The read-mode table is computed from agreement evidence files alone."""

from __future__ import annotations

import json

import pytest

from eval.decisions.read_modes import mode_rows, read_modes_table, write_read_modes
from eval.evidence.rows import write_rows


def write(path, reads):
    write_rows(path, reads)  # the rows, and their latencies in the timings file beside them


def record(id_, gold, p_pos, exact=True, latency=10.0):
    probabilities = {"negative": 1 - p_pos, "positive": p_pos}
    return {
        "id": id_, "task": "sst2", "variant": "original", "gold": gold, "options": ["negative", "positive"], "status": "ok", "probabilities": probabilities,
        "predicted": max(probabilities, key=probabilities.get), "reading": {"exact": exact}, "latency_ms": latency,
    }  # fmt: skip


def test_rows_from_evidence(tmp_path):
    write(tmp_path / "a.jsonl.gz", [record("sst2-1", "positive", 0.9), record("sst2-2", "negative", 0.3)])
    write(
        tmp_path / "b.jsonl.gz",
        [
            record("sst2-2", "negative", 0.6, exact=False, latency=30.0),
            record("sst2-1", "positive", 0.9, latency=20.0),
        ],
    )
    manifest = {
        "reads": {"a": "a.jsonl.gz", "b": "b.jsonl.gz"},
        "engines": {
            "a": {"kind": "local", "read_mode": "exact", "top_k": 49152},
            "b": {"kind": "vllm", "read_mode": "topk", "top_k": 32},
        },
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    (row,) = mode_rows(tmp_path)
    assert row["same_label"] == 1 and row["all_labels_returned"] == 1 and row["n"] == 2
    assert row["accuracy_exact"] == 1.0 and row["accuracy_mode"] == 0.5
    # 15 bins: exact reads 0.9 (correct) and 0.7 (correct) → 0.5·0.1 + 0.5·0.3
    assert row["ece_exact"] == pytest.approx(0.2)
    assert row["max_abs_dp"] == pytest.approx(0.3)
    assert row["median_latency_ms_mode"] == 25.0
    assert "1 of 2" in read_modes_table([row])
    write_read_modes([tmp_path], tmp_path / "read-modes.json")
    assert json.loads((tmp_path / "read-modes.json").read_text()) == [row]


def test_side_a_may_live_in_another_run(tmp_path):
    """An agreement run that reused another's a reads points at them from its manifest."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    write(first / "a.jsonl.gz", [record("sst2-1", "positive", 0.9)])
    write(second / "b.jsonl.gz", [record("sst2-1", "positive", 0.4, exact=False)])
    engines = {
        "a": {"kind": "local", "read_mode": "exact", "top_k": 49152},
        "b": {"kind": "vllm", "read_mode": "masked", "top_k": 32},
    }
    (second / "manifest.json").write_text(
        json.dumps({"reads": {"a": "../first/a.jsonl.gz", "b": "b.jsonl.gz"}, "engines": engines})
    )
    (row,) = mode_rows(second)
    assert row["same_label"] == 0 and row["max_abs_dp"] == pytest.approx(0.5)
