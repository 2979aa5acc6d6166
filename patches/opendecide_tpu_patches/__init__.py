"""Workarounds for tpu-inference bugs and gaps, applied in every vLLM process through the ``vllm.general_plugins`` entry point.

One module per workaround; each names its upstream reference and when to delete it, exposes ``MODULE`` (the
module it patches) and ``apply(module) -> Result``, and reports ``ALREADY_FIXED`` once upstream has the fix.
"""

from __future__ import annotations

import importlib.util

from . import (
    int4_lm_head,
    int4_untied_lm_head,
    int8_w8a8_linear,
    packed_int4_embedding,
    qwen2_text_config,
)
from ._patching import Outcome, Result, logger, when_imported

__all__ = ["PATCHES", "Outcome", "Result", "apply_all"]

PATCHES = (qwen2_text_config, int8_w8a8_linear, packed_int4_embedding, int4_lm_head, int4_untied_lm_head)


def apply_all() -> None:
    """Arrange for every patch to run on its module (now, or when it is imported); safe to call repeatedly."""
    # find_spec on a top-level name does not import it: tpu_inference's __init__ loads XLA and must not run here.
    if importlib.util.find_spec("tpu_inference") is None:
        logger.info("tpu_inference is not installed: no patch applies in this process")
        return
    for patch in PATCHES:
        when_imported(patch.MODULE, patch.apply)
