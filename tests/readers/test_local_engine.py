"""Reads through the embedded model against a direct log-softmax of its logits."""

from __future__ import annotations

import pytest
import torch

from readers.probabilities import softmax
from readers.prompt import LabelStyle, QuestionSpec
from readers.reader import Reader

QUESTIONS = [
    QuestionSpec("choice", "What is the sentiment?", ("positive", "negative"), (None, None)),
    QuestionSpec("noul", "Is the writer happy?", ("true", "false"), (None, None)),
    QuestionSpec("score", "How positive is it?", ("0", "1", "2", "3"), ("awful", "poor", "good", "great")),
    QuestionSpec(
        "choice", "Topic?", ("World", "Sports", "Business", "Sci/Tech"), (None, None, None, "science")
    ),
]
STATES = [
    "I loved this film, it was wonderful.",
    "Dull, slow and far too long.",
    "Shares rose 4% after earnings.",
]

pytestmark = pytest.mark.anyio


def direct_label_probabilities(engine, prompt_ids, label_ids) -> list[float]:
    """The model's full forward (no logits_to_keep), log-softmax, then softmax over the labels."""
    with torch.inference_mode():
        logits = engine.model(input_ids=torch.tensor([prompt_ids])).logits[0, -1]
    logprobs = torch.log_softmax(logits.double(), dim=-1)
    return softmax([float(logprobs[i]) for i in label_ids])


@pytest.mark.parametrize(
    "question",
    [
        pytest.param(q, marks=[] if i == 0 else [pytest.mark.slow]) for i, q in enumerate(QUESTIONS)
    ],  # one in the fast tier
    ids=lambda q: q.question_type + str(len(q.options)),
)
async def test_exact_read_equals_direct_log_softmax(local_engine, question):
    reader = Reader(
        local_engine, label_styles=(LabelStyle.WORDS, LabelStyle.CODES)
    )  # one-token reads (tries: test_label_styles.py)
    for state in STATES:
        reading = await reader.read(question, state)
        assert reading.label_probabilities.exact and reading.read_mode == "exact"
        assert sum(reading.label_probabilities.probabilities) == pytest.approx(1.0, abs=1e-12)
        expected = direct_label_probabilities(
            local_engine, reading_prompt(reader, question, state), reading.label_ids
        )
        assert reading.label_probabilities.probabilities == pytest.approx(expected, abs=1e-4)


def reading_prompt(reader, question, state):
    slot, _ = reader.prepare(question, state)
    return list(slot.prompt_ids)


@pytest.mark.slow  # every question read exact and top-k
async def test_top_k_at_vocabulary_size_equals_exact(local_engine):
    exact = Reader(local_engine)
    full_top_k = Reader(local_engine.with_top_k(local_engine.info.vocab_size))
    for question in QUESTIONS:
        a = await exact.read(question, STATES[0])
        b = await full_top_k.read(question, STATES[0])
        assert b.read_mode == "topk" and b.label_probabilities.exact and not b.label_probabilities.floor_used
        # b reuses a's keys and values (the same prompt): equal to float rounding.
        assert b.label_probabilities.probabilities == pytest.approx(
            a.label_probabilities.probabilities, abs=1e-5
        )


@pytest.mark.slow  # many reads, exact and top-2
async def test_small_top_k_applies_the_floor_and_says_so(local_engine):
    exact = Reader(local_engine)
    top2 = Reader(local_engine.with_top_k(2))
    seen_missing = 0
    for question in QUESTIONS:
        for state in STATES:
            truth = await exact.read(question, state)
            read = (await top2.read(question, state)).label_probabilities
            top = local_engine.next_token_logprobs(reading_prompt(top2, question, state)).topk(2)
            returned_ids = set(top.indices.tolist())
            expected_returned = tuple(label in returned_ids for label in truth.label_ids)
            assert read.returned == expected_returned
            assert read.labels_returned == sum(expected_returned)
            if all(expected_returned):
                assert read.probabilities == pytest.approx(truth.label_probabilities.probabilities, abs=1e-5)
                continue
            seen_missing += 1
            assert not read.exact and read.floor_used
            assert read.floor == pytest.approx(
                float(top.values.min()) - 5.0, abs=1e-4
            )  # batched with a cached prefix: rounding
            for p, (lo, hi) in zip(truth.label_probabilities.probabilities, read.bounds):
                assert lo - 1e-9 <= p <= hi + 1e-9
            if not read.informative:
                assert read.bounds == ((0.0, 1.0),) * len(read.bounds)
    assert seen_missing > 0, "top-2 should miss some labels on these prompts"


async def test_features_are_the_final_hidden_state_at_the_answer_slot(local_engine):
    """A reading's features are the decoder's last hidden state (after the final norm) at the answer
    slot, as a direct forward computes it, for one-token labels and for a trie (its first read); the
    head applied to them gives the read's label probabilities."""
    assert local_engine.capabilities.features
    trie_question = QuestionSpec("choice", "Which desk?", ("red 1", "red 2", "blue 1"), (None,) * 3)
    for styles, question in (
        ((LabelStyle.WORDS, LabelStyle.CODES), QUESTIONS[1]),
        ((LabelStyle.TRIE,), trie_question),
    ):
        reader = Reader(local_engine, label_styles=styles)
        reading = await reader.read(question, STATES[0])
        prompt = torch.tensor([reading_prompt(reader, question, STATES[0])])
        with torch.inference_mode():
            expected = local_engine.model.model(input_ids=prompt).last_hidden_state[0, -1].double().tolist()
        assert reading.features is not None and len(reading.features) == local_engine.model.config.hidden_size
        assert reading.features == pytest.approx(expected, abs=1e-3)
        if styles[0] is LabelStyle.WORDS:
            with torch.inference_mode():
                logits = local_engine.model.lm_head(torch.tensor([reading.features]))[0]
            logprobs = torch.log_softmax(logits.double(), -1)
            from_features = softmax([float(logprobs[i]) for i in reading.label_ids])
            assert reading.label_probabilities.probabilities == pytest.approx(from_features, abs=1e-4)
