"""One state, many questions: batched, cached and padded reads of the embedded model against the
single-sequence log-softmax, and readings that do not depend on the other questions of a request."""

from __future__ import annotations

import asyncio
import copy
import itertools
import threading

import pytest
import torch

from readers.engines.base import EngineReply, LocalBatching, ReadRequest
from readers.engines.function import FunctionEngine
from readers.engines.kvtree import KVTree
from readers.prompt import QuestionSpec
from readers.reader import Reader
from tests.readers.support import distinct_tokens

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
    "Dull, slow and far too long. The lead actor mumbles through every scene and the plot goes nowhere.",
    "Shares rose 4% after earnings.",
]
EXACT = 1e-4  # float32 batched vs single-sequence: rounding only

pytestmark = pytest.mark.anyio


def requests_for(reader: Reader, questions, state) -> list[ReadRequest]:
    slots = [reader.prepare(question, state)[0] for question in questions]
    return [ReadRequest(slot.prompt_ids, slot.label_ids, slot.labels, slot.prefix_tokens) for slot in slots]


def max_gap(rows, prompts, engine) -> float:
    return max(float((row - engine.next_token_logprobs(ids)).abs().max()) for row, ids in zip(rows, prompts))


@pytest.mark.slow  # every request read computed, from the tree, alone and in small chunks
def test_shared_cached_alone_and_chunked_reads_equal_the_single_sequence(local_engine):
    reader = Reader(local_engine)
    requests = [request for state in STATES for request in requests_for(reader, QUESTIONS, state)]
    prompts = [request.prompt_ids for request in requests]
    engine = copy.copy(local_engine)  # the same model with its own tree
    engine.prefix_cache = KVTree(local_engine.prefix_cache.max_bytes)
    computed = engine.batch_logprobs(prompts)  # every distinct token computed in this batch
    assert engine.prefix_cache.stats()["computed_tokens"] == distinct_tokens(prompts)
    kept = engine.batch_logprobs(prompts)  # every prompt read before: its state from the tree
    stats = engine.prefix_cache.stats()
    assert stats["computed_tokens"] == distinct_tokens(prompts)
    assert stats["reused_tokens"] == 2 * sum(map(len, prompts)) - stats["computed_tokens"]
    # A tree that holds every prompt's tokens but no state where they end: only last tokens read again.
    engine.prefix_cache = KVTree(local_engine.prefix_cache.max_bytes)
    longer = [ids + ids[-1:] for ids in prompts]
    engine.batch_logprobs(longer)
    cached = engine.batch_logprobs(prompts)
    assert engine.prefix_cache.stats()["computed_tokens"] == distinct_tokens(longer) + len(prompts)
    whole = engine.batch_logprobs(prompts, reuse=False)  # the per-question path: each prompt alone
    engine.prefix_cache = KVTree(0)
    engine.chunk_tokens, engine.chunk_scores = 16, 16 * 200  # many chunks, segments cut inside
    chunked = engine.batch_logprobs(prompts[: len(QUESTIONS)])  # one state's questions
    truth = [local_engine.next_token_logprobs(ids) for ids in prompts]
    for rows in (computed, kept, cached, whole, chunked):
        assert max(float((row - true).abs().max()) for row, true in zip(rows, truth)) < EXACT


@pytest.mark.slow  # full-vocabulary rows of prompts that are prefixes of each other
def test_prompts_that_are_prefixes_of_each_other(local_engine):
    ids = requests_for(Reader(local_engine), QUESTIONS[:1], STATES[0])[0].prompt_ids
    prompts = [ids, ids, ids[:1], ids[:2], ids[:-1]]
    rows = local_engine.batch_logprobs(prompts)
    assert max_gap(rows, prompts, local_engine) < EXACT


