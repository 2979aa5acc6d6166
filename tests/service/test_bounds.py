"""Bounded work per request on the real app: the deadline (504), name limits (422), admission on
/v1/calibrations (413), 529 before any work, the queue bounded by its expected wait, and what a
request is priced at against the reads it actually schedules."""

from __future__ import annotations

import asyncio

import pytest

from calibration.open import open_store
from readers.engines.base import ReadMode
from readers.reader import Reader
from service.admission import Admission, AdmissionLimits, CostRate
from service.errors import Overloaded
from service.pricing import MAX_OPTION_NAME_TOKENS
from service.protocol.questions import MAX_OPTION_NAME_CHARS, MAX_QUESTION_NAME_CHARS
from tests.readers.support import distinct_tokens
from tests.service.support import favour_first, function_engine, price, stalled_engine

pytestmark = pytest.mark.anyio


def one_question(state: str = "The sky is blue.") -> dict:
    return {"state": state, "questions": {"q": {"type": "noul", "instructions": "Is it?"}}}


def choice(options: list[str], state: str = "A fruit bowl.") -> dict:
    return {
        "state": state,
        "questions": {"q": {"type": "choice", "instructions": "Which?", "criteria": dict.fromkeys(options)}},
    }


async def test_a_request_past_the_deadline_gets_504_and_its_read_is_stopped(client_factory, local_engine):
    cancelled: list[str] = []
    # 2 s: enough for the request to reach its read on a loaded two-core runner (at 0.5 s the deadline
    # once passed while the prompt was still being built, and there was no read to stop).
    limits = AdmissionLimits(deadline_s=2.0)
    async with client_factory(stalled_engine(local_engine, cancelled), admission=limits) as client:
        response = await client.post("/v1/systemone", json=one_question())
        await asyncio.sleep(0.05)
        # The queue is empty again: the stopped request holds no admission.
        app_admission = client._transport.app.state.admission  # the app under test
        assert app_admission.in_flight == 0 and app_admission.queued == 0
    assert response.status_code == 504
    detail = response.json()["detail"]
    assert detail["error_type"] == "deadline_exceeded" and "2 s deadline" in detail["message"]
    assert detail["param"] == "deadline"
    # The read had started and was stopped by the deadline (no wall-clock bound: a loaded machine
    # only makes the wait longer, which the message and the cancelled read already pin down).
    assert cancelled == ["read"]


async def test_a_deadline_counts_the_wait_in_the_queue(client_factory, local_engine):
    """Requests queued behind a stalled one are stopped at their deadline while still queued, not held
    for ever, and leave nothing held or queued."""
    started, release = asyncio.Event(), asyncio.Event()
    cancelled: list[str] = []

    async def held(request):
        # The first read stalls; stopped at its deadline, it keeps its admission until the test lets it
        # go (as a forward pass already running on the embedded engine does), so nothing queued behind
        # it can be admitted while the queued requests' deadlines pass.
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append("read")
            await release.wait()
            raise

    limits = AdmissionLimits(in_flight_cost=1, deadline_s=2.0)  # time to reach the read on a loaded runner
    async with client_factory(
        function_engine(local_engine, held, ReadMode.EXACT), admission=limits
    ) as client:
        first = asyncio.ensure_future(client.post("/v1/systemone", json=one_question("state 0")))
        await asyncio.wait_for(started.wait(), timeout=60)  # a failure, not a hang, if it never reads
        # Two more, queued behind the first: had their deadlines started only at admission, they would
        # wait for ever (the slot is never freed while they wait); counted from arrival, both end.
        # (The bound only turns a hang into a failure; the deadline is 2 s.)
        queued = await asyncio.wait_for(
            asyncio.gather(*(client.post("/v1/systemone", json=one_question(f"state {i}")) for i in (1, 2))),
            timeout=120,
        )
        release.set()
        responses = [await first, *queued]
        admission = client._transport.app.state.admission
        assert admission.in_flight == 0 and admission.queued == 0
    assert [r.status_code for r in responses] == [504] * 3
    assert {r.json()["detail"]["error_type"] for r in responses} == {"deadline_exceeded"}
    assert cancelled == ["read"]  # only the first ever reached the engine


