"""The engines a routed engine reads on, and their health: joining, ejection, probing, retirement.

Every engine must serve one model (served name, model and revision) and read in the routed read mode:
the best mode every engine supports at start, or the one asked for. An engine down at start, or
listed later, joins on a refresh (every ``refresh_s``) if it passes the same checks.

A read that ends in ``EngineUnavailable`` or ``EngineTimeout`` ejects its engine (the dispatching
engine, :mod:`readers.engines.routed`, retries it once elsewhere). An ejected engine gets no reads;
after a back-off (``eject_s``: 1 s, doubling per consecutive ejection up to 30 s) a probe
``GET /v1/models`` readmits it if it still serves the same model. An address that vanishes from the
source (:mod:`readers.engines.addresses`) gets no new reads and is closed once its reads finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from readers.engines.addresses import Addresses
from readers.engines.base import Capabilities, ReadMode
from readers.engines.vllm import VLLMEngine
from readers.errors import EngineError, EngineTimeout, EngineUnavailable

logger = logging.getLogger("opendecide.routing")

DEFAULT_REFRESH_S = 10.0
EJECT_FIRST_S = 1.0
EJECT_MAX_S = 30.0
PROBE_TIMEOUT_S = 5.0
RETRIED_ERRORS = (EngineUnavailable, EngineTimeout)
"""Errors that say the engine, not the read, failed: they eject it, and the read is tried elsewhere."""

ConnectOne = Callable[[str], Awaitable[VLLMEngine]]


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


def common_capabilities(engines: Sequence[VLLMEngine], read_mode: ReadMode | None) -> Capabilities:
    """The best read mode every engine supports (or ``read_mode``, if all do), at the smallest top-k;
    images read only where every engine reads them, priced at the most any engine counts."""
    supports = {
        mode: all(engine.capabilities.probe["supports"][mode.value] for engine in engines)
        for mode in ReadMode
    }
    if read_mode is not None and not supports[read_mode]:
        raise EngineError(
            f"not every engine supports {read_mode.value} reads: {[e.capabilities.probe['supports'] for e in engines]}"
        )
    mode = read_mode or next(mode for mode in ReadMode if supports[mode])
    images = all(engine.capabilities.images for engine in engines)
    return Capabilities(
        read_mode=mode,
        max_logprobs=min(engine.capabilities.max_logprobs for engine in engines),
        top_k=min(engine.capabilities.top_k for engine in engines),
        probe={"supports": {mode.value: ok for mode, ok in supports.items()}, "engines": {}},
        images=images,
        image_tokens=max(engine.capabilities.image_tokens for engine in engines) if images else 0,
    )


async def connect_members(
    addresses: Addresses, connect_one: ConnectOne, *, read_mode: ReadMode | None, refresh_s: float
) -> tuple[list[Member], Capabilities]:
    """Connect every address that answers now; all must serve one model and share a read mode.

    Returns the members and their common capabilities (each member set to read by them). An address
    that does not answer is logged and joins on a later refresh; EngineUnavailable if none answers."""
    urls = await addresses()
    if not urls:
        raise EngineUnavailable("no engine address to route over (the name resolves to none yet)")
    outcomes = await asyncio.gather(*(connect_one(url) for url in urls), return_exceptions=True)
    engines = {url: outcome for url, outcome in zip(urls, outcomes) if isinstance(outcome, VLLMEngine)}
    failures = {url: outcome for url, outcome in zip(urls, outcomes) if isinstance(outcome, BaseException)}
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
        capabilities.probe["engines"] = {url: engine.capabilities.probe for url, engine in engines.items()}
    except BaseException:
        await asyncio.gather(*(engine.aclose() for engine in engines.values()))
        raise
    for engine in engines.values():
        _set_capabilities(engine, capabilities)
    return [Member(url, engine) for url, engine in engines.items()], capabilities


class Membership:
    """The set of engines a routed engine reads on, kept current and healthy (see the module docstring).

    ``addresses`` is re-read every ``refresh_s``; ``connect_one`` opens a joining engine."""

    def __init__(
        self,
        members: Sequence[Member],
        *,
        addresses: Addresses,
        connect_one: ConnectOne,
        capabilities: Capabilities,
        refresh_s: float = DEFAULT_REFRESH_S,
        eject_s: tuple[float, float] = (EJECT_FIRST_S, EJECT_MAX_S),
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.members: dict[str, Member] = {}
        self.addresses = addresses
        self.capabilities = capabilities
        self._identity = _identity(members[0].engine)
        self._connect_one = connect_one
        self._refresh_s = refresh_s
        self._eject_first_s, self._eject_max_s = eject_s
        self._probes = httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, transport=transport)
        self._tasks: set[asyncio.Task] = set()
        self._retiring: set[Member] = set()
        self._closed = False
        for member in members:
            self._admit(member)
        self._spawn(self._refresh_loop())

    def serving(self, excluding: frozenset[str] = frozenset()) -> list[Member]:
        """The members that take reads now, in the order they joined, less ``excluding`` (ids)."""
        return [m for m in self.members.values() if m.serving and m.id not in excluding]

    def retry_after_s(self) -> int:
        """Whole seconds until the next ejected member is probed (at least 1): when to try again."""
        waits = [
            m.ejected_until - time.monotonic() for m in self.members.values() if m.ejected_until is not None
        ]
        return max(1, math.ceil(min(waits, default=self._eject_first_s)))

    # -- ejection and probing --------------------------------------------------------------

    def eject(self, member: Member, error: EngineError) -> bool:
        """Take ``member`` out of serving until a probe readmits it; False if it already was out."""
        if member.ejected_until is not None or member.retired:
            return False  # concurrent failures of one engine eject it once
        member.consecutive_ejections += 1
        member.ejections += 1
        wait = min(self._eject_first_s * 2 ** (member.consecutive_ejections - 1), self._eject_max_s)
        member.ejected_until = time.monotonic() + wait
        logger.warning("engine %s ejected for %.0f s: %s", member.id, wait, error.message)
        self._spawn(self._probe_back(member, wait))
        return True

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

    # -- joining and leaving ---------------------------------------------------------------

    def _admit(self, member: Member) -> None:
        self.members[member.id] = member
        logger.info("routing reads to %s (%d engines)", member.id, len(self.members))

    async def refresh(self) -> None:
        """Connect new addresses and retire vanished ones (called every ``refresh_s``)."""
        urls = await self.addresses()
        wanted = {urlsplit(url).netloc: url for url in urls}
        for engine_id, member in list(self.members.items()):
            if engine_id not in wanted:
                del self.members[engine_id]
                member.retired = True
                self._retiring.add(member)
                logger.info(
                    "engine %s no longer listed: retired after its %d reads in flight",
                    engine_id,
                    member.in_flight,
                )
                self._spawn(self._close_when_idle(member))
        new = [url for engine_id, url in wanted.items() if engine_id not in self.members]
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
        return {engine_id: member.stats() for engine_id, member in sorted(self.members.items())}

    async def aclose(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        members, self.members = [*self.members.values(), *self._retiring], {}
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
