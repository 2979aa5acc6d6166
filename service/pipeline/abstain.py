"""Abstention: when an answer should not be acted on, judged by the same confidence Jev reports.

An answer abstains when no label came back (``informative`` false: its probabilities are the floor's
tie) or when the question set ``x_min_confidence`` and the answer's confidence is below it. The
confidence compared is the one the answer carries (``service/confidence.py``, over the calibrated
probabilities when a calibration applied); noul answers carry none, so for them it is the choice
formula over (P(true), P(false)), ``|2·noul − 1|``. An abstaining answer keeps every Jev field.
"""

from __future__ import annotations

from service.pipeline.confidence import choice_confidence, score_confidence


def answer_confidence(
    question_type: str, probabilities: dict[str, float], *, informative: bool = True
) -> float:
    """The confidence an abstention threshold compares against (0 for an uninformative read).

    >>> answer_confidence("noul", {"true": 0.8, "false": 0.2})
    0.6000000000000001
    """
    if not informative:
        return 0.0
    values = list(probabilities.values())
    return score_confidence(values) if question_type == "score" else choice_confidence(values)


def abstains(
    question_type: str, probabilities: dict[str, float], *, informative: bool, min_confidence: float | None
) -> bool:
    """Whether the answer abstains: no label came back, or its confidence is under ``min_confidence``."""
    if not informative:
        return True
    return min_confidence is not None and answer_confidence(question_type, probabilities) < min_confidence
