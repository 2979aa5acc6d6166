"""What the service holds from start-up is kept out of the garbage collector's full passes.

A served model leaves several hundred thousand Python objects that live as long as the process (the
embedded SmolLM2 engine, its tokenizer and transformers' modules: ~436,000 tracked objects). CPython's
collector walks every tracked object in a full (generation 2) pass, which it runs whenever enough
objects have survived since the last one, holding the whole process meanwhile, event loop and compute
thread alike: 234 ms a pass on two cores (``bench/gc_pauses.py``). In one run of issue 39's flood probe
the server made one such pass under load (224 ms, a stall for whichever requests were in flight,
whoever's they were), after seven during start-up. Frozen once the engine is open (``gc.freeze``:
moved to a generation no pass walks), those objects cost a full pass nothing (under 1 ms after), and
four runs of the probe saw no full pass under load; what requests create is collected as before.

The cost: start-up objects that later become garbage in a reference cycle are not reclaimed. What is
frozen is the process's long-lived state, collected first so no garbage of start-up itself is kept.
"""

from __future__ import annotations

import gc
import logging

logger = logging.getLogger("opendecide.service")


def freeze_startup_heap() -> int:
    """Collect, then freeze every object the collector tracks now; the count frozen in all."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.info("start-up heap: %d objects frozen out of full garbage-collector passes", frozen)
    return frozen
