"""Jev's documented ``confidence``, so a threshold tuned on Jev keeps its meaning here.

- choice over n options: ``(p_max − 1/n) / (1 − 1/n)``: 0 for a uniform answer, 1 for a certain one.
- score over n levels 0…n−1: ``1 − Σᵢ pᵢ·|i − mode| ÷ ((1/n)·Σᵢ |i − (n−1)/2|)``, with ``mode`` the most
  probable level (the lowest on a tie): the expected distance from the mode, against the expected
  distance from the middle under a uniform answer. 1 when all mass is on one level.
- noul has no confidence on the wire (``noul`` is itself the probability); where one is compared
  (``x_min_confidence``, risk–coverage curves) it is the choice formula over (P(true), P(false)),
  ``|2·noul − 1|``.

:func:`answer_confidence` is the one dispatch over question types: the answer's ``confidence`` field
(``decide.build_answer``), the abstention threshold (``abstain.py``) and eval's curves use it.

Both are clipped to [0, 1], the range Jev documents: a spread-out score answer whose mode sits at an end
of the scale can otherwise go below 0 (uniform over 3 levels with mode 0 gives −0.5).
"""

from __future__ import annotations

from collections.abc import Sequence


def choice_confidence(probabilities: Sequence[float]) -> float:
    """``(p_max − 1/n) / (1 − 1/n)``, clipped to [0, 1].

    >>> round(choice_confidence([0.8, 0.1, 0.1]), 3)
    0.7
    >>> choice_confidence([0.5, 0.5])
    0.0
    """
    n = len(probabilities)
    if n < 2:
        raise ValueError("a choice has at least 2 options")
    return _clip((max(probabilities) - 1 / n) / (1 - 1 / n))


def score_confidence(probabilities: Sequence[float]) -> float:
    """``1 − Σᵢ pᵢ·|i − mode| ÷ ((1/n)·Σᵢ |i − (n−1)/2|)``, clipped to [0, 1].

    >>> round(score_confidence([0.1, 0.1, 0.8]), 3)
    0.55
    >>> score_confidence([0.0, 1.0, 0.0])
    1.0
    """
    n = len(probabilities)
    if n < 2:
        raise ValueError("a score has at least 2 levels")
    mode = max(range(n), key=lambda i: (probabilities[i], -i))
    spread = sum(p * abs(i - mode) for i, p in enumerate(probabilities))
    uniform_spread = sum(abs(i - (n - 1) / 2) for i in range(n)) / n
    return _clip(1 - spread / uniform_spread)


def _clip(value: float) -> float:
    return min(1.0, max(0.0, value))


def answer_confidence(
    question_type: str, probabilities: dict[str, float], *, informative: bool = True
) -> float:
    """An answer's confidence: the score formula for a score, the choice formula otherwise (noul
    included); 0 for an uninformative read (no label came back).

    >>> answer_confidence("noul", {"true": 0.8, "false": 0.2})
    0.6000000000000001
    """
    if not informative:
        return 0.0
    values = list(probabilities.values())
    return score_confidence(values) if question_type == "score" else choice_confidence(values)
