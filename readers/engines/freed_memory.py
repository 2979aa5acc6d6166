"""Handing a batch's freed working memory back to the system.

glibc keeps freed blocks below its (adaptive) mmap threshold in its arenas, so after one large read
the local engine's process would stay as large as that read's peak; ``malloc_trim`` releases them
(measured in bench/latency.py: retained RSS). Elsewhere than glibc there is nothing to call.
"""

from __future__ import annotations

import ctypes
import ctypes.util

TRIM_ABOVE_BYTES = 64 * 2**20
"""A batch whose chunks worked in more memory than this returns what it freed to the system."""


def _load_malloc_trim():
    library = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(library).malloc_trim if library else None
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _load_malloc_trim()


def return_freed_memory() -> None:
    """``malloc_trim(0)`` where the C library has it."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