@pytest.mark.parametrize(
    ("body", "loc_end", "message"),
    [
        (choice(["A" * (MAX_OPTION_NAME_CHARS + 1), "B"]), ["criteria"], "characters"),
        (choice([" ".join(["word"] * (MAX_OPTION_NAME_TOKENS + 4)), "B"]), None, "tokens"),
        (
            {**one_question(), "questions": {"": {"type": "noul", "instructions": "?"}}},
            ["questions"],
            "empty",
        ),
        (
            {
                **one_question(),
                "questions": {"q" * (MAX_QUESTION_NAME_CHARS + 1): {"type": "noul", "instructions": "?"}},
            },
            ["questions"],
            "characters",
        ),
    ],
    ids=["option-chars", "option-tokens", "empty-question-name", "long-question-name"],
)
async def test_names_over_their_bounds_are_refused_up_front(
    client_factory, local_engine, body, loc_end, message
):
    reads: list[int] = []

    def counting(request):
        reads.append(1)
        return favour_first(request)

    async with client_factory(function_engine(local_engine, counting, ReadMode.EXACT)) as client:
        response = await client.post("/v1/systemone", json=body)
    assert response.status_code == 422, response.text
    (item,) = response.json()["detail"]
    assert message in item["msg"] and reads == []
    if loc_end is not None:
        assert item["loc"][-len(loc_end) :] == loc_end
    else:  # the option named in loc: body.questions.q.choice.criteria.<option>
        assert item["loc"][:5] == ["body", "questions", "q", "choice", "criteria"]
        assert item["type"] == "option_name_too_long"


async def test_calibration_examples_are_admitted_like_a_batch(client_factory, quick_engine, tmp_path):
    """An example set over --max-request-cost is refused with 413, as the same reads on /decide/batch."""
    states = [f"case {i}: " + "word " * 200 for i in range(20)]  # distinct: the same state costs once
    question = {"type": "choice", "instructions": "Which?", "criteria": {"red": None, "blue": None}}
    examples = [{"state": state, "questions": {"q": question}, "gold": {"q": "red"}} for state in states]
    limits = AdmissionLimits(request_cost=2_000)
    async with client_factory(
        quick_engine, store=open_store(tmp_path / "c.sqlite3"), admission=limits
    ) as client:
        fit = await client.post("/v1/calibrations", json={"examples": examples})
        batch = await client.post("/decide/batch", json={"states": states, "questions": {"q": question}})
        small = await client.post("/v1/calibrations", json={"examples": examples[:2]})
    assert fit.status_code == 413 and batch.status_code == 413
    assert fit.json()["detail"]["error_type"] == "request_too_large"
    assert "at most 2000" in fit.json()["detail"]["message"]
    # Admitted and read: two examples are too few to fit (422 naming why), not too costly.
    assert small.status_code == 422 and "request_too_large" not in small.text


async def test_529_comes_before_any_pricing_when_the_queue_is_full(client_factory, local_engine, monkeypatch):
    gate = asyncio.Event()

    async def blocked(request):
        await gate.wait()
        return favour_first(request)

    queued_body = one_question("other")
    cost = price(Reader(local_engine), queued_body)
    limits = AdmissionLimits(in_flight_cost=1, queued_cost=cost, retry_after_s=3)
    async with client_factory(
        function_engine(local_engine, blocked, ReadMode.EXACT), admission=limits
    ) as client:
        running = asyncio.create_task(client.post("/v1/systemone", json=one_question()))
        await asyncio.sleep(0.3)
        queued = asyncio.create_task(client.post("/v1/systemone", json=queued_body))
        await asyncio.sleep(0.3)
        priced: list[int] = []
        import service.pricing as pricing

        real = pricing.distinct_tokens
        monkeypatch.setattr(pricing, "distinct_tokens", lambda *a: priced.append(1) or real(*a))
        refused = await client.post("/v1/systemone", json=one_question("third"))
        # Refused while the first two still wait on the gate: no work was done for it.
        assert not running.done() and not queued.done()
        gate.set()
        done = await asyncio.gather(running, queued)
    assert [r.status_code for r in done] == [200, 200]
    assert refused.status_code == 529 and refused.headers["retry-after"] == "3"
    assert priced == []


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_the_queue_is_bounded_by_its_expected_wait_at_the_measured_rate():
    """100 tokens/s measured: a queue whose work would start after more than max_wait_s is refused,
    though its cost bound has room."""
    clock = FakeClock()
    admission = Admission(AdmissionLimits(in_flight_cost=100, queued_cost=10_000, max_wait_s=1.5))
    admission.rate = CostRate(clock=clock, min_tokens=1)
    assert admission.expected_wait_s() is None  # cold: bounded by size only
    for _ in range(3):  # three requests of 100 tokens, one second each
        async with admission.admit(100):
            clock.now += 1.0
    assert admission.rate.tokens_per_s == pytest.approx(100, rel=0.05)

    async def hold(cost: int, release: asyncio.Event) -> None:
        async with admission.admit(cost):
            await release.wait()

    release = asyncio.Event()
    running = asyncio.create_task(hold(100, release))
    await asyncio.sleep(0)
    waiting = asyncio.create_task(hold(100, release))  # expected start: 100 in flight / 100 = 1 s
    await asyncio.sleep(0)
    assert admission.queued == 100
    with pytest.raises(Overloaded) as refused:  # would start after (100 + 100) / 100 = 2 s > 1.5 s
        async with admission.admit(100):
            pass
    assert "expected wait 2.0 s (at most 1.5 s)" in refused.value.message
    with pytest.raises(Overloaded):  # its own cost is not its wait: refused before it is even priced
        admission.refuse_if_full("default")
    release.set()
    await asyncio.gather(running, waiting)
    assert admission.in_flight == 0 and admission.queued == 0


