"""Label styles on the embedded model: first-token reads, whole names by the chain rule over a token
trie, and multi-token codes, against brute-force per-option sequence scoring."""

from __future__ import annotations

import math

import pytest
import torch

from readers.labels import ChatTemplate
from readers.probabilities import softmax
from readers.prompt import CURRENT_LAYOUT, LabelStyle, QuestionSpec, letter_codes
from readers.reader import Reader
from readers.trie import Trie

pytestmark = pytest.mark.anyio
EXACT = 1e-4
STATE = "The central bank raised interest rates again, and shares of regional lenders fell sharply."


def choice(*options: str) -> QuestionSpec:
    return QuestionSpec("choice", "Which fits?", tuple(options), (None,) * len(options))


def sequence_logprobs(engine, prompt_ids, sequences) -> list[float]:
    """log P(sequence | prompt) per sequence, teacher-forced on the model itself: the prompt's keys
    and values once, then each sequence's tokens in one forward (the cache cropped back after)."""
    model = engine.model
    with torch.inference_mode():
        cache = model(input_ids=torch.tensor([list(prompt_ids[:-1])]), use_cache=True).past_key_values
        start = cache.get_seq_length()
        scores = []
        for ids in sequences:
            step = torch.tensor([[prompt_ids[-1], *ids[:-1]]])
            logits = model(input_ids=step, cache=cache, use_cache=True).logits[0].float()
            cache.crop(-len(ids))
            assert cache.get_seq_length() == start
            scores.append(
                float(torch.log_softmax(logits, dim=-1)[torch.arange(len(ids)), torch.tensor(ids)].sum())
            )
    return scores


async def check_against_brute_force(reader: Reader, question: QuestionSpec, style: LabelStyle) -> None:
    reading = await reader.read(question, STATE)
    slot, _ = reader.prepare(question, STATE)
    assert reading.label_style is style
    assert (
        len(reading.label_sequences) == len(question.options) and max(map(len, reading.label_sequences)) > 1
    )
    truth = softmax(sequence_logprobs(reader.engine, slot.prompt_ids, reading.label_sequences))
    assert max(abs(a - b) for a, b in zip(reading.label_probabilities.probabilities, truth)) < EXACT
    assert math.isclose(sum(reading.label_probabilities.probabilities), 1.0, abs_tol=1e-9)
    depth = Trie(reading.label_sequences).depth
    assert reading.engine_calls == (1 if reader.engine.capabilities.shares_tokens_in_call else depth)
    assert reading.label_probabilities.exact and reading.label_probabilities.label_mass is not None


def test_trie_structure():
    trie = Trie([(1, 2, 3), (1, 2, 4), (1, 5), (6,)])
    assert trie.depth == 3 and trie.node_count == 3
    assert trie.nodes_at(0) == [()] and trie.children(()) == (1, 6)
    assert trie.nodes_at(1) == [(1,)] and trie.children((1,)) == (2, 5)
    assert trie.path(1) == [((), 0), ((1,), 0), ((1, 2), 1)]
    with pytest.raises(ValueError, match="prefix"):
        Trie([(1,), (1, 2)])
    with pytest.raises(ValueError, match="distinct"):
        Trie([(1,), (1,)])


@pytest.mark.slow  # 100 multi-token names, each scored by the trie and by brute force
async def test_100_multi_token_names_by_the_trie_equal_brute_force(local_engine):
    options = tuple(f"option number {i}" for i in range(100))
    await check_against_brute_force(Reader(local_engine), choice(*options), LabelStyle.TRIE)


@pytest.mark.slow
async def test_255_codes_when_single_token_codes_run_out_equal_brute_force(local_engine):
    # Options named by 255 one-token codes (as read after the current layout's lead) leave about 146
    # one-token codes on this tokenizer: codes run out and the reader falls back to multi-token codes
    # read by the trie.
    template = ChatTemplate(local_engine.tokenizer)
    lead, separator = CURRENT_LAYOUT.slot_forms()[0]
    single = template.single_token_labels(letter_codes(), 702, lead=lead, separator=separator)
    reader = Reader(local_engine, label_styles=(LabelStyle.CODES, LabelStyle.CODE_TRIE))
    question = choice(*single[:255])
    await check_against_brute_force(reader, question, LabelStyle.CODE_TRIE)
    reading = await reader.read(question, STATE)
    assert not {label.strip() for label in reading.labels} & set(question.options)


