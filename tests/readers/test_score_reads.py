"""Score levels read by their own words (decide-prompt/5), digits where they cannot be, and layouts
composed per question type."""

from __future__ import annotations

import math

import pytest

from readers.prompt import (
    DIGIT_SCORES,
    MAX_LEVEL_WORDS,
    WORDED_SCORES,
    LabelStyle,
    PromptLayout,
    QuestionSpec,
    build_prompt,
    label_candidates,
    level_words,
    masked_score_styles,
    prompt_layout,
)
from readers.reader import Reader
from readers.trie import Trie

pytestmark = pytest.mark.anyio

STATE = "A gorgeous, witty and moving film."


def score(*levels: str | None, instructions: str = "How positive is this review?") -> QuestionSpec:
    return QuestionSpec("score", instructions, tuple(str(i) for i in range(len(levels))), levels)


FIVE = score("very negative", "negative", "neutral", "positive", "very positive")


def test_short_distinct_level_names_are_read_by_their_words_else_by_digits():
    assert level_words(FIVE) == FIVE.descriptions
    long_level = " ".join(["word"] * (MAX_LEVEL_WORDS + 1))
    for unreadable in (
        score("bad", long_level),  # a rubric line, not a name to write
        score("bad", "Bad"),  # the same name twice, by case
        score("bad", None),  # a level without text
        score("bad", "good\nvery good"),
    ):
        assert level_words(unreadable) is None
        assert [style for style, _ in label_candidates(unreadable, score_styles=WORDED_SCORES)] == [
            LabelStyle.DIGITS
        ]
    # words first, digits as the fallback; the old layouts read digits only
    assert [style for style, _ in label_candidates(FIVE, score_styles=WORDED_SCORES)] == list(WORDED_SCORES)
    assert [labels for _, labels in label_candidates(FIVE)] == [("0", "1", "2", "3", "4")]


def test_the_worded_prompt_lists_the_levels_in_order_and_never_numbers_them():
    text = build_prompt(FIVE, STATE, FIVE.descriptions, LabelStyle.TRIE).question
    assert "From lowest to highest: very negative, negative, neutral, positive, very positive." in text
    assert not any(digit in text for digit in "01234")
    digits = build_prompt(FIVE, STATE, ("0", "1", "2", "3", "4"), LabelStyle.DIGITS).question
    assert "0: very negative" in digits  # the digit layout is unchanged


async def test_levels_are_read_by_their_words_and_answer_in_level_order(local_engine):
    reader = Reader(local_engine, layout=prompt_layout("decide-prompt/5"))
    assert reader.score_label_styles == WORDED_SCORES
    reading = await reader.read(FIVE, STATE)
    # "negative" and "very negative" are distinct names: the trie reads each to its end
    assert reading.label_style is LabelStyle.TRIE and Trie(reading.label_sequences).depth == 2
    assert [label.strip() for label in reading.labels] == list(FIVE.descriptions)
    probabilities = reading.label_probabilities.probabilities
    assert math.isclose(sum(probabilities), 1.0, abs_tol=1e-6) and reading.label_probabilities.exact
    # the levels keep their order: the options are still "0" … "4"
    assert reading.question.options == ("0", "1", "2", "3", "4")
    old = await Reader(local_engine, layout=prompt_layout("decide-prompt/4")).read(FIVE, STATE)
    assert old.label_style is LabelStyle.DIGITS and old.labels == ("0", "1", "2", "3", "4")


def test_a_composed_layout_reads_each_type_under_its_part(local_engine):
    words, plain = prompt_layout("decide-prompt/5"), prompt_layout("decide-prompt/3")
    composed = PromptLayout(
        "composed-test",
        words.build,
        answer_lead=words.answer_lead,
        by_type=(("noul", plain), ("score", words)),
    )
    assert composed.for_question("noul") is plain and composed.for_question("choice") is composed
    reader = Reader(local_engine, layout=composed)
    noul = QuestionSpec("noul", "Is it positive?", ("true", "false"), (None, None))
    slot, _ = reader.prepare(noul, STATE)
    assert not local_engine.tokenizer.decode(slot.prompt_ids).endswith("Answer:")  # decide-prompt/3: no lead
    slot, style = reader.prepare(FIVE, STATE)
    assert style is LabelStyle.TRIE and local_engine.tokenizer.decode(slot.prompt_ids).rstrip().endswith(
        "Answer:"
    )
    with pytest.raises(ValueError, match="its parts must read"):
        PromptLayout("bad", words.build, by_type=(("noul", prompt_layout("decide-prompt/1")),))
    assert prompt_layout("decide-prompt/1").shares_state is False and words.shares_state
    assert DIGIT_SCORES == prompt_layout("decide-prompt/4").score_label_styles


def test_masked_engines_read_levels_by_first_tokens_where_exact_ones_read_a_trie():
    assert masked_score_styles(WORDED_SCORES) == (
        LabelStyle.WORDS,
        LabelStyle.FIRST_TOKENS,
        LabelStyle.DIGITS,
    )
    assert masked_score_styles(DIGIT_SCORES) == DIGIT_SCORES
