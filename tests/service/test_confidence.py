"""Jev's confidence formulas, by hand on small inputs."""

from __future__ import annotations

import doctest

import pytest

import service.pipeline.confidence
from service.pipeline.confidence import choice_confidence, score_confidence


def test_doctests():
    assert doctest.testmod(service.pipeline.confidence).failed == 0


@pytest.mark.parametrize(
    "probabilities, expected",
    [
        ([1.0, 0.0], 1.0),
        ([0.5, 0.5], 0.0),
        ([0.7, 0.2, 0.1], (0.7 - 1 / 3) / (2 / 3)),
        ([0.25] * 4, 0.0),
        ([0.4, 0.6], 0.2),
    ],
)
def test_choice(probabilities, expected):
    assert choice_confidence(probabilities) == pytest.approx(expected)


@pytest.mark.parametrize(
    "probabilities, expected",
    [
        ([0.0, 0.0, 1.0], 1.0),
        ([1 / 3] * 3, 0.0),  # uniform: spread from the mode (level 0) 1 vs 2/3 → −0.5, clipped to 0
        ([0.2, 0.6, 0.2], 1 - 0.4 / (2 / 3)),  # mode 1: Σ p|i−1| = 0.4; uniform spread from the middle 2/3
        ([0.1, 0.2, 0.4, 0.2, 0.1], 1 - (0.1 * 2 + 0.2 + 0.2 + 0.1 * 2) / 1.2),
        ([0.5, 0.5], 1 - 0.5 / 0.5),  # a tie picks the lower level: spread 0.5 equals the uniform one
    ],
)
def test_score(probabilities, expected):
    assert score_confidence(probabilities) == pytest.approx(expected)


def test_score_confidence_is_never_outside_zero_one():
    assert score_confidence([0.5, 0.0, 0.5]) == 0.0
    assert 0.0 <= score_confidence([0.34, 0.33, 0.33]) <= 1.0


def test_fewer_than_two_options_is_an_error():
    with pytest.raises(ValueError):
        choice_confidence([1.0])
    with pytest.raises(ValueError):
        score_confidence([1.0])
