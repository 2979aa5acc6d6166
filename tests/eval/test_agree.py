"""Agreement between two reads of the same records (pure: no engine)."""

from __future__ import annotations

import pytest

from eval.agree import agreement, margin
from eval.tasks import spread
from eval.reads import RecordRead


def read(id_: str, p_pos: float, returned: int = 2, variant: str = "original") -> RecordRead:
    reading = {"labels_total": 2, "labels_returned": returned, "exact": returned == 2}
    return RecordRead(id_, "sst2", variant, "positive", {"positive": p_pos, "negative": 1 - p_pos}, reading, 1.0)


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
