"""Reads spread over several vLLM engines serving one model: one engine to the reader.

    RoutedEngine.connect(["http://a:8000", "http://b:8000"])     a fixed list of engines
    RoutedEngine.connect_name("http://vllm-engine-headless:8000") every address of a DNS name (a headless
                                                                  Service), re-resolved every ``refresh_s``

Three parts, one module each: where a read goes (prefix affinity, bounded spill, round-robin) is
:mod:`readers.engines.routing`, pure; which engines there are and whether they serve (joining,
ejection, probing, retirement) is :mod:`readers.engines.membership`, over the address sources of
:mod:`readers.engines.addresses`; this module dispatches each read to the engine the policy chooses
among the serving members, counts it, and retries it once on the next choice when its engine fails
(a read is one greedy token: repeating it is harmless).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

import httpx

from readers.engines.addresses import Addresses, Resolver, fixed_addresses, name_addresses, resolve_addresses
from readers.engines.base import (
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_TIMEOUT_S,
    DEFAULT_VLLM_TOP_K,
    ClosingEngine,
    EngineReply,
    ModelInfo,
    ReadMode,
    ReadRequest,
)
from readers.engines.membership import (
    DEFAULT_REFRESH_S,
    EJECT_FIRST_S,
    EJECT_MAX_S,
    RETRIED_ERRORS,
    Member,
    Membership,
    connect_members,
)
from readers.engines.routing import Routing, RoutingPolicy
from readers.engines.vllm import VLLMEngine
from readers.errors import EngineError, EngineUnavailable


class RoutingObserver(Protocol):
    """Receives per-engine events (the service's metrics); ``engine`` is the engine's ``host:port``."""

    def read_started(self, engine: str) -> None: ...

    def read_ended(self, engine: str, error_type: str | None) -> None: ...

    def ejected(self, engine: str) -> None: ...


class RoutedEngine(ClosingEngine):
    """One engine to the reader, several vLLM engines behind it (see the module docstring)."""

    kind = "vllm"

    def __init__(self, membership: Membership, policy: RoutingPolicy) -> None:
        first = next(iter(membership.members.values())).engine
        self.info: ModelInfo = first.info
        self.tokenizer = first.tokenizer
        self.capabilities = membership.capabilities
        self.membership = membership
        self.policy = policy
        self.observers: list[RoutingObserver] = []

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
        top_k: int = DEFAULT_VLLM_TOP_K,
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
        chat_template: str | None = None,
    ) -> RoutedEngine:
        """Connect every address that answers; all must serve one model (served name, model, revision).

        The read mode is ``read_mode`` or the best one every engine supports; an engine that joins
        later must support it too. ``spill_after`` defaults to ``max_in_flight``.
        """
        policy = RoutingPolicy(routing, spill_after=spill_after or max_in_flight)  # refused before connecting

        async def connect_one(url: str) -> VLLMEngine:
            # Each engine probes on its own (its best mode); the membership then sets the common one.
            return await VLLMEngine.connect(
                url, top_k=top_k, tokenizer=tokenizer, timeout_s=timeout_s, max_in_flight=max_in_flight, transport=transport,
                share_prefix=share_prefix, prefill_first=prefill_first, chat_template=chat_template,
            )  # fmt: skip

        members, capabilities = await connect_members(
            addresses, connect_one, read_mode=read_mode, refresh_s=refresh_s
        )
        membership = Membership(
            members,
            addresses=addresses,
            connect_one=connect_one,
            capabilities=capabilities,
            refresh_s=refresh_s,
            eject_s=eject_s,
            transport=transport,
        )
        return cls(membership, policy)

    # -- reading ---------------------------------------------------------------------------

    async def read(self, request: ReadRequest) -> EngineReply:
        return await self._read_on(self.choose(request), request)

    async def read_many(self, requests: Sequence[ReadRequest]) -> list[EngineReply]:
        """The reads of one request: under affinity all on the engine their shared prefix chooses."""
        if self.policy.routing == "round_robin" or not requests:
            return list(await asyncio.gather(*(self.read(request) for request in requests)))
        member = self.choose(requests[0])
        return list(await asyncio.gather(*(self._read_on(member, request) for request in requests)))

    def choose(self, request: ReadRequest, *, excluding: frozenset[str] = frozenset()) -> Member:
        """The member a read goes to now (the policy's choice); EngineUnavailable if none serves."""
        serving = {member.id: member for member in self.membership.serving(excluding)}
        if not serving:
            raise EngineUnavailable(
                f"no engine is serving ({len(self.membership.members)} known, all ejected or excluded)",
                retry_after_s=self.membership.retry_after_s(),
            )
        loads = {engine_id: member.in_flight for engine_id, member in serving.items()}
        return serving[self.policy.choose(loads, request)]

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
            if isinstance(error, RETRIED_ERRORS) and self.membership.eject(member, error):
                for observer in self.observers:
                    observer.ejected(member.id)
            raise
        finally:
            member.in_flight -= 1
            member.reads += 1
            if member.in_flight == 0:
                member.idle.set()
            for observer in self.observers:
                observer.read_ended(member.id, error_type)

    # -- reporting and closing -------------------------------------------------------------

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per engine (``host:port``): state, reads in flight, reads, errors by type, ejections."""
        return self.membership.stats()

    async def aclose(self) -> None:
        await self.membership.aclose()
