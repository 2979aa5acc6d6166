"""The pure read: floor rule, bounds, labels_returned, abstention — no model involved."""

from __future__ import annotations

import math
import random

import pytest

from readers.engines.base import EngineReply, ReadMode
from readers.errors import EngineBadReply
from readers.probabilities import label_probabilities, softmax


def reply(
    logprobs: dict[int, float], read_mode: ReadMode = ReadMode.TOPK, normalised: bool = False
) -> EngineReply:
    return EngineReply(
        logprobs=logprobs,
        read_mode=read_mode,
        prompt_tokens=10,
        latency_ms=1.0,
        normalised_over_labels=normalised,
    )


def test_all_labels_returned_is_exact_softmax():
    read = label_probabilities(reply({7: -1.0, 8: -2.0, 9: -0.5}, ReadMode.EXACT), [7, 8])
    expected = [1 / (1 + math.exp(-1.0)), math.exp(-1.0) / (1 + math.exp(-1.0))]
    assert read.probabilities == pytest.approx(expected)
    assert read.exact and read.informative and not read.floor_used
    assert read.labels_returned == 2
    assert read.bounds == tuple((p, p) for p in read.probabilities)
    assert read.label_mass == pytest.approx(math.exp(-1.0) + math.exp(-2.0))


def test_missing_label_gets_lowest_returned_minus_offset():
    read = label_probabilities(reply({1: -0.2, 2: -1.5, 7: -3.0}), [7, 9])
    assert read.floor == pytest.approx(-8.0)
    assert read.returned == (True, False)
    assert read.labels_returned == 1 and not read.exact and read.floor_used
    assert read.logprobs == (-3.0, None)
    assert read.probabilities == pytest.approx(softmax([-3.0, -8.0]))
    assert sum(read.probabilities) == pytest.approx(1.0)


def test_floor_offset_is_configurable():
    read = label_probabilities(reply({1: -0.2, 7: -3.0}), [7, 9], floor_offset=2.0)
    assert read.floor == pytest.approx(-5.0)
    assert read.probabilities == pytest.approx(softmax([-3.0, -5.0]))


def test_bounds_for_a_missing_label():
    read = label_probabilities(reply({1: -0.2, 7: -1.0}), [7, 9])
    (lo7, hi7), (lo9, hi9) = read.bounds
    # label 9 lies anywhere in (-inf, -1.0]: at -1.0 the two tie; at -inf label 7 takes everything.
    assert (lo7, hi7) == pytest.approx((0.5, 1.0))
    assert (lo9, hi9) == pytest.approx((0.0, 0.5))
    assert lo7 <= read.probabilities[0] <= hi7 and lo9 <= read.probabilities[1] <= hi9


def test_bounds_contain_the_true_probabilities_of_a_top_k_read():
    rng = random.Random(1234)
    for _ in range(200):
        vocab = 60
        logits = [rng.gauss(0, 3) for _ in range(vocab)]
        full = [math.log(p) for p in softmax(logits)]
        k = rng.randint(1, 20)
        top = dict(sorted(enumerate(full), key=lambda item: -item[1])[:k])
        labels = rng.sample(range(vocab), rng.randint(2, 6))
        read = label_probabilities(reply(top), labels)
        truth = softmax([full[i] for i in labels])
        if not read.informative:
            assert all(bound == (0.0, 1.0) for bound in read.bounds)
            continue
        for p, (lo, hi) in zip(truth, read.bounds):
            assert lo - 1e-12 <= p <= hi + 1e-12


def test_no_label_returned_is_an_uninformative_read():
    read = label_probabilities(reply({1: -0.1, 2: -2.5}), [7, 8, 9])
    assert not read.informative and read.labels_returned == 0
    assert read.bounds == ((0.0, 1.0),) * 3
    assert read.probabilities == pytest.approx((1 / 3,) * 3)
    assert read.label_mass is None


def test_masked_reads_report_no_label_mass():
    read = label_probabilities(reply({7: -0.1, 8: -2.4}, ReadMode.MASKED, normalised=True), [7, 8])
    assert read.exact and read.label_mass is None


@pytest.mark.parametrize(
    "logprobs, read_mode",
    [
        ({}, ReadMode.TOPK),
        ({7: -1.0}, ReadMode.EXACT),  # exact reply missing label 8
        ({7: float("nan"), 8: -1.0}, ReadMode.EXACT),
        ({7: 0.5, 8: -1.0}, ReadMode.EXACT),  # a log-prob above 0 is not a log-prob
    ],
)
def test_unusable_replies_are_engine_errors(logprobs, read_mode):
    with pytest.raises(EngineBadReply):
        label_probabilities(reply(logprobs, read_mode), [7, 8])
