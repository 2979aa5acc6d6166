"""Reads spread over several vLLM engines serving one model: prefix affinity, bounded spill, ejection.

    RoutedEngine.connect(["http://a:8000", "http://b:8000"])     a fixed list of engines
    RoutedEngine.connect_name("http://vllm-engine-headless:8000") every address of a DNS name (a headless
                                                                  Service), re-resolved every ``refresh_s``

Where a read goes (``routing="affinity"``, the default):

1. Its **key** hashes the prompt ids every read of the same state shares: the first
   ``ReadRequest.prefix_tokens`` ids (system prompt and state, which the reader puts before each
   question), or, when the reader gives none (0), the first ``FALLBACK_PREFIX_TOKENS`` ids. A request's
   questions, and a state asked again, have one key, so they go where that prefix's KV already is.
2. The key orders the engines by rendezvous hashing (highest ``hash(key, engine id)`` first). Every
   service replica computes the same order without talking to the others, and adding an engine to N
   moves only the keys the new engine now wins, about 1/(N+1) of them.
3. The read goes to the first engine in that order with fewer than ``spill_after`` reads in flight
   more than the least-loaded engine: an overloaded favourite spills to the key's next choice, and
   only as far as it must (bounded spill). A read with no key (an empty prompt) goes to the
   least-loaded engine, the tie-break when affinity has no preference.

``routing="round_robin"`` sends each read to the next engine in turn; it exists to measure affinity
against (``bench/routing.py``).

A read that ends in ``EngineUnavailable`` or ``EngineTimeout`` ejects its engine and is retried once
on the next choice (a read is one greedy token: repeating it is harmless). An ejected engine gets no
reads; after a back-off (``eject_s``: 1 s, doubling per consecutive ejection up to 30 s)
a probe ``GET /v1/models`` readmits it if it still serves the same model. The address list is
refreshed every ``refresh_s``: new addresses are connected (and must serve the same model and revision
under the same served name, in the routed read mode), vanished ones get no new reads and are closed once their reads finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import math
import socket
import time
from array import array
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx

from readers.engines.base import Capabilities, ClosingEngine, EngineReply, ModelInfo, ReadMode, ReadRequest
from readers.engines.vllm import DEFAULT_MAX_IN_FLIGHT, DEFAULT_TIMEOUT_S, VLLMEngine
from readers.errors import EngineError, EngineTimeout, EngineUnavailable

logger = logging.getLogger("opendecide.routing")

Routing = Literal["affinity", "round_robin"]
ROUTINGS: tuple[Routing, ...] = ("affinity", "round_robin")
NAME_SCHEME = "dns+"
"""``--engine-url dns+http://NAME:PORT``: route over every address NAME resolves to."""
FALLBACK_PREFIX_TOKENS = 128
"""Key length when a read names no shared prefix: short enough to stay inside the system prompt and
state of most requests (so their questions share a key), and one vLLM-CPU KV block (128 tokens), the
unit its prefix cache reuses."""
DEFAULT_REFRESH_S = 10.0
EJECT_FIRST_S = 1.0
EJECT_MAX_S = 30.0
PROBE_TIMEOUT_S = 5.0
RETRIED_ERRORS = (EngineUnavailable, EngineTimeout)

Addresses = Callable[[], Awaitable[list[str]]]
Resolver = Callable[[str, int], list[str]]


class RoutingObserver(Protocol):
    """Receives per-engine events (the service's metrics); ``engine`` is the engine's ``host:port``."""

    def read_started(self, engine: str) -> None: ...

    def read_ended(self, engine: str, error_type: str | None) -> None: ...

    def ejected(self, engine: str) -> None: ...


@dataclass(eq=False)
class Member:
    """One engine behind the router and what the router knows of it."""

    url: str
    engine: VLLMEngine
    in_flight: int = 0
    reads: int = 0
    errors: Counter = field(default_factory=Counter)
    ejections: int = 0
    consecutive_ejections: int = 0
    ejected_until: float | None = None  # monotonic time of the next probe; None while serving
    retired: bool = False
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.id = urlsplit(self.url).netloc
        self.idle.set()

    @property
    def serving(self) -> bool:
        return self.ejected_until is None and not self.retired

    def stats(self) -> dict[str, Any]:
        state = "retired" if self.retired else "ejected" if self.ejected_until is not None else "serving"
        return {"url": self.url, "state": state, "in_flight": self.in_flight, "reads": self.reads,
                "errors": dict(self.errors), "ejections": self.ejections}  # fmt: skip


