"""Risk–coverage curves: what answering only above a confidence threshold buys, per task.

For a threshold t, a decision is *answered* when its confidence is ≥ t (below t it abstains, as
``x_min_confidence = t`` would mark it). **coverage** = answered ÷ all decisions; **risk** = wrong
answers ÷ answered (accuracy = 1 − risk). There is one point per distinct confidence value, from the
highest (fewest answered) down to the lowest (all answered); an empty answered set has no risk and is
not a point. Confidence is the one answers carry (Jev's, ``service/pipeline/confidence.answer_confidence``), so a
threshold read off a curve is the ``x_min_confidence`` to send. Uninformative reads have confidence 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from eval.decisions.tasks import TASKS
from eval.evidence.manifest import write_json
from eval.evidence.rows import RECORDS, load_rows
from service.pipeline.confidence import answer_confidence


def risk_coverage(confidence: Sequence[float], correct: Sequence[bool]) -> list[dict]:
    """Points ``{threshold, answered, coverage, risk, accuracy}``, threshold descending.

    >>> [(p["threshold"], p["coverage"], p["risk"]) for p in risk_coverage([0.9, 0.5, 0.5, 0.1], [True, True, False, False])]
    [(0.9, 0.25, 0.0), (0.5, 0.75, 0.3333333333333333), (0.1, 1.0, 0.5)]
    """
    if len(confidence) != len(correct):
        raise ValueError(f"{len(confidence)} confidences but {len(correct)} correctness flags")
    n = len(confidence)
    pairs = sorted(zip(confidence, correct), key=lambda pair: -pair[0])
    points, answered, wrong = [], 0, 0
    for i, (value, ok) in enumerate(pairs):
        answered += 1
        wrong += not ok
        if i + 1 < n and pairs[i + 1][0] == value:
            continue  # ties share one threshold: all of them are answered at once
        risk = wrong / answered
        points.append(
            {
                "threshold": value,
                "answered": answered,
                "coverage": answered / n,
                "risk": risk,
                "accuracy": 1 - risk,
            }
        )
    return points


def row_confidence(row: dict) -> float:
    """An evidence row's answer confidence (from the row's answer probabilities; its task's question type)."""
    question_type = row.get("question_type") or TASKS[row["task"]].question_type
    return answer_confidence(question_type, row["probabilities"], informative=row["reading"]["informative"])


def run_curves(run: Path) -> dict:
    """Per task of a run's evidence (original variant, reads that succeeded): its risk–coverage points."""
    rows = [row for row in load_rows(run / RECORDS) if row["variant"] == "original" and row["status"] == "ok"]
    tasks = sorted({row["task"] for row in rows})
    curves = {}
    for task in tasks:
        mine = [row for row in rows if row["task"] == task]
        curves[task] = risk_coverage(
            [row_confidence(row) for row in mine], [row["predicted"] == row["gold"] for row in mine]
        )
    return curves


def write_risk_coverage(run: Path) -> dict:
    """risk-coverage.json and risk-coverage-<task>.png beside a run's evidence; returns the curves."""
    from eval.evidence.figures import plot_risk_coverage

    curves = run_curves(run)
    write_json(
        run / "risk-coverage.json",
        {"definition": "answered = confidence >= threshold; risk = wrong / answered", "tasks": curves},
    )
    for task, points in curves.items():
        plot_risk_coverage(
            points,
            run / f"risk-coverage-{task}.png",
            title=f"{task}: {points[-1]['answered'] if points else 0} decisions",
        )
    return curves
