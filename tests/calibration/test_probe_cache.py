"""The probe cache (calibration/probe_cache.py): decoded probes bounded per tenant and in all, so one
tenant's many probe keys cannot take another's memory; and the stores keep no weights in their lookup
cache, loading them on first use."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.probe import ProbeMap, ProbeMember
from calibration.probe_cache import ProbeCache, ProbeCacheStats
from calibration.store import CalibrationKey
from service.server import ServeOptions, ServeRefused, run_server

KIB = 1024


def probe(kib: int = 8):
    """A folded probe of ``kib`` KiB: one member, one option row of kib·256 float32 weights."""
    member = ProbeMember(1.0, np.zeros(1), np.zeros(kib * 256), np.ones(kib * 256), np.zeros((1, kib * 256)))
    folded = ProbeMap.of([member]).folded
    assert abs(folded.nbytes - kib * KIB) < 64
    return folded


def test_a_tenant_holds_at_most_its_bound_and_loses_its_least_recently_used_first():
    cache = ProbeCache(total_bytes=1024 * KIB, tenant_bytes=25 * KIB)  # three 8 KiB probes
    for i in range(4):
        cache.put("a", f"cal_{i}", probe())
        cache.get("a", "cal_0")  # kept in use
    assert cache.held_by("a") <= 25 * KIB
    assert [cache.get("a", f"cal_{i}") is not None for i in range(4)] == [True, False, True, True]
    assert cache.stats().evictions == 1 and cache.stats().loads == 4


def test_when_the_total_is_full_the_largest_holder_gives_back_first():
    """A tenant that cycles through many keys evicts its own probes, never those of a tenant holding
    less, however recently it used them."""
    cache = ProbeCache(total_bytes=64 * KIB, tenant_bytes=48 * KIB)
    cache.put("few", "cal_few", probe())
    for i in range(50):
        cache.put("many", f"cal_{i}", probe())
    assert cache.get("few", "cal_few") is not None
    assert cache.stats().bytes <= 64 * KIB and cache.held_by("many") <= 48 * KIB
    # Shared fits (tenant None) are one more holder under the same rules.
    cache.put(None, "cal_shared", probe())
    assert cache.get(None, "cal_shared") is not None and cache.get("few", "cal_few") is not None
    assert cache.stats().bytes <= 64 * KIB


def test_a_probe_over_the_tenant_bound_is_applied_but_not_kept():
    cache = ProbeCache(total_bytes=64 * KIB, tenant_bytes=16 * KIB)
    cache.put("a", "cal_small", probe())
    cache.put("a", "cal_large", probe(32))
    assert cache.get("a", "cal_large") is None and cache.get("a", "cal_small") is not None


def test_bounds_are_checked():
    with pytest.raises(ValueError, match="cannot be negative"):
        ProbeCache(total_bytes=-1)
    off = ProbeCache(total_bytes=0)
    off.put("a", "cal_0", probe())
    assert off.get("a", "cal_0") is None and off.stats() == ProbeCacheStats(0, 0, 1, 0)
    assert ProbeCache(total_bytes=4 * KIB, tenant_bytes=8 * KIB).tenant_bytes == 4 * KIB


def test_the_store_keeps_shapes_in_its_lookup_cache_and_weights_in_the_bounded_one(new_store):
    """A store whose probe cache holds two probes a tenant: the third tenant-a key's fit evicts a's
    oldest, the lookup still finds every key (its shape), and a load brings the weights back."""
    rng = np.random.default_rng(0)
    probes = [
        ProbeMap.of([
            ProbeMember(1.2, rng.normal(size=2), rng.normal(size=576), rng.uniform(0.5, 2, 576), rng.normal(size=(2, 576)))
            for _ in range(6)
        ])
        for _ in range(4)
    ]  # fmt: skip
    size = probes[0].folded.nbytes
    store = new_store(probe_cache=ProbeCache(total_bytes=1024 * KIB, tenant_bytes=2 * size))
    keys = [
        CalibrationKey("m", "r", "choice", 2, domain, read_version="v", tenant=tenant)
        for tenant, domain in (("a", "d0"), ("a", "d1"), ("a", "d2"), ("b", "d0"))
    ]
    fits = [
        store.add_calibration(
            key, temperature=1.2, n=40, source="examples", mode="probe", bias=[0, 0], probe=probe
        )
        for key, probe in zip(keys, probes)
    ]
    assert [store.cached_probe(fit) is not None for fit in fits] == [False, True, True, True]
    assert all(store.lookup(key).probe_dimension == 576 for key in keys)
    z, h = rng.normal(size=(3, 2)), rng.normal(size=(3, 576))
    assert np.allclose(store.load_probe(fits[0]).apply(z, h), probes[0].apply(z, h))
    assert store.cached_probe(fits[0]) is not None and store.cached_probe(fits[1]) is None
    assert store.probe_cache.held_by("a") == 2 * size


def test_a_pruned_fit_loads_as_none(new_store):
    """A fit another replica pruned before this one's cache saw its successor: nothing to apply."""
    store = new_store(keep_fits=1)
    member = ProbeMember(1.0, np.zeros(2), np.zeros(4), np.ones(4), np.zeros((2, 4)))
    key = CalibrationKey("m", "r", "choice", 2, None, read_version="v")
    fit = [
        store.add_calibration(
            key,
            temperature=1.0,
            n=40,
            source="examples",
            mode="probe",
            bias=[0, 0],
            probe=ProbeMap.of([member]),
        )
        for _ in range(2)
    ]
    assert store.load_probe(fit[0]) is None and store.load_probe(fit[1]) is not None


def test_decide_serve_refuses_a_negative_probe_cache():
    with pytest.raises(ServeRefused, match="cannot be negative") as refused:
        run_server(ServeOptions(probe_cache_mib=-1))
    assert refused.value.option == "--probe-cache-mib"
