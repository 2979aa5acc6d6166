"""Abstention: an answer marked not to act on (``x_reading.abstained``), for either of two reasons.

- an uninformative read: no label came back (``informative`` false), so its probabilities are the
  floor's tie and its confidence is 0;
- low confidence: the question set ``x_min_confidence`` and the answer's confidence is below it.

The confidence compared is the one the answer carries (``confidence.answer_confidence``, over the
calibrated probabilities when a calibration applied; for noul ``|2·noul − 1|``). An abstained answer
keeps every Jev field.
"""

from __future__ import annotations

from service.pipeline.confidence import answer_confidence


def abstains(
    question_type: str, probabilities: dict[str, float], *, informative: bool, min_confidence: float | None
) -> bool:
    """Whether the answer is abstained: an uninformative read, or confidence under ``min_confidence``."""
    if not informative:
        return True
    return min_confidence is not None and answer_confidence(question_type, probabilities) < min_confidence