@pytest.mark.slow
async def test_255_multi_token_names_equal_brute_force(local_engine):
    options = tuple(f"{word} {i}" for i in range(85) for word in ("red", "green", "blue"))
    await check_against_brute_force(
        Reader(local_engine, label_styles=(LabelStyle.TRIE,)), choice(*options), LabelStyle.TRIE
    )


async def test_a_name_that_begins_another_is_scored_to_the_end_of_the_answer(local_engine):
    reader = Reader(local_engine)
    question = choice("good", "good movie", "bad")
    reading = await reader.read(question, "I liked it.")
    slot, _ = reader.prepare(question, "I liked it.")
    ends = {ids[-1] for ids in reading.label_sequences}
    assert len(ends) == 1 and local_engine.tokenizer.decode(list(ends)) == "<|im_end|>"
    truth = softmax(sequence_logprobs(local_engine, slot.prompt_ids, reading.label_sequences))
    assert max(abs(a - b) for a, b in zip(reading.label_probabilities.probabilities, truth)) < EXACT


@pytest.mark.slow  # many options read by first token and alone
async def test_first_tokens_read_distinct_first_tokens_in_one_call(local_engine):
    reader = Reader(local_engine, label_styles=(LabelStyle.WORDS, LabelStyle.FIRST_TOKENS, LabelStyle.TRIE))
    question = choice("World", "Sci/Tech", "Sports")
    reading = await reader.read(question, STATE)
    assert reading.label_style is LabelStyle.FIRST_TOKENS and reading.engine_calls == 1
    slot, _ = reader.prepare(question, STATE)
    row = local_engine.next_token_logprobs(slot.prompt_ids)
    truth = softmax([float(row[token]) for token in reading.label_ids])
    assert max(abs(a - b) for a, b in zip(reading.label_probabilities.probabilities, truth)) < EXACT
    with pytest.raises(Exception, match="same token"):
        Reader(local_engine, label_styles=(LabelStyle.FIRST_TOKENS,)).prepare(
            choice("red car", "red bus"), STATE
        )


@pytest.mark.slow  # trie reads exact and top-k
async def test_top_k_trie_reads_are_floored_and_bounded_around_the_exact_read(local_engine):
    question = choice(
        "Business", "Sci/Tech", "World", "Sports", "Bank stocks", "Interest rates", "Weather forecast"
    )
    exact = await Reader(local_engine).read(question, STATE)
    # the smallest of these k that returns some options' whole paths but not all
    for k in (20, 100, 500, 2000, 10000):
        topk = await Reader(local_engine.with_top_k(k)).read(question, STATE)
        if topk.label_probabilities.informative and not topk.label_probabilities.exact:
            break
    read = topk.label_probabilities
    assert topk.label_style is LabelStyle.TRIE and topk.read_mode == "topk"
    assert not read.exact and read.floor_used and read.informative
    for p, (lo, hi) in zip(exact.label_probabilities.probabilities, read.bounds):
        assert lo - 1e-9 <= p <= hi + 1e-9
    for returned, (lo, _hi) in zip(read.returned, read.bounds):
        assert returned or lo == 0.0


@pytest.mark.slow  # trie reads together and alone
async def test_a_trie_question_beside_one_token_questions_reads_as_alone(local_engine):
    reader = Reader(local_engine)
    questions = [
        choice("positive", "negative"),
        choice(*(f"option number {i}" for i in range(12))),
        QuestionSpec("noul", "Up?", ("true", "false"), (None, None)),
    ]
    together = await reader.read_many(questions, STATE)
    assert Trie(together[1].label_sequences).depth > 1
    assert [r.engine_calls for r in together] == [1, 1, 1]  # the local engine reads every level at once
    for question, reading in zip(questions, together):
        alone = await reader.read(question, STATE)
        assert (
            max(
                abs(a - b)
                for a, b in zip(
                    alone.label_probabilities.probabilities, reading.label_probabilities.probabilities
                )
            )
            < EXACT
        )
