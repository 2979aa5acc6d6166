"""The start-up heap frozen out of full collections (``service/heap.py``): with the embedded model loaded,
a full pass walks several hundred thousand objects, none once they are frozen."""

from __future__ import annotations

import gc

from service.heap import freeze_startup_heap


def test_a_full_collection_no_longer_walks_what_start_up_left(local_engine):
    gc.collect()
    walked_before = len(gc.get_objects(generation=2))
    try:
        frozen = freeze_startup_heap()
        walked_after = len(gc.get_objects(generation=2))
    finally:
        gc.unfreeze()  # this test process's objects go back where they were
    assert walked_before > 100_000  # the model's, tokenizer's and libraries' objects
    # Within a few objects: another thread (pytest-xdist's channel to its worker) allocates and frees
    # objects between the two counts.
    assert frozen >= walked_before - 100
    assert walked_after < walked_before / 100
