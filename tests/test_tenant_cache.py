"""The tenant cache (opendecide/tenant_cache.py): bounded in all, and past the bound the owner holding
the most gives back its least recently used entry."""

from __future__ import annotations

import pytest

from opendecide.tenant_cache import TenantCache


def test_an_owner_alone_uses_the_whole_limit_least_recently_used_first():
    cache = TenantCache(3)
    for key in "wxyz":
        cache.put("a", key, key.upper())
        cache.get("a", "w")  # kept in use
    assert [cache.get("a", key) for key in "wxyz"] == ["W", None, "Y", "Z"]
    assert (cache.total, len(cache), cache.puts, cache.evictions) == (3, 3, 4, 1)


def test_an_owner_cycling_through_keys_evicts_its_own_not_an_owner_holding_less():
    cache = TenantCache(10)
    cache.put("few", "k", 1)
    cache.put("few", "l", 2)
    for i in range(500):
        cache.put("many", i, i)
    assert cache.get("few", "k") == 1 and cache.get("few", "l") == 2
    assert (cache.held_by("few"), cache.held_by("many"), cache.total) == (2, 8, 10)
    assert [cache.get("many", i) for i in range(492, 500)] == list(range(492, 500))
    # Owners at the same size: either may give back, never one holding less.
    cache.put("third", "t", 3)
    assert cache.held_by("many") == 7 and cache.get("few", "k") == 1


def test_sizes_count_and_what_cannot_be_kept_is_not():
    cache = TenantCache(100, size=len)
    assert cache.put("a", "small", "x" * 60) and not cache.put("a", "huge", "x" * 101)
    # b's one entry is larger than all a holds: b holds the most, so its entry is given back.
    assert not cache.put("b", "big", "x" * 70) and cache.get("a", "small") == "x" * 60
    cache.put("a", "small", "x" * 10)  # a replaced value counts its new size
    assert cache.total == 10 and cache.keys() == [("a", "small")]
    assert (cache.puts, cache.evictions) == (3, 1)  # the huge one was never taken in
    nothing = TenantCache(0)
    assert not nothing.put("a", "k", 1) and len(nothing) == 0
    with pytest.raises(ValueError, match="cannot be negative"):
        TenantCache(-1)
