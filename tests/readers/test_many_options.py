"""Many described options: the option list before the state (decide-prompt/8), computed once for a
question's read and its content-free prior reads; short lists read as before (decide-prompt/7)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from calibration.bias import CONTENT_FREE_STATES
from readers.prompt import CURRENT_LAYOUT, MANY_OPTIONS, QuestionSpec, canonical_order, prompt_layout
from readers.reader import Reader

pytestmark = pytest.mark.anyio

STATE = "Shares of the carmaker rose 4% after it raised its yearly forecast."
NAMES = (
    "red",
    "green",
    "blue",
    "black",
    "white",
    "gold",
    "pink",
    "grey",
    "brown",
    "silver",
    "orange",
    "purple",
)


def described(count: int, tag: str = "") -> QuestionSpec:
    """``count`` described options: one-token names (one read, no trie) up to twelve, else numbered
    desks; ``tag`` makes the list new to the engine's token tree, which the session's tests share."""
    names = NAMES[:count] if count <= len(NAMES) else tuple(f"desk {i}" for i in range(count))
    return QuestionSpec(
        "choice",
        "Which desk should handle this news item?",
        names,
        tuple(f"the {name} desk handles news {tag}" for name in names),
    )


def test_a_long_list_comes_before_the_state_and_a_short_one_reads_as_under_7(local_engine):
    current, seven = Reader(local_engine), Reader(local_engine, layout=prompt_layout("decide-prompt/7"))
    long_list = described(max(MANY_OPTIONS, len(NAMES)))
    slot, _ = current.prepare(long_list, STATE)
    text = local_engine.tokenizer.decode(slot.prompt_ids)
    assert text.index(long_list.descriptions[0]) < text.index(STATE) < text.index("Question:")
    # The prefix a read names (routing's key, and what the prior reads share) is the option list, the
    # same ids on any state.
    other, _ = current.prepare(long_list, "N/A")
    assert slot.prompt_ids[: slot.prefix_tokens] == other.prompt_ids[: other.prefix_tokens]
    assert long_list.descriptions[-1] in local_engine.tokenizer.decode(slot.prompt_ids[: slot.prefix_tokens])
    # Below the threshold the current layout is /7, id for id (the shipped tasks: 2–6 options).
    short = described(MANY_OPTIONS - 1)
    assert current.prepare(short, STATE)[0] == seven.prepare(short, STATE)[0]


def test_options_without_descriptions_list_nothing_so_read_as_under_7(local_engine):
    eight, seven = (
        Reader(local_engine, layout=prompt_layout(v)) for v in ("decide-prompt/8", "decide-prompt/7")
    )
    plain = QuestionSpec("choice", "Which colour?", NAMES, (None,) * len(NAMES))
    assert eight.prepare(plain, STATE)[0] == seven.prepare(plain, STATE)[0]


def test_the_current_layout_reads_by_option_count():
    assert CURRENT_LAYOUT.for_question("choice", MANY_OPTIONS).version == "decide-prompt/8"
    assert CURRENT_LAYOUT.for_question("choice", MANY_OPTIONS - 1) is CURRENT_LAYOUT
    # Yes/no questions have two options whatever the threshold: read under /3's text as before.
    assert CURRENT_LAYOUT.for_question("noul", 2).version == "decide-prompt/3"


@pytest.mark.slow  # eight reads of the embedded model
@pytest.mark.parametrize("version", ["decide-prompt/7", "decide-prompt/8"])
async def test_prior_reads_reuse_the_option_list_only_when_it_comes_first(local_engine, version):
    """The caller's read, then the three content-free reads the prior is measured with
    (``service.pipeline.prior.measure_prior``: not kept, at once). Options-first, each prior read
    reuses the whole list and computes only its state and the question after it; under /7 the list
    follows the state, so each computes it again (this is what the test tells apart)."""
    reader = Reader(local_engine, layout=prompt_layout(version))
    question = described(len(NAMES), tag=uuid.uuid4().hex[:8])
    first = await reader.read(question, STATE)
    priors = await asyncio.gather(
        *(reader.read(question, state, keep=False) for state in CONTENT_FREE_STATES)
    )
    lines = [f"{question.options[i]}: {question.descriptions[i]}" for i in canonical_order(question.options)]
    # The list's tokens on their own; in context a token may merge across either end of it.
    list_tokens = len(local_engine.tokenizer.encode("\n".join(lines))) - 2
    assert first.tokens_computed >= list_tokens  # new to the tree either way
    for reading, state in zip(priors, CONTENT_FREE_STATES):
        slot, _ = reader.prepare(question, state)
        assert reading.tokens_computed + reading.tokens_reused == len(slot.prompt_ids)
        if version == "decide-prompt/8":
            assert reading.tokens_reused >= slot.prefix_tokens > list_tokens
            assert reading.tokens_computed <= len(slot.prompt_ids) - slot.prefix_tokens
        else:
            assert reading.tokens_computed >= list_tokens
