"""Decoded probes in a replica's memory, bounded per tenant and in all.

A probe key's weights are tens to hundreds of kilobytes (``FoldedProbe.nbytes``: 46 KB for ten
two-option fits on a 576-number state, ~6 MB for 255 options), and a tenant may fit one per domain
without limit. The store's lookup cache therefore holds every key's calibration without its probe, and
this cache holds the probes answers applied lately, each loaded from the store on first use
(``CalibrationStore.load_probe``, one query in a worker thread). Two bounds keep one caller's keys from
taking another's memory:

- ``tenant_bytes``: no tenant holds more; its own least recently used probe goes first. Shared fits
  (tenant None) count as one more tenant.
- ``total_bytes``: when all tenants together hold more, the least recently used probe of the tenant
  holding the most goes first, so a tenant that cycles through many keys evicts its own probes, not
  those of a tenant using a few.

A probe larger than ``tenant_bytes`` is applied but not kept; with ``total_bytes`` 0 none is (every
answer of a probe key reads its weights from the store: the memory bound at its tightest). Thread-safe: answers read it on the event
loop (memory only), loads fill it from worker threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from calibration.probe import FoldedProbe

DEFAULT_PROBE_CACHE_MIB = 256
"""All tenants' decoded probes at most, per replica: ~5,800 two-option probe keys of SmolLM2-135M (46,320 bytes each)."""
TENANT_SHARE = 4
"""By default a tenant holds at most a quarter of the total."""


@dataclass(frozen=True)
class ProbeCacheStats:
    bytes: int
    probes: int
    loads: int
    evictions: int


class ProbeCache:
    def __init__(
        self, total_bytes: int = DEFAULT_PROBE_CACHE_MIB << 20, tenant_bytes: int | None = None
    ) -> None:
        tenant_bytes = total_bytes // TENANT_SHARE if tenant_bytes is None else tenant_bytes
        if total_bytes < 0 or tenant_bytes < 0:
            raise ValueError("the probe cache's bounds cannot be negative (0: keep none)")
        self.total_bytes, self.tenant_bytes = total_bytes, min(tenant_bytes, total_bytes)
        # tenant → calibration id → probe, least recently used first.
        self._held: dict[str | None, OrderedDict[str, FoldedProbe]] = {}
        self._tenant_held: dict[str | None, int] = {}
        self._bytes = self._loads = self._evictions = 0
        self._lock = threading.Lock()

    def get(self, tenant: str | None, calibration_id: str) -> FoldedProbe | None:
        with self._lock:
            held = self._held.get(tenant)
            probe = None if held is None else held.get(calibration_id)
            if probe is not None:
                held.move_to_end(calibration_id)
            return probe

    def put(self, tenant: str | None, calibration_id: str, probe: FoldedProbe) -> None:
        size = probe.nbytes
        with self._lock:
            held = self._held.get(tenant)
            if held is not None and calibration_id in held:  # two requests loaded it at once
                held.move_to_end(calibration_id)
                return
            self._loads += 1
            if size > self.tenant_bytes:
                return
            held = self._held.setdefault(tenant, OrderedDict())
            held[calibration_id] = probe
            self._tenant_held[tenant] = self._tenant_held.get(tenant, 0) + size
            self._bytes += size
            while self._tenant_held[tenant] > self.tenant_bytes:
                self._evict(tenant)
            while self._bytes > self.total_bytes:
                self._evict(max(self._tenant_held, key=self._tenant_held.__getitem__))

    def _evict(self, tenant: str | None) -> None:
        held = self._held[tenant]
        _, probe = held.popitem(last=False)
        self._tenant_held[tenant] -= probe.nbytes
        self._bytes -= probe.nbytes
        self._evictions += 1
        if not held:
            del self._held[tenant], self._tenant_held[tenant]

    def held_by(self, tenant: str | None) -> int:
        """Bytes of ``tenant``'s probes held now."""
        with self._lock:
            return self._tenant_held.get(tenant, 0)

    def stats(self) -> ProbeCacheStats:
        with self._lock:
            probes = sum(len(held) for held in self._held.values())
            return ProbeCacheStats(self._bytes, probes, self._loads, self._evictions)
