"""The gold curve and reliability diagrams, from synthetic evidence with a known miscalibration."""

from __future__ import annotations

import json

import numpy as np

from calibration.metrics import ece, reliability_bins
from calibration.temperature import apply_temperature
from eval.decisions.gold_curve import gold_curve, run_gold_curve
from eval.evidence.rows import write_rows


def overconfident(n: int, seed: int = 0):
    """Reads whose true temperature is 3: at T = 1 they are overconfident."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, size=(n, 2))
    truth = apply_temperature(logits, 3.0)
    gold = np.array([rng.choice(2, p=row) for row in truth])
    return logits, gold


def test_fitting_on_gold_answers_lowers_held_out_ece():
    logits, gold = overconfident(300)
    points = {p["n_gold"]: p for p in gold_curve(logits, gold, splits=10)["points"]}
    assert list(points) == [0, 25, 50, 100, 150]
    assert points[50]["ece_mean"] < points[0]["ece_mean"]
    assert points[150]["temperature_median"] > 1.5


def test_reliability_bins_cover_every_row():
    logits, gold = overconfident(200, seed=1)
    probabilities = apply_temperature(logits, 1.0)
    bins = reliability_bins(probabilities, gold)
    assert sum(b["count"] for b in bins) == 200
    assert all(b["lo"] < b["confidence"] <= b["hi"] + 1e-12 for b in bins)
    # the diagram's bins are the ones ECE sums over
    assert sum(b["count"] / 200 * abs(b["accuracy"] - b["confidence"]) for b in bins) == ece(
        probabilities, gold
    )


def test_run_writes_tables_and_figures_from_evidence(tmp_path):
    logits, gold = overconfident(300, seed=2)
    probabilities = apply_temperature(logits, 1.0)
    options = ["negative", "positive"]
    lines = [
        json.dumps(
            {
                "id": f"sst2-{i}",
                "task": "sst2",
                "variant": "original",
                "gold": options[y],
                "options": options,
                "status": "ok",
                "probabilities": dict(zip(options, map(float, p))),
            }
        )
        for i, (p, y) in enumerate(zip(probabilities, gold))
    ]
    reads = tmp_path / "reads.jsonl.gz"
    write_rows(reads, map(json.loads, lines))
    report = run_gold_curve(reads, tmp_path / "out", splits=5)
    assert set(report["tasks"]) == {"sst2"}
    for name in ("gold-curve.png", "reliability-sst2.png", "gold-curve.json", "gold-curve.md"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    assert (tmp_path / "out" / "gold-curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| sst2 | 300 |" in (tmp_path / "out" / "gold-curve.md").read_text()
