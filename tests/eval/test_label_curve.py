"""The label curve and reliability diagrams, from synthetic evidence with a known miscalibration."""

from __future__ import annotations

import json

import numpy as np

from calibration.temperature import apply_temperature
from eval.label_curve import label_curve, reliability, run_label_curve


def overconfident(n: int, seed: int = 0):
    """Reads whose true temperature is 3: at T = 1 they are overconfident."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, size=(n, 2))
    truth = apply_temperature(logits, 3.0)
    labels = np.array([rng.choice(2, p=row) for row in truth])
    return logits, labels


def test_fitting_on_labels_lowers_held_out_ece():
    logits, labels = overconfident(300)
    points = {p["labels"]: p for p in label_curve(logits, labels, splits=10)["points"]}
    assert list(points) == [0, 25, 50, 100, 150]
    assert points[50]["ece_mean"] < points[0]["ece_mean"]
    assert points[150]["temperature_median"] > 1.5


def test_reliability_bins_cover_every_row():
    logits, labels = overconfident(200, seed=1)
    bins = reliability(apply_temperature(logits, 1.0), labels)
    assert sum(b["count"] for b in bins) == 200
    assert all(b["lo"] < b["confidence"] <= b["hi"] + 1e-12 for b in bins)


def test_run_writes_tables_and_figures_from_evidence(tmp_path):
    logits, labels = overconfident(300, seed=2)
    probabilities = apply_temperature(logits, 1.0)
    options = ["negative", "positive"]
    lines = [
        json.dumps({"id": f"sst2-{i}", "task": "sst2", "variant": "original", "gold": options[y], "probabilities": dict(zip(options, map(float, p)))})
        for i, (p, y) in enumerate(zip(probabilities, labels))
    ]
    reads = tmp_path / "reads.jsonl"
    reads.write_text("\n".join(lines) + "\n")
    report = run_label_curve(reads, tmp_path / "out", splits=5)
    assert set(report["tasks"]) == {"sst2"}
    for name in ("label-curve.png", "reliability-sst2.png", "label-curve.json", "label-curve.md"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    assert (tmp_path / "out" / "label-curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| sst2 | 300 |" in (tmp_path / "out" / "label-curve.md").read_text()
