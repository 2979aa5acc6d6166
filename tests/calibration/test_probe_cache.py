"""The probe cache (calibration/probe_cache.py): decoded probes bounded in all, the tenant holding the
most giving back first, so one tenant's many probe keys cannot take another's memory; and the stores
keep no weights in their lookup cache, loading them on first use."""

from __future__ import annotations

import asyncio

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


def test_probes_are_counted_in_bytes_and_a_tenant_cycling_keys_evicts_its_own():
    """Past the total, the tenant holding the most gives back (opendecide/tenant_cache.py): a tenant
    fitting a probe per domain without end never evicts another tenant's probe."""
    cache = ProbeCache(total_bytes=64 * KIB)
    cache.put("few", "cal_few", probe())
    cache.put(None, "cal_shared", probe())  # shared fits: one more holder
    for i in range(50):
        cache.put("many", f"cal_{i}", probe())
    assert cache.get("few", "cal_few") is not None and cache.get(None, "cal_shared") is not None
    stats = cache.stats()
    assert stats.bytes <= 64 * KIB and cache.held_by("many") == stats.bytes - 2 * probe().nbytes
    assert (stats.probes, stats.loads, stats.evictions) == (7, 52, 45)
    off = ProbeCache(total_bytes=0)
    off.put("a", "cal_0", probe())
    assert off.get("a", "cal_0") is None and off.stats() == ProbeCacheStats(0, 0, 0, 0)


def test_the_store_keeps_shapes_in_its_lookup_cache_and_weights_in_the_bounded_one(new_store):
    """A store whose probe cache holds three probes: tenant b's fit after tenant a's three evicts a's
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
    store = new_store(probe_cache=ProbeCache(total_bytes=3 * size))
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


@pytest.mark.anyio
async def test_answers_asking_together_for_a_probe_not_held_load_it_once(new_store):
    """Eight answers of a key whose weights this process does not hold (a fit another replica
    stored) share one read of them, in one worker thread; one cancelled by its deadline while it
    waits does not cancel the read the others wait on."""
    member = ProbeMember(1.0, np.zeros(2), np.zeros(576), np.ones(576), np.ones((2, 576)))
    key = CalibrationKey("m", "r", "choice", 2, None, read_version="v", tenant="a")
    fitted = new_store().add_calibration(
        key, temperature=1.0, n=40, source="examples", mode="probe", bias=[0, 0], probe=ProbeMap.of([member])
    )
    store = new_store()  # another process: the fit's shape in its lookup, no weights held
    assert store.cached_probe(fitted) is None
    impatient = asyncio.ensure_future(store.probe(fitted))
    await asyncio.sleep(0)  # it starts the load, then its deadline cancels it
    impatient.cancel()
    probes = await asyncio.gather(*(store.probe(fitted) for _ in range(8)))
    assert all(p is probes[0] for p in probes) and probes[0] is not None
    assert impatient.cancelled() and store.probe_cache.stats().loads == 1
    assert await store.probe(fitted) is probes[0] and store.probe_cache.stats().loads == 1  # held now
    assert not store._probe_loads  # nothing left in flight


@pytest.mark.anyio
async def test_a_failed_shared_load_fails_its_waiters_and_is_tried_again(new_store):
    """The store's query fails once (a database restarting): every answer waiting on that load gets
    the error, nothing stays in flight, and the next answer loads the weights."""
    member = ProbeMember(1.0, np.zeros(2), np.zeros(8), np.ones(8), np.ones((2, 8)))
    key = CalibrationKey("m", "r", "choice", 2, None, read_version="v", tenant="a")
    fitted = new_store().add_calibration(
        key, temperature=1.0, n=40, source="examples", mode="probe", bias=[0, 0], probe=ProbeMap.of([member])
    )
    store = new_store()
    query, calls = store._probe_text, []

    def restarting(calibration_id: str) -> str | None:  # the backend's one query, failing the first time
        calls.append(calibration_id)
        if len(calls) == 1:
            raise ConnectionError("the database is restarting")
        return query(calibration_id)

    store._probe_text = restarting
    failed = await asyncio.gather(*(store.probe(fitted) for _ in range(4)), return_exceptions=True)
    assert all(isinstance(e, ConnectionError) for e in failed) and not store._probe_loads
    assert await store.probe(fitted) is not None and len(calls) == 2 and not store._probe_loads


def test_decide_serve_refuses_a_negative_probe_cache():
    with pytest.raises(ServeRefused, match="cannot be negative") as refused:
        run_server(ServeOptions(probe_cache_mib=-1))
    assert refused.value.option == "--probe-cache-mib"