class Recording:
    """An engine that passes reads on to the local engine and keeps each request and reply."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.kind, self.info, self.capabilities = engine.kind, engine.info, engine.capabilities
        self.tokenizer = engine.tokenizer
        self.seen: list[tuple[ReadRequest, EngineReply]] = []

    async def read_many(self, requests):
        replies = await self.engine.read_many(requests)
        self.seen.extend(zip(requests, replies))
        return replies


@pytest.mark.slow  # a token trie's reads, every level checked against a fresh pass
async def test_trie_reads_compute_each_node_token_once(local_engine):
    """Options read by a token trie: every deeper read adds only its node's tokens, and the request
    computes each distinct token of its prompts once."""
    engine = Recording(local_engine)
    question = QuestionSpec(
        "choice",
        "Which drink would the writer order next?",
        ("espresso", "espresso macchiato", "cappuccino", "caffe latte", "flat white", "americano"),
        (None,) * 6,
    )
    reading = await Reader(engine).read(question, STATES[0] + " Coffee?")
    assert reading.engine_calls == 1 and len(engine.seen) > 1  # every trie level in one call
    prompts = [request.prompt_ids for request, _ in engine.seen]
    # The first read computes what the tree lacks of the prompt; each deeper read, its node's last token.
    assert [reply.computed_tokens for _, reply in engine.seen[1:]] == [1] * (len(prompts) - 1)
    assert sum(reply.computed_tokens for _, reply in engine.seen) <= distinct_tokens(prompts)
    for request, reply in engine.seen:
        assert reply.computed_tokens + reply.cached_tokens == reply.prompt_tokens == len(request.prompt_ids)
        truth = local_engine.next_token_logprobs(request.prompt_ids)
        for token_id, logprob in reply.logprobs.items():
            assert logprob == pytest.approx(float(truth[token_id]), abs=EXACT)


@pytest.mark.slow  # concurrent requests, each checked against reads alone
async def test_concurrent_requests_share_forward_passes_and_stay_exact(local_engine):
    reader = Reader(local_engine)
    jobs = [requests_for(reader, QUESTIONS[: 1 + i % 3], STATES[i % 3] + " " * (i // 3)) for i in range(8)]
    batches, reads = local_engine.batches, local_engine.batched_reads
    replies = await asyncio.gather(*(local_engine.read_many(job) for job in jobs))
    assert local_engine.batched_reads - reads == sum(len(job) for job in jobs)
    assert local_engine.batches - batches < len(jobs)  # concurrent requests were batched together
    for job, job_replies in zip(jobs, replies):
        for request, reply in zip(job, job_replies):
            truth = local_engine.next_token_logprobs(request.prompt_ids)
            assert set(reply.logprobs) == set(request.label_ids)
            for token_id, logprob in reply.logprobs.items():
                assert logprob == pytest.approx(float(truth[token_id]), abs=EXACT)


@pytest.mark.slow  # every question read twice, shared and alone
async def test_the_per_question_path_reads_the_same(local_engine):
    reader = Reader(local_engine)
    per_question = Reader(local_engine.with_share_prefix(False))
    shared = await reader.read_many(QUESTIONS, STATES[1])
    alone = await per_question.read_many(QUESTIONS, STATES[1])
    for a, b in zip(shared, alone):
        assert a.label_probabilities.probabilities == pytest.approx(
            b.label_probabilities.probabilities, abs=EXACT
        )


@pytest.mark.slow  # every question alone, together and reordered, on every state
async def test_readings_do_not_depend_on_the_other_questions_or_their_order(local_engine):
    """Prompt ids exactly, probabilities to float rounding, on the batched engine."""
    seen: list[ReadRequest] = []

    def record(request: ReadRequest) -> EngineReply:
        seen.append(request)
        logprobs = local_engine.next_token_logprobs(request.prompt_ids)
        return EngineReply(
            {i: float(logprobs[i]) for i in request.label_ids},
            local_engine.capabilities.read_mode,
            len(request.prompt_ids),
            0.0,
        )

    recorder = Reader(
        FunctionEngine(
            record,
            tokenizer=local_engine.tokenizer,
            info=local_engine.info,
            capabilities=local_engine.capabilities,
        )
    )
    reader = Reader(local_engine)
    state = STATES[1]
    alone = {}
    for question in QUESTIONS:
        seen.clear()
        alone[question] = (
            (await reader.read(question, state)).label_probabilities.probabilities,
            (await recorder.read(question, state)),
        )
        alone_request = seen[0]
        for others in (
            QUESTIONS,
            QUESTIONS[::-1],
            [q for q in QUESTIONS if q.question_type != question.question_type] + [question],
        ):
            seen.clear()
            await recorder.read_many(others, state)
            assert seen[others.index(question)] == alone_request
    for combination in [*itertools.permutations(QUESTIONS[:3]), QUESTIONS, QUESTIONS[::-1]]:
        readings = await reader.read_many(combination, state)
        for question, reading in zip(combination, readings):
            assert reading.question == question
            assert reading.label_probabilities.probabilities == pytest.approx(alone[question][0], abs=EXACT)


def test_engine_options_are_checked():
    for option, value in (
        ("max_batch", 0),
        ("batch_window_ms", -1),
        ("prefix_cache_mib", -1),
        ("chunk_tokens", 0),
        ("chunk_scores", 1),
    ):
        with pytest.raises(ValueError, match=option):
            LocalBatching(**{option: value})


@pytest.mark.slow  # another engine loaded
async def test_batches_take_turns_on_one_thread_with_every_core(embedded_model_dir):
    """Every chunk runs on the one compute thread on the whole thread budget (module docstring, 4);
    a short read that arrives while a long batch runs is answered at the long one's next chunk,
    before the long one ends, and equals the same read alone."""
    from readers.engines.local import LocalEngine, thread_budget

    class Recording(LocalEngine):
        def _forward(self, chunk, past):
            result = super()._forward(chunk, past)
            self.seen.append((threading.current_thread().name, torch.get_num_threads(), len(chunk.queries)))
            return result

    engine = Recording(
        embedded_model_dir, batching=LocalBatching(max_batch=1, prefix_cache_mib=0, chunk_tokens=32)
    )
    try:
        engine.seen = []
        long = tuple(range(10, 330))  # ten chunks of 32 tokens
        long_read = asyncio.ensure_future(engine.read(ReadRequest(long, (4,), ("x",))))
        while len(engine.seen) < 2:
            await asyncio.sleep(0.002)
        short = await engine.read(ReadRequest((1, 2, 3), (4,), ("x",)))
        assert not long_read.done()
        await long_read
        assert {name for name, _, _ in engine.seen} == {"local-engine"}
        assert {threads for _, threads, _ in engine.seen} == {thread_budget()}
        sizes = [n for _, _, n in engine.seen]
        assert sizes.count(3) == 1 and 2 <= sizes.index(3) < len(sizes) - 1, sizes
        assert short.logprobs[4] == pytest.approx(float(engine.next_token_logprobs((1, 2, 3))[4]), abs=1e-4)
    finally:
        await engine.aclose()


@pytest.mark.slow  # another engine loaded
async def test_a_read_sent_to_a_closed_engine_is_refused(embedded_model_dir):
    """Once closed, nothing would ever take a read: it is refused, not left waiting forever (a
    variant that shares the engine's compute thread included)."""
    from readers.engines.local import EngineClosed, LocalEngine

    engine = LocalEngine(embedded_model_dir, batching=LocalBatching(prefix_cache_mib=0))
    variant = engine.with_top_k(5)
    assert (await variant.read(ReadRequest((1, 2, 3), (4,), ("x",)))).logprobs
    await engine.aclose()
    for closed in (engine, variant):
        with pytest.raises(EngineClosed, match="closed"):
            await asyncio.wait_for(closed.read(ReadRequest((1, 2, 3), (4,), ("x",))), timeout=10)
