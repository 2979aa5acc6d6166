"""What the service holds from start-up is kept out of the garbage collector's full passes.

A served model leaves several hundred thousand Python objects that live as long as the process (the
embedded SmolLM2 engine, its tokenizer and transformers' modules: ~435,000 tracked objects). CPython's
collector walks every tracked object in a full (generation 2) pass, which it runs whenever enough
objects have survived since the last one: under steady load every few tens of seconds. Each such pass
held the whole process, event loop and compute thread alike, for 225-320 ms (once 3.0 s, on a loaded
machine), 8 times in the ~3 minutes of issue 39's flood probe: a tail for whichever request was in
flight, whoever's it was. Frozen after start-up (``gc.freeze``: moved to a generation no pass walks),
those objects cost a full pass nothing; what requests create is collected as before.

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
