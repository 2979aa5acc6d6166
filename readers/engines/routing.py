"""Where a read goes among the engines that serve: the routing policy, pure (no I/O, no tasks).

With ``routing="affinity"`` (the default):

1. A read's **key** hashes the prompt ids every read of the same state shares: the first
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
against (``bench/routing.py``). Which engines serve, and how many reads each has in flight, is
:mod:`readers.engines.membership`'s; the engine that dispatches is :mod:`readers.engines.routed`.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Mapping, Sequence
from typing import Literal

from readers.engines.base import ReadRequest

Routing = Literal["affinity", "round_robin"]
ROUTINGS: tuple[Routing, ...] = ("affinity", "round_robin")
FALLBACK_PREFIX_TOKENS = 128
"""Key length when a read names no shared prefix: short enough to stay inside the system prompt and
state of most requests (so their questions share a key), and one vLLM-CPU KV block (128 tokens), the
unit its prefix cache reuses."""


def prefix_key(request: ReadRequest) -> bytes | None:
    """The affinity key of a read: a hash of its cache salt and the caller's ``affinity_key`` where it
    gave one, else of its salt and shared prefix ids (see the module docstring). Salted: vLLM reuses
    a block only under the salt it was computed with, so one prompt of two tenants shares nothing,
    and two tenants' like ``affinity_key`` must not pile onto one engine."""
    salt = b"salt:" + (request.cache_salt or "").encode() + b"\0"
    if request.affinity_key is not None:
        # Prefixed so a caller's key can never hash like a prompt's ids.
        return hashlib.blake2b(salt + b"caller-key:" + request.affinity_key.encode(), digest_size=16).digest()
    shared = request.prefix_tokens or FALLBACK_PREFIX_TOKENS
    head = request.prompt_ids[:shared]
    if not head:
        return None
    return hashlib.blake2b(salt + array("q", head).tobytes(), digest_size=16).digest()


def rendezvous_order(key: bytes, ids: Sequence[str]) -> list[str]:
    """``ids`` best first for ``key``: highest ``blake2b(key, id)`` wins, the same on every replica."""

    def score(engine_id: str) -> bytes:
        return hashlib.blake2b(key + engine_id.encode(), digest_size=8).digest()

    return sorted(ids, key=score, reverse=True)


class RoutingPolicy:
    """Chooses an engine for a read from the serving engines' loads (see the module docstring).

    The only state is round-robin's turn; ``choose`` reads nothing but its arguments otherwise.
    """

    def __init__(self, routing: Routing = "affinity", *, spill_after: int) -> None:
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, not {routing!r}")
        if spill_after < 1:
            raise ValueError(f"spill_after must be at least 1, not {spill_after}")
        self.routing = routing
        self.spill_after = spill_after
        self._turn = 0

    def choose(self, loads: Mapping[str, int], request: ReadRequest) -> str:
        """The engine id ``request`` goes to, given reads in flight per serving engine id.

        Ties among equally loaded engines go to the first in ``loads``' order. ValueError if
        ``loads`` is empty: whether any engine serves is the caller's to report."""
        if not loads:
            raise ValueError("no serving engine to choose from")
        if self.routing == "round_robin":
            self._turn += 1
            ids = sorted(loads)
            return ids[self._turn % len(ids)]
        key = prefix_key(request)
        if key is None:
            return min(loads, key=loads.__getitem__)
        least = min(loads.values())
        for engine_id in rendezvous_order(key, list(loads)):
            if loads[engine_id] - least < self.spill_after:
                return engine_id
        raise AssertionError("unreachable: the least-loaded engine is within the spill bound")
