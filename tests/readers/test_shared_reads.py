"""One state, many questions: batched, cached and padded reads of the embedded model against the
single-sequence log-softmax, and readings that do not depend on the other questions of a request."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import torch

from readers.engines.base import EngineReply, ReadRequest
from readers.engines.function import FunctionEngine
from readers.engines.local import PrefixCache
from readers.prompt import QuestionSpec
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


@pytest.mark.slow  # every request read batched, cached, padded and alone
def test_batched_cached_and_padded_reads_equal_the_single_sequence(local_engine):
    reader = Reader(local_engine)
    requests = [request for state in STATES for request in requests_for(reader, QUESTIONS, state)]
    prompts = [request.prompt_ids for request in requests]
    prefixes = [request.prefix_tokens for request in requests]
    assert len({len(ids) for ids in prompts}) > 1 and len({n for n in prefixes}) > 1  # padding on both sides
    local_engine.prefix_cache = PrefixCache(local_engine.prefix_cache.max_bytes)
    computed = local_engine.batch_logprobs(prompts, prefixes)  # prefixes computed in this batch
    assert local_engine.prefix_cache.stats()["misses"] == len(STATES)
    cached = local_engine.batch_logprobs(prompts, prefixes)  # every prefix from the cache
    assert local_engine.prefix_cache.stats()["hits"] == len(STATES)
    whole = local_engine.batch_logprobs(prompts, [0] * len(prompts))  # the per-question path: padded, no past
    for rows in (computed, cached, whole):
        assert max_gap(rows, prompts, local_engine) < EXACT


@pytest.mark.slow  # full-vocabulary rows at every prefix edge, each checked against a fresh pass
def test_prefix_boundaries_at_the_edges_of_the_prompt(local_engine):
    ids = requests_for(Reader(local_engine), QUESTIONS[:1], STATES[0])[0].prompt_ids
    rows = local_engine.batch_logprobs([ids, ids, ids[:1], ids[:2]], [len(ids), 1, 1, 1])
    assert max_gap(rows, [ids, ids, ids[:1], ids[:2]], local_engine) < EXACT


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


def test_the_prefix_cache_is_bounded_and_evicts_the_least_recently_used():
    layer = (torch.zeros(1, 3, 10, 64), torch.zeros(1, 3, 10, 64))  # 15,360 bytes per entry
    cache = PrefixCache(max_bytes=3 * 15_360)
    for n in range(3):
        cache.put((n,), [layer])
    assert cache.get((0,)) is not None  # 0 is now the most recently used
    cache.put((3,), [layer])
    assert cache.get((1,)) is None and cache.get((0,)) is not None and cache.get((3,)) is not None
    assert cache.stats()["bytes"] == 3 * 15_360 and cache.stats()["entries"] == 3
    cache.put(
        (4,), [(torch.zeros(1, 3, 100, 64), torch.zeros(1, 3, 100, 64))]
    )  # larger than the cap: not kept
    assert cache.get((4,)) is None and cache.stats()["entries"] == 3
    off = PrefixCache(0)
    off.put((0,), [layer])
    assert off.get((0,)) is None
    with pytest.raises(ValueError, match="prefix_cache_mib"):
        PrefixCache(-1)


def test_engine_options_are_checked(embedded_model_dir):
    from readers.engines.base import LocalBatching
    from readers.engines.local import LocalEngine

    for option, value in (("max_batch", 0), ("batch_window_ms", -1), ("prefix_cache_mib", -1)):
        with pytest.raises(ValueError, match=option):
            LocalBatching(**{option: value})
    with pytest.raises(ValueError, match="workers"):
        LocalEngine(embedded_model_dir, workers=0)


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="one thread: every split is the same")
@pytest.mark.slow  # two more engines loaded
async def test_workers_share_the_thread_budget(embedded_model_dir):
    """Default: one batch worker per thread of the budget (at most DEFAULT_MAX_WORKERS), each
    running its forwards on budget // workers threads; a second engine with another split, built
    and used afterwards, does not change the first one's workers."""
    from readers.engines.local import DEFAULT_MAX_WORKERS, LocalEngine, thread_budget

    class ThreadCounting(LocalEngine):
        def batch_logprobs(self, prompts, prefix_tokens):
            self.seen.add(torch.get_num_threads())  # on the worker thread
            return super().batch_logprobs(prompts, prefix_tokens)

    budget = thread_budget()
    split = ThreadCounting(embedded_model_dir)
    whole = ThreadCounting(embedded_model_dir, workers=1)
    try:
        workers = min(budget, DEFAULT_MAX_WORKERS)
        assert len(split._workers) == workers and split.threads == budget // workers
        assert whole.threads == budget and whole.capabilities.probe["threads_per_worker"] == budget
        for engine in (split, whole, split):
            engine.seen = set()
            await asyncio.gather(*(engine.read(ReadRequest((1, 2, 3 + i), (4,), ("x",))) for i in range(4)))
            assert engine.seen == {engine.threads}
    finally:
        await split.aclose()
        await whole.aclose()
