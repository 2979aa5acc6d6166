"""Prompt layouts by version: the current one shares the state, earlier ones stay readable for eval."""

from __future__ import annotations

import pytest

from readers.prompt import CURRENT_LAYOUT, PROMPT_LAYOUTS, PROMPT_VERSION, LabelStyle, QuestionSpec, prompt_layout
from readers.reader import Reader

pytestmark = pytest.mark.anyio

QUESTION = QuestionSpec("choice", "What is the topic of this news article?", ("World", "Sports"), ("world news", None))
STATE = "The match ended in a draw after extra time."


def test_versions_are_registered_and_unknown_ones_named():
    assert CURRENT_LAYOUT.version == PROMPT_VERSION and "decide-prompt/1" in PROMPT_LAYOUTS
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


async def test_a_read_under_an_earlier_layout_is_exact(local_engine):
    reader = Reader(local_engine, layout=prompt_layout("decide-prompt/1"))
    slot, _ = reader.prepare(QUESTION, STATE)
    reading = await reader.read(QUESTION, STATE)
    reference = local_engine.next_token_logprobs(slot.prompt_ids)
    expected = reference[list(slot.label_ids)].softmax(-1).tolist()
    assert reading.label_probabilities.probabilities == pytest.approx(expected, abs=1e-4)