async def test_the_price_covers_every_read_scheduled_prior_reads_included(client_factory, local_engine):
    """The probe: multi-token option names cost one read per trie depth, times four the first time a
    question is seen (its content-free prior reads), while admission counted the names once. Every
    prompt the engine is sent is recorded here; the price is the distinct tokens they hold."""
    prompts: list[tuple[int, ...]] = []

    def recording(request):
        prompts.append(request.prompt_ids)
        return favour_first(request)

    options = ["a ripe yellow banana", "a crisp green apple", "an orange tangerine"]
    body = choice(options, state="word " * 50)
    async with client_factory(function_engine(local_engine, recording, ReadMode.EXACT)) as client:
        app = client._transport.app
        priced: list[int] = []
        real_admit = app.state.admission.admit

        def admit(cost, *share):
            priced.append(cost)
            return real_admit(cost, *share)

        app.state.admission.admit = admit
        first = await client.post("/v1/systemone", json=body)
        first_prompts, prompts[:] = list(prompts), []
        second = await client.post("/v1/systemone", json=body)
    assert first.status_code == 200 and second.status_code == 200
    scheduled_first = distinct_tokens(first_prompts)
    scheduled_second = distinct_tokens(prompts)
    assert len(first_prompts) > 4 * len(prompts) // 2  # the prior reads on first sight
    # Priced as the engine counts: each distinct token of the prompts it is sent, exactly.
    assert priced == [scheduled_first, scheduled_second]
    assert priced[1] < priced[0]  # the prior, once measured, costs nothing more


async def test_a_prior_measurement_stops_when_its_last_caller_leaves(client_factory, local_engine):
    """The question's own reads answer; its content-free prior reads (first sight of a choice
    question) never do. Past the deadline the request gets 504, and the prior reads, priced in its
    admission, must stop with it rather than run on outside admission."""
    tokenizer = local_engine.tokenizer
    prior_reads: list[str] = []

    async def fn(request):
        if "Zebra" in tokenizer.decode(request.prompt_ids):  # the caller's state: answered
            return favour_first(request)
        prior_reads.append("started")  # a content-free state: never answers
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            prior_reads.append("cancelled")
            raise

    limits = AdmissionLimits(deadline_s=2.0)  # time for the prior reads to start on a loaded runner
    engine = function_engine(local_engine, fn, ReadMode.EXACT)
    async with client_factory(engine, admission=limits) as client:
        response = await client.post("/v1/systemone", json=choice(["red", "blue"], state="Zebra crossing."))
        await asyncio.sleep(0.1)
        priors = client._transport.app.state.priors
        pending = priors.measuring()
    assert response.status_code == 504
    started = prior_reads.count("started")
    assert started >= 1 and prior_reads.count("cancelled") == started and pending == 0


async def test_an_abandoned_embedded_read_stops_between_chunks(local_engine, monkeypatch):
    """The real embedded engine in chunks of 16 tokens: a 400-token read whose caller is cancelled
    (its deadline passed, its client left) after the first chunks stops at the next chunk instead of
    computing all 25; the engine reads exactly afterwards (the token tree left as if it never ran)."""
    from readers.engines.base import ReadRequest

    chunks: list[int] = []
    forward = local_engine._forward

    def counting(chunk, past):
        chunks.append(1)
        return forward(chunk, past)

    # The session's engine, computing in small chunks for this test (restored after).
    monkeypatch.setattr(local_engine, "chunk_tokens", 16)
    monkeypatch.setattr(local_engine, "_forward", counting)
    stopped = local_engine.stopped_batches
    long = tuple(range(10, 410))
    read = asyncio.ensure_future(local_engine.read(ReadRequest(long, (4,), ("x",), keep=False)))
    while len(chunks) < 2:
        await asyncio.sleep(0.002)
    read.cancel()
    with pytest.raises(asyncio.CancelledError):
        await read
    while local_engine._in_flight:
        await asyncio.sleep(0.01)
    assert len(chunks) < 10 and local_engine.stopped_batches == stopped + 1, len(chunks)
    reply = await local_engine.read(ReadRequest(long[:40], (4,), ("x",), keep=False))
    truth = float(local_engine.next_token_logprobs(long[:40])[4])
    assert reply.logprobs[4] == pytest.approx(truth, abs=1e-4)