def prefix_key(request: ReadRequest) -> bytes | None:
    """The affinity key of a read: a hash of its shared prefix ids (see the module docstring)."""
    shared = request.prefix_tokens or FALLBACK_PREFIX_TOKENS
    head = request.prompt_ids[:shared]
    if not head:
        return None
    return hashlib.blake2b(array("q", head).tobytes(), digest_size=16).digest()


def rendezvous_order(key: bytes, ids: Sequence[str]) -> list[str]:
    """``ids`` best first for ``key``: highest ``blake2b(key, id)`` wins, the same on every replica."""

    def score(engine_id: str) -> bytes:
        return hashlib.blake2b(key + engine_id.encode(), digest_size=8).digest()

    return sorted(ids, key=score, reverse=True)


def parse_engine_urls(spec: str) -> tuple[list[str], bool]:
    """``--engine-url`` → (base URLs, whether they name a DNS name to resolve).

    ``http://a:8000`` one engine; ``http://a:8000,http://b:8000`` several; ``dns+http://NAME:8000``
    every address of NAME. Raises ValueError naming what is wrong.
    """
    parts = [part.strip() for part in spec.split(",")]
    if not all(parts):
        raise ValueError(f"--engine-url {spec!r} has an empty entry")
    by_name = [part.startswith(NAME_SCHEME) for part in parts]
    if any(by_name) and len(parts) > 1:
        raise ValueError(f"--engine-url {spec!r}: a {NAME_SCHEME} name stands alone, not in a list")
    urls = [part.removeprefix(NAME_SCHEME).rstrip("/") for part in parts]
    for url in urls:
        split = urlsplit(url)
        if split.scheme not in ("http", "https") or not split.hostname:
            raise ValueError(f"--engine-url entry {url!r} is not an http(s)://HOST[:PORT] URL")
    if len(set(urls)) < len(urls):
        raise ValueError(f"--engine-url {spec!r} names an engine twice")
    return urls, any(by_name)


