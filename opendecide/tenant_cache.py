"""Entries that belong to callers, bounded in all, given back by whoever holds the most.

A cache shared by tenants and kept by recency alone lets one tenant's stream of new keys evict every
other tenant's entries: their next request pays to rebuild them, and its latency tells them someone
was busy. Here each entry has an owner (a tenant, a cache salt); when the entries together pass the
limit, the least recently used entry **of the owner holding the most** goes. An owner cycling through
many keys therefore evicts its own, and an owner holding less than anyone else keeps everything: no
owner's use takes another's entries while it holds more than they do. Alone, one owner may use the
whole limit.

Sizes are counted by ``size(value)`` (1 per entry by default; bytes for decoded weights). A value
larger than the limit is not kept. Thread-safe (one lock): the probe cache is filled from worker
threads and read on the event loop. A leaf: it imports nothing of the project, so every layer may.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


def _one(value: object) -> int:
    return 1


class TenantCache(Generic[V]):
    def __init__(self, limit: int, size: Callable[[V], int] = _one) -> None:
        if limit < 0:
            raise ValueError("a cache's limit cannot be negative (0: keep nothing)")
        self.limit, self.size = limit, size
        # owner → key → (value, its size), least recently used first.
        self._held: dict[Hashable, OrderedDict[Hashable, tuple[V, int]]] = {}
        self._owner_total: dict[Hashable, int] = {}
        self._total = 0
        self.puts = self.evictions = 0  # values taken in, and entries given back; counted under the lock
        self._lock = threading.Lock()

    def get(self, owner: Hashable, key: Hashable) -> V | None:
        """The value, now the owner's most recently used; None if not held."""
        with self._lock:
            held = self._held.get(owner)
            if held is None or key not in held:
                return None
            held.move_to_end(key)
            return held[key][0]

    def peek(self, owner: Hashable, key: Hashable) -> V | None:
        """The value, its recency unchanged (a look that is not a use); None if not held."""
        with self._lock:
            held = self._held.get(owner)
            return None if held is None or key not in held else held[key][0]

    def put(self, owner: Hashable, key: Hashable, value: V) -> bool:
        """Hold ``value`` (replacing the key's). False if it is not held after all: larger than the
        limit, or its owner, holding the most with it, gave it back (it was the owner's only entry)."""
        size = self.size(value)
        with self._lock:
            self._drop(owner, key)
            if size > self.limit:
                return False
            self.puts += 1
            self._held.setdefault(owner, OrderedDict())[key] = (value, size)
            self._owner_total[owner] = self._owner_total.get(owner, 0) + size
            self._total += size
            while self._total > self.limit:
                largest = max(self._owner_total, key=self._owner_total.__getitem__)
                self._drop(largest, next(iter(self._held[largest])))
                self.evictions += 1
            return key in self._held.get(owner, ())

    def pop(self, owner: Hashable, key: Hashable) -> None:
        """Give the entry back, if held."""
        with self._lock:
            self._drop(owner, key)

    def _drop(self, owner: Hashable, key: Hashable) -> None:
        held = self._held.get(owner)
        if held is None or key not in held:
            return
        _, size = held.pop(key)
        self._owner_total[owner] -= size
        self._total -= size
        if not held:
            del self._held[owner], self._owner_total[owner]

    def held_by(self, owner: Hashable) -> int:
        """The sizes of ``owner``'s entries, summed."""
        with self._lock:
            return self._owner_total.get(owner, 0)

    @property
    def total(self) -> int:
        """All entries' sizes, summed (at most ``limit``)."""
        with self._lock:
            return self._total

    def keys(self) -> list[tuple[Hashable, Hashable]]:
        """Every (owner, key) held."""
        with self._lock:
            return [(owner, key) for owner, held in self._held.items() for key in held]

    def values(self) -> list[V]:
        with self._lock:
            return [value for held in self._held.values() for value, _ in held.values()]

    def __len__(self) -> int:
        with self._lock:
            return sum(len(held) for held in self._held.values())
