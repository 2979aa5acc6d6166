"""Prompt layouts by version: the current one shares the state, earlier ones stay readable for eval."""

from __future__ import annotations

import pytest

from readers.prompt import (
    CURRENT_LAYOUT,
    MANY_OPTIONS,
    PROMPT_LAYOUTS,
    PROMPT_VERSION,
    LabelStyle,
    QuestionSpec,
    prompt_layout,
)
from readers.reader import Reader

pytestmark = pytest.mark.anyio

QUESTION = QuestionSpec(
    "choice", "What is the topic of this news article?", ("World", "Sports"), ("world news", None)
)
STATE = "The match ended in a draw after extra time."


def test_versions_are_registered_and_unknown_ones_named():
    assert CURRENT_LAYOUT.version == PROMPT_VERSION == "decide-prompt/9" and {
        "decide-prompt/1",
        "decide-prompt/3",
    } <= set(PROMPT_LAYOUTS)
    with pytest.raises(ValueError, match="decide-prompt/0"):
        prompt_layout("decide-prompt/0")


def test_question_first_layout_puts_the_question_before_the_state(local_engine):
    old = Reader(local_engine, layout=prompt_layout("decide-prompt/1"))
    new = Reader(local_engine)
    for reader, question_first in ((old, True), (new, False)):
        slot, style = reader.prepare(QUESTION, STATE)
        text = local_engine.tokenizer.decode(slot.prompt_ids)
        assert (text.index("Question:") < text.index(STATE)) is question_first
        shared = local_engine.tokenizer.decode(slot.prompt_ids[: slot.prefix_tokens])
        # Only the current layout's shared prefix holds the state (what every question about it reuses)
        assert (STATE in shared) is not question_first
    assert old.label_styles == (LabelStyle.WORDS, LabelStyle.CODES)


@pytest.mark.slow  # reads under an earlier layout, checked against full passes
async def test_a_read_under_an_earlier_layout_is_exact(local_engine):
    reader = Reader(local_engine, layout=prompt_layout("decide-prompt/1"))
    slot, _ = reader.prepare(QUESTION, STATE)
    reading = await reader.read(QUESTION, STATE)
    reference = local_engine.next_token_logprobs(slot.prompt_ids)
    expected = reference[list(slot.label_ids)].softmax(-1).tolist()
    assert reading.label_probabilities.probabilities == pytest.approx(expected, abs=1e-4)


@pytest.mark.slow  # reads under each layout
async def test_the_current_layout_reads_the_answer_after_its_lead(local_engine):
    """decide-prompt/4 is decide-prompt/3's text with "Answer:" opening the assistant turn: the
    prompts differ only there, the labels are read as the next word (" World"), and the read is the
    model's own next-token distribution at that place."""
    question = QuestionSpec(
        "choice",
        "What is the topic of this news article?",
        ("World", "Sports", "Business"),
        (None, None, None),
    )
    before, after = (
        Reader(local_engine, layout=prompt_layout(version))
        for version in ("decide-prompt/3", "decide-prompt/4")
    )
    (old, _), (new, style) = before.prepare(question, STATE), after.prepare(question, STATE)
    lead = local_engine.tokenizer.encode("Answer:", add_special_tokens=False)
    assert style is LabelStyle.WORDS and new.labels == (" World", " Sports", " Business")
    assert new.prompt_ids == old.prompt_ids + tuple(lead) and new.prefix_tokens == old.prefix_tokens
    assert [local_engine.tokenizer.decode([i]) for i in new.label_ids] == [" World", " Sports", " Business"]
    reading = await after.read(question, STATE)
    expected = local_engine.next_token_logprobs(new.prompt_ids)[list(new.label_ids)].softmax(-1).tolist()
    assert reading.label_probabilities.probabilities == pytest.approx(expected, abs=1e-4)


def test_where_the_tokenizer_splits_the_space_off_the_label_the_space_joins_the_lead(local_engine):
    """SmolLM2 encodes " 3" as " " and "3": score levels are read after "Answer: " as single digits,
    while words keep their space (" World" is one token)."""
    # levels without short names read as digits (a rubric line is not an answer to write)
    long = tuple(f"the review is {word} on the whole" for word in ("bad", "mixed", "good"))
    levels = QuestionSpec("score", "How positive is this review?", ("0", "1", "2"), long)
    slot, style = Reader(local_engine).prepare(levels, STATE)
    assert style is LabelStyle.DIGITS and slot.labels == ("0", "1", "2")
    assert local_engine.tokenizer.decode(list(slot.prompt_ids)).endswith("assistant\nAnswer: ")
    assert [local_engine.tokenizer.decode([i]) for i in slot.label_ids] == ["0", "1", "2"]


def test_a_trie_whose_labels_all_begin_with_the_space_takes_the_form_without_it(local_engine):
    """ " 10", " 20", " 30" all begin with SmolLM2's lone space token: that trie level would read 1
    for every option and cost an engine call, so the reader takes "Answer: " and reads "10", "20"…"""
    question = QuestionSpec("choice", "How many?", ("10", "20", "30"), (None, None, None))
    slot, style = Reader(local_engine).prepare(question, STATE)
    assert style is LabelStyle.TRIE and slot.labels == ("10", "20", "30") and len(set(slot.label_ids)) == 3
    assert local_engine.tokenizer.decode(list(slot.prompt_ids)).endswith("assistant\nAnswer: ")


def test_questions_read_as_before_keep_their_read_version():
    """Calibrations are keyed by read version: under decide-prompt/9 a question whose prompt is
    decide-prompt/7's, token for token, keeps /7 (its stored fits still apply); a choice of
    MANY_OPTIONS or more, read options-first, is keyed /8."""
    current = prompt_layout("decide-prompt/9")
    assert current.read_version_for("noul", 2) == "decide-prompt/7"
    assert current.read_version_for("score", 5) == "decide-prompt/7"
    assert current.read_version_for("choice", MANY_OPTIONS - 1) == "decide-prompt/7"
    assert current.read_version_for("choice", MANY_OPTIONS) == "decide-prompt/8"
    assert prompt_layout("decide-prompt/7").read_version_for("choice", 255) == "decide-prompt/7"