def resolve_addresses(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, sorted (``socket.getaddrinfo``; a headless Service's pods)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({info[4][0] for info in infos})


def name_addresses(url: str, resolve: Resolver = resolve_addresses) -> Addresses:
    """An address source: ``url`` with its host replaced by each address the host resolves to."""
    split = urlsplit(url)
    port = split.port or (443 if split.scheme == "https" else 80)

    async def addresses() -> list[str]:
        try:
            found = await asyncio.to_thread(resolve, split.hostname, port)
        except OSError as error:
            raise EngineUnavailable(f"cannot resolve {split.hostname}: {error}") from None
        hosts = (f"[{address}]" if ":" in address else address for address in found)
        return [urlunsplit((split.scheme, f"{host}:{port}", split.path, "", "")) for host in hosts]

    return addresses


def fixed_addresses(urls: Sequence[str]) -> Addresses:
    listed = [url.rstrip("/") for url in urls]

    async def addresses() -> list[str]:
        return list(listed)

    return addresses


def common_capabilities(engines: Sequence[VLLMEngine], read_mode: ReadMode | None) -> Capabilities:
    """The best read mode every engine supports (or ``read_mode``, if all do), at the smallest top-k."""
    supports = {
        mode: all(engine.capabilities.probe["supports"][mode.value] for engine in engines)
        for mode in ReadMode
    }
    if read_mode is not None and not supports[read_mode]:
        raise EngineError(
            f"not every engine supports {read_mode.value} reads: {[e.capabilities.probe['supports'] for e in engines]}"
        )
    mode = read_mode or next(mode for mode in ReadMode if supports[mode])
    return Capabilities(
        read_mode=mode,
        max_logprobs=min(engine.capabilities.max_logprobs for engine in engines),
        top_k=min(engine.capabilities.top_k for engine in engines),
        probe={"supports": {mode.value: ok for mode, ok in supports.items()}, "engines": {}},
    )


class RoutedEngine(ClosingEngine):
    """One engine to the reader, several vLLM engines behind it (see the module docstring)."""

    kind = "vllm"

    def __init__(
        self,
        members: Sequence[Member],
        *,
        addresses: Addresses,
        connect_one: Callable[[str], Awaitable[VLLMEngine]],
        capabilities: Capabilities,
        routing: Routing = "affinity",
        spill_after: int = DEFAULT_MAX_IN_FLIGHT,
        refresh_s: float = DEFAULT_REFRESH_S,
        eject_s: tuple[float, float] = (EJECT_FIRST_S, EJECT_MAX_S),
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, not {routing!r}")
        if spill_after < 1:
            raise ValueError("spill_after must be at least 1")
        first = members[0].engine
        self._identity = _identity(first)
        self.info: ModelInfo = first.info
        self.tokenizer = first.tokenizer
        self.capabilities = capabilities
        self.routing = routing
        self.spill_after = spill_after
        self.observers: list[RoutingObserver] = []
        self._members: dict[str, Member] = {}
        self._addresses = addresses
        self._connect_one = connect_one
        self._refresh_s = refresh_s
        self._eject_first_s, self._eject_max_s = eject_s
        self._probes = httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, transport=transport)
        self._turn = 0
        self._tasks: set[asyncio.Task] = set()
        self._retiring: set[Member] = set()
        self._closed = False
        for member in members:
            self._admit(member)
        self._spawn(self._refresh_loop())

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    async def connect(cls, urls: Sequence[str], **options: Any) -> RoutedEngine:
        """Route over a fixed list of engine URLs (at least one must answer now; the rest join later)."""
        if not urls:
            raise ValueError("route over at least one engine URL")
        return await cls.open(fixed_addresses(urls), **options)

    @classmethod
    async def connect_name(
        cls, url: str, *, resolve: Resolver = resolve_addresses, **options: Any
    ) -> RoutedEngine:
        """Route over every address of ``url``'s host name, re-resolved every ``refresh_s``."""
        return await cls.open(name_addresses(url, resolve), **options)

    @classmethod
    async def open(
        cls,
        addresses: Addresses,
        *,
        routing: Routing = "affinity",
        top_k: int = 32,
        tokenizer: str | None = None,
        read_mode: ReadMode | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        spill_after: int | None = None,
        refresh_s: float = DEFAULT_REFRESH_S,
        eject_s: tuple[float, float] = (EJECT_FIRST_S, EJECT_MAX_S),
        transport: httpx.AsyncBaseTransport | None = None,
        share_prefix: bool = True,
        prefill_first: bool = False,
    ) -> RoutedEngine:
        """Connect every address that answers; all must serve one model (served name, model, revision).

        The read mode is ``read_mode`` or the best one every engine supports; an engine that joins
        later must support it too.
        """

        async def connect_one(url: str) -> VLLMEngine:
            # Each engine probes on its own (its best mode); the router then sets the common one.
            return await VLLMEngine.connect(
                url, top_k=top_k, tokenizer=tokenizer, timeout_s=timeout_s, max_in_flight=max_in_flight, transport=transport,
                share_prefix=share_prefix, prefill_first=prefill_first,
            )  # fmt: skip

        urls = await addresses()
        if not urls:
            raise EngineUnavailable("no engine address to route over (the name resolves to none yet)")
        outcomes = await asyncio.gather(*(connect_one(url) for url in urls), return_exceptions=True)
        engines = {url: outcome for url, outcome in zip(urls, outcomes) if isinstance(outcome, VLLMEngine)}
        failures = {
            url: outcome for url, outcome in zip(urls, outcomes) if isinstance(outcome, BaseException)
        }
        try:
            for url, failure in failures.items():
                if not isinstance(failure, EngineError):
                    raise failure
                logger.warning("engine %s not connected (%s); retried every %.0f s", url, failure, refresh_s)
            if not engines:
                raise EngineUnavailable(
                    f"no engine answered: {'; '.join(f'{u}: {f}' for u, f in failures.items())}"
                )
            first_url, first = next(iter(engines.items()))
            for url, engine in engines.items():
                if _identity(engine) != _identity(first):
                    raise EngineError(
                        f"engines serve different models: {first_url} {_identity(first)}, {url} {_identity(engine)}"
                    )
            capabilities = common_capabilities(list(engines.values()), read_mode)
            capabilities.probe["engines"] = {
                url: engine.capabilities.probe for url, engine in engines.items()
            }
        except BaseException:
            await asyncio.gather(*(engine.aclose() for engine in engines.values()))
            raise
        for engine in engines.values():
            _set_capabilities(engine, capabilities)
        return cls(
            [Member(url, engine) for url, engine in engines.items()],
            addresses=addresses,
            connect_one=connect_one,
            capabilities=capabilities,
            routing=routing,
            spill_after=spill_after or max_in_flight,
            refresh_s=refresh_s,
            eject_s=eject_s,
            transport=transport,
        )

    # -- reading ---------------------------------------------------------------------------

    async def read(self, request: ReadRequest) -> EngineReply:
        return await self._read_on(self.choose(request), request)

    async def read_many(self, requests: Sequence[ReadRequest]) -> list[EngineReply]:
        """The reads of one request: under affinity all on the engine their shared prefix chooses."""
        if self.routing == "round_robin" or not requests:
            return list(await asyncio.gather(*(self.read(request) for request in requests)))
        member = self.choose(requests[0])
        return list(await asyncio.gather(*(self._read_on(member, request) for request in requests)))

    def choose(self, request: ReadRequest, *, excluding: frozenset[str] = frozenset()) -> Member:
        """The engine a read goes to now (see the module docstring); EngineUnavailable if none serves."""
        serving = [m for m in self._members.values() if m.serving and m.id not in excluding]
        if not serving:
            waits = [
                m.ejected_until - time.monotonic()
                for m in self._members.values()
                if m.ejected_until is not None
            ]
            raise EngineUnavailable(
                f"no engine is serving ({len(self._members)} known, all ejected or excluded)",
                retry_after_s=max(1, math.ceil(min(waits, default=self._eject_first_s))),
            )
        if self.routing == "round_robin":
            serving.sort(key=lambda m: m.id)
            self._turn += 1
            return serving[self._turn % len(serving)]
        least = min(m.in_flight for m in serving)
        key = prefix_key(request)
        if key is None:
            return min(serving, key=lambda m: m.in_flight)
        by_id = {m.id: m for m in serving}
        for engine_id in rendezvous_order(key, list(by_id)):
            if by_id[engine_id].in_flight - least < self.spill_after:
                return by_id[engine_id]
        raise AssertionError("unreachable: the least-loaded engine is within the spill bound")

    async def _read_on(self, member: Member, request: ReadRequest) -> EngineReply:
        try:
            return await self._attempt(member, request)
        except RETRIED_ERRORS as error:
            try:
                other = self.choose(request, excluding=frozenset({member.id}))
            except EngineUnavailable:
                raise error from None
            return await self._attempt(other, request)

    async def _attempt(self, member: Member, request: ReadRequest) -> EngineReply:
        """One read on one engine, counted; a retried error ejects the engine."""
        member.in_flight += 1
        member.idle.clear()
        for observer in self.observers:
            observer.read_started(member.id)
        error_type = None
        try:
            reply = await member.engine.read(request)
            member.consecutive_ejections = 0
            return reply
        except EngineError as error:
            error_type = error.error_type
            member.errors[error_type] += 1
            if isinstance(error, RETRIED_ERRORS):
                self._eject(member, error)
            raise
        finally:
            member.in_flight -= 1
            member.reads += 1
            if member.in_flight == 0:
                member.idle.set()
            for observer in self.observers:
                observer.read_ended(member.id, error_type)

    # -- ejection and probing --------------------------------------------------------------

    def _eject(self, member: Member, error: EngineError) -> None:
        if member.ejected_until is not None or member.retired:
            return  # concurrent failures of one engine eject it once
        member.consecutive_ejections += 1
        member.ejections += 1
        wait = min(self._eject_first_s * 2 ** (member.consecutive_ejections - 1), self._eject_max_s)
        member.ejected_until = time.monotonic() + wait
        logger.warning("engine %s ejected for %.0f s: %s", member.id, wait, error.message)
        for observer in self.observers:
            observer.ejected(member.id)
        self._spawn(self._probe_back(member, wait))

    async def _probe_back(self, member: Member, wait: float) -> None:
        while not member.retired:
            await asyncio.sleep(wait)
            if await self._answers(member):
                member.ejected_until = None
                logger.info("engine %s readmitted after a probe", member.id)
                return
            wait = min(wait * 2, self._eject_max_s)
            member.ejected_until = time.monotonic() + wait

    async def _answers(self, member: Member) -> bool:
        """``GET /v1/models`` answers 200 and still lists the model this engine served."""
        try:
            response = await self._probes.get(f"{member.url}/v1/models")
            listed = [model.get("id") for model in response.json().get("data", [])]
        except (httpx.HTTPError, ValueError, AttributeError):
            return False
        return response.status_code == 200 and member.engine.served_name in listed

    # -- membership ------------------------------------------------------------------------

    def _admit(self, member: Member) -> None:
        self._members[member.id] = member
        logger.info("routing reads to %s (%d engines)", member.id, len(self._members))

    async def refresh(self) -> None:
        """Connect new addresses and retire vanished ones (called every ``refresh_s``)."""
        urls = await self._addresses()
        wanted = {urlsplit(url).netloc: url for url in urls}
        for engine_id, member in list(self._members.items()):
            if engine_id not in wanted:
                del self._members[engine_id]
                member.retired = True
                self._retiring.add(member)
                logger.info(
                    "engine %s no longer listed: retired after its %d reads in flight",
                    engine_id,
                    member.in_flight,
                )
                self._spawn(self._close_when_idle(member))
        new = [url for engine_id, url in wanted.items() if engine_id not in self._members]
        for url, outcome in zip(
            new, await asyncio.gather(*(self._join(url) for url in new), return_exceptions=True)
        ):
            if isinstance(outcome, Member) and not self._closed:
                self._admit(outcome)
            elif isinstance(outcome, Member):
                await outcome.engine.aclose()
            elif isinstance(outcome, BaseException):
                logger.warning("engine %s not added: %s", url, getattr(outcome, "message", outcome))

    async def _join(self, url: str) -> Member:
        engine = await self._connect_one(url)
        try:
            if _identity(engine) != self._identity:
                raise EngineError(f"serves {_identity(engine)}, not {self._identity}")
            if not engine.capabilities.probe["supports"][self.capabilities.read_mode.value]:
                raise EngineError(f"does not support {self.capabilities.read_mode.value} reads")
        except BaseException:
            await engine.aclose()
            raise
        _set_capabilities(engine, self.capabilities)
        return Member(url, engine)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            try:
                await self.refresh()
            except EngineError as error:  # a failed lookup keeps the engines already known
                logger.warning("engine list not refreshed: %s", error.message)

    async def _close_when_idle(self, member: Member) -> None:
        await member.idle.wait()
        self._retiring.discard(member)
        await member.engine.aclose()

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- reporting and closing -------------------------------------------------------------

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per engine (``host:port``): state, reads in flight, reads, errors by type, ejections."""
        return {engine_id: member.stats() for engine_id, member in sorted(self._members.items())}

    async def aclose(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        members, self._members = [*self._members.values(), *self._retiring], {}
        self._retiring = set()
        await asyncio.gather(*(member.engine.aclose() for member in members))
        await self._probes.aclose()


def _identity(engine: VLLMEngine) -> str:
    """What must match across engines: the served model name, the model and its revision."""
    return f"{engine.served_name} ({engine.info.name}@{engine.info.revision})"


def _set_capabilities(engine: VLLMEngine, capabilities: Capabilities) -> None:
    """Make a member read in the routed mode and top-k; its own probe evidence is kept."""
    engine.capabilities = dataclasses.replace(
        capabilities, probe=engine.capabilities.probe, max_logprobs=engine.capabilities.max_logprobs
    )
