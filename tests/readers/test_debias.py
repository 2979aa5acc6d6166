"""Order-debiased reads on the embedded model: rotations, their averaging, one engine call per state."""

from __future__ import annotations

import math

import pytest

from readers.debias import (
    ROTATE_REVERSE,
    RotatedReading,
    combine,
    order_free,
    read_many_rotated,
    rotate,
    rotation_orders,
    rotation_shifts,
)
from readers.prompt import LabelStyle, QuestionSpec
from readers.reader import Reader

pytestmark = pytest.mark.anyio

TOPIC = QuestionSpec(
    "choice",
    "What is the topic of this news article?",
    ("World", "Sports", "Business", "Sci/Tech"),
    ("politics", None, "economy", "science"),
)
SENTIMENT = QuestionSpec(
    "choice", "What is the sentiment of this movie review?", ("negative", "positive"), (None, None)
)
STATE = "The striker scored twice as the home side won the cup final on Sunday."
EXACT = 1e-4  # float32 batched vs single reads: rounding only


def coded(engine) -> Reader:
    """Letter codes: the one label style whose prompt lists the options in the asked order, so
    rotations read different prompts (named options are not listed since decide-prompt/3)."""
    return Reader(engine, label_styles=(LabelStyle.CODES,))


class CountingEngine:
    """The local engine, counting its read_many calls."""

    def __init__(self, engine) -> None:
        self.engine, self.calls = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def read_many(self, requests):
        self.calls.append(len(requests))
        return await self.engine.read_many(requests)


def test_shifts_are_spread_and_start_at_the_asked_order():
    assert rotation_shifts(4, 4) == (0, 1, 2, 3)
    assert rotation_shifts(6, 2) == (0, 3)
    assert rotation_shifts(6, 4) == (0, 2, 3, 4)  # distinct, evenly spread as rounding allows
    with pytest.raises(ValueError, match="option count 4"):
        rotation_shifts(4, 5)


def test_rotate_moves_descriptions_with_their_options():
    turned = rotate(TOPIC, 1)
    assert turned.options == ("Sports", "Business", "Sci/Tech", "World")
    assert dict(zip(turned.options, turned.descriptions)) == dict(zip(TOPIC.options, TOPIC.descriptions))
    with pytest.raises(ValueError, match="ordered"):
        rotate(QuestionSpec("score", None, ("0", "1"), ("bad", "good")), 1)


@pytest.mark.slow  # every rotation read
async def test_averaged_reading_is_the_softmax_of_mean_log_probabilities(local_engine):
    reader = coded(local_engine)
    (reading,) = await read_many_rotated(reader, [TOPIC], STATE, rotations=[4])
    assert isinstance(reading, RotatedReading) and reading.rotations == 4 and reading.question == TOPIC
    singles = [await reader.read(rotate(TOPIC, shift), STATE) for shift in range(4)]
    by_option = [dict(zip(r.question.options, r.label_probabilities.probabilities)) for r in singles]
    mean = [sum(math.log(p[o]) for p in by_option) / 4 for o in TOPIC.options]
    top = max(mean)
    expected = [math.exp(m - top) / sum(math.exp(x - top) for x in mean) for m in mean]
    assert max(abs(a - b) for a, b in zip(reading.label_probabilities.probabilities, expected)) < EXACT
    choices = [max(p, key=p.__getitem__) for p in by_option]
    assert reading.rotation_choices == tuple(choices)
    best = TOPIC.options[max(range(4), key=expected.__getitem__)]
    assert reading.rotation_agreement == choices.count(best) / 4
    assert reading.prompt_tokens == sum(r.prompt_tokens for r in singles)
    assert reading.label_probabilities.exact and all(
        lo == hi for lo, hi in reading.label_probabilities.bounds
    )


