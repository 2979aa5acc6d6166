"""Large bodies' parses pause the cyclic garbage collector (``service/parse.py``), the whole process's:
parses that overlap never keep it paused past ``MAX_COLLECTION_PAUSE_S`` without a collection, so
one tenant's stream of large bodies cannot leave every tenant's cyclic garbage uncollected."""

from __future__ import annotations

import gc
import weakref

from service.parse import MAX_COLLECTION_PAUSE_S, _CollectionPause


class Node:
    pass


def unreachable_cycle() -> weakref.ref:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_overlapping_parses_collect_once_past_the_bound_and_the_pause_goes_on():
    now = [0.0]
    pause = _CollectionPause(clock=lambda: now[0])  # a fake clock: no test waits seconds
    assert gc.isenabled()
    with pause.paused():  # a parse that outlasts the others
        cycle = unreachable_cycle()
        with pause.paused():
            now[0] = MAX_COLLECTION_PAUSE_S / 2
        assert cycle() is not None and not gc.isenabled()  # within the bound: nothing collected
        with pause.paused():
            now[0] = MAX_COLLECTION_PAUSE_S + 1
        assert cycle() is None and not gc.isenabled()  # past it: collected once, still paused
        later = unreachable_cycle()
        with pause.paused():
            now[0] = MAX_COLLECTION_PAUSE_S + 2
        assert later() is not None  # the interval counts again from that collection
    assert gc.isenabled()
