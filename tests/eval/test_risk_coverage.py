"""Risk–coverage curves: the pure function by hand, and `decide eval score`'s curves on a real small run."""

from __future__ import annotations

import doctest
import json

import pytest

import eval.decisions.risk_coverage
from eval.decisions.risk_coverage import risk_coverage, row_confidence
from eval.evidence.rows import load_rows


def test_doctests():
    assert doctest.testmod(eval.decisions.risk_coverage).failed == 0


def test_hand_computed_points_with_ties():
    points = risk_coverage([0.2, 0.8, 0.8, 0.5, 0.0], [False, True, False, True, True])
    assert [p["threshold"] for p in points] == [0.8, 0.5, 0.2, 0.0]
    assert [p["answered"] for p in points] == [2, 3, 4, 5]
    assert [p["risk"] for p in points] == [0.5, pytest.approx(1 / 3), 0.5, 0.4]
    assert points[-1]["coverage"] == 1.0 and points[-1]["accuracy"] == pytest.approx(0.6)
    assert risk_coverage([], []) == []
    with pytest.raises(ValueError, match="2 confidences but 1"):
        risk_coverage([0.1, 0.2], [True])


@pytest.mark.slow  # the session's tasks_run: records of every task read through the embedded model
def test_score_draws_a_curve_per_task_from_real_reads(tasks_run):
    """The session's real sst2 run, scored by `write_score`: its curve ends at full coverage with the run's accuracy."""
    curves = json.loads((tasks_run / "risk-coverage.json").read_text())["tasks"]
    score = json.loads((tasks_run / "score.json").read_text())
    assert set(curves) == {"sst2"} and (tasks_run / "risk-coverage-sst2.png").stat().st_size > 5000
    points = curves["sst2"]
    assert points[-1]["coverage"] == 1.0 and points[-1]["accuracy"] == pytest.approx(
        score["tasks"]["sst2"]["accuracy"]
    )
    assert [p["threshold"] for p in points] == sorted((p["threshold"] for p in points), reverse=True)
    rows = [row for row in load_rows(tasks_run) if row["variant"] == "original"]
    # A threshold is the x_min_confidence to send: the service's own confidence of each answer.
    for row in rows:
        assert row_confidence(row) == pytest.approx(abs(2 * max(row["probabilities"].values()) - 1))