async def test_two_options_read_both_ways_give_one_answer(local_engine):
    """With 2 options the reversed order is a rotation: all rotations read the same two prompts."""
    reader = coded(local_engine)
    flipped = QuestionSpec("choice", SENTIMENT.instructions, SENTIMENT.options[::-1], SENTIMENT.descriptions)
    review = "A tedious, overlong film with one good scene."
    asked, reversed_ = await read_many_rotated(reader, [SENTIMENT, flipped], review, rotations=[2, 2])
    p = dict(zip(SENTIMENT.options, asked.label_probabilities.probabilities))
    q = dict(zip(flipped.options, reversed_.label_probabilities.probabilities))
    assert max(abs(p[o] - q[o]) for o in p) < EXACT
    (plain,) = await read_many_rotated(reader, [SENTIMENT], review, rotations=[1])
    assert not isinstance(plain, RotatedReading)


@pytest.mark.slow  # every rotation and its reverse read
async def test_rotations_with_their_reverses_read_the_reversed_order_alike(local_engine):
    """rotate_reverse with all 2n orders: the asked order and its reverse read the same orders, so one answer."""
    assert len(set(rotation_orders(4, 8, ROTATE_REVERSE))) == 8
    flipped = QuestionSpec("choice", TOPIC.instructions, TOPIC.options[::-1], TOPIC.descriptions[::-1])
    asked, reversed_ = await read_many_rotated(
        coded(local_engine), [TOPIC, flipped], STATE, rotations=[8, 8], methods=[ROTATE_REVERSE] * 2
    )
    p = dict(zip(TOPIC.options, asked.label_probabilities.probabilities))
    q = dict(zip(flipped.options, reversed_.label_probabilities.probabilities))
    assert asked.rotations == 8 and max(abs(p[o] - q[o]) for o in p) < EXACT


@pytest.mark.slow  # every rotation of every question read
async def test_every_rotation_of_every_question_goes_in_one_engine_call(local_engine):
    counting = CountingEngine(local_engine)
    readings = await read_many_rotated(coded(counting), [TOPIC, SENTIMENT, TOPIC], STATE, rotations=[4, 1, 2])
    assert counting.calls == [4 + 1 + 2]
    assert [getattr(r, "rotations", 1) for r in readings] == [4, 1, 2]


async def test_combined_bounds_hold_the_probabilities_when_labels_are_missing(local_engine):
    """A top-k read that misses labels: the averaged probabilities lie inside their bounds."""
    reader = coded(local_engine)
    singles = await reader.read_many([rotate(TOPIC, s) for s in range(4)], STATE)
    # Drop labels as a top-k engine would: rebuild each rotation's reading from a reply without its last label.
    from dataclasses import replace

    from readers.engines.base import EngineReply, ReadMode
    from readers.probabilities import label_probabilities

    partial = []
    for reading in singles:
        logprobs = dict(zip(reading.label_ids[:-1], reading.label_probabilities.logprobs[:-1]))
        reply = EngineReply(logprobs, ReadMode.TOPK, reading.prompt_tokens, 1.0)
        partial.append(replace(reading, label_probabilities=label_probabilities(reply, reading.label_ids)))
    combined = combine(TOPIC, partial).label_probabilities
    assert not combined.exact and combined.floor is not None
    for p, (lo, hi) in zip(combined.probabilities, combined.bounds):
        assert lo - 1e-12 <= p <= hi + 1e-12 and 0 <= lo <= hi <= 1


@pytest.mark.slow  # every order read
async def test_named_options_are_one_prompt_in_every_order_and_are_read_once(local_engine):
    reader = Reader(local_engine)  # default styles: the options' own words, not listed in the prompt
    assert order_free(reader, TOPIC, STATE) and not order_free(coded(local_engine), TOPIC, STATE)
    (reading,) = await read_many_rotated(reader, [TOPIC], STATE, rotations=[4])
    (plain,) = await reader.read_many([TOPIC], STATE)
    assert not isinstance(reading, RotatedReading)
    assert reading.label_probabilities.probabilities == pytest.approx(
        plain.label_probabilities.probabilities, abs=EXACT
    )
