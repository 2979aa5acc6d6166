"""Decoded probes in a replica's memory, bounded in all and given back by the tenant holding the most.

A probe key's weights are tens to hundreds of kilobytes (``FoldedProbe.nbytes``: 46 KB for ten
two-option fits on a 576-number state, ~6 MB for 255 options), and a tenant may fit one per domain
without limit. The store's lookup cache therefore holds every key's calibration without its probe, and
this cache holds the probes answers applied lately, each loaded from the store on first use
(``CalibrationStore.probe``: one query in a worker thread, shared by the answers that ask for it
together). It is an
``opendecide.tenant_cache.TenantCache`` counted in bytes, owned by the fit's tenant (shared fits,
tenant None, count as one more): past ``total_bytes``, the tenant holding the most gives back its
least recently used probe, so a tenant cycling through many keys evicts its own probes, never those of
a tenant holding less. A probe larger than the whole bound is applied but not kept; with 0, none is
(every answer of a probe key reads its weights from the store).
"""

from __future__ import annotations

from dataclasses import dataclass

from calibration.probe import FoldedProbe
from opendecide.tenant_cache import TenantCache

DEFAULT_PROBE_CACHE_MIB = 256
"""All tenants' decoded probes at most, per replica: ~5,800 two-option probe keys of SmolLM2-135M
(46,320 bytes each)."""


@dataclass(frozen=True)
class ProbeCacheStats:
    bytes: int
    probes: int
    loads: int
    evictions: int


class ProbeCache:
    def __init__(self, total_bytes: int = DEFAULT_PROBE_CACHE_MIB << 20) -> None:
        self._held: TenantCache[FoldedProbe] = TenantCache(total_bytes, size=lambda probe: probe.nbytes)

    @property
    def total_bytes(self) -> int:
        return self._held.limit

    def get(self, tenant: str | None, calibration_id: str) -> FoldedProbe | None:
        return self._held.get(tenant, calibration_id)

    def put(self, tenant: str | None, calibration_id: str, probe: FoldedProbe) -> None:
        """Keep a probe just decoded (loaded, or fitted by this process)."""
        self._held.put(tenant, calibration_id, probe)

    def held_by(self, tenant: str | None) -> int:
        """Bytes of ``tenant``'s probes held now."""
        return self._held.held_by(tenant)

    def stats(self) -> ProbeCacheStats:
        return ProbeCacheStats(self._held.total, len(self._held), self._held.puts, self._held.evictions)
