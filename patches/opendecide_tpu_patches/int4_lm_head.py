# Computes the logits of a model whose output head is its packed int4 embedding table (tied embeddings, as in
# Gemma 4). tpu-inference's `JaxEmbed.decode` is `jnp.dot(x, self.weight.value.T)`: with the table packed by
# `packed_int4_embedding` there is no `weight` (JaxEmbed's `__getattr__` answers None for it), so the first
# logits fail with "'NoneType' object has no attribute 'value'". Present in tpu-inference 0.32.0 (PyPI) and on
# main at b8692ff0 (2026-08-22), where JaxEmbed came with vllm-project/tpu-inference#1557 (commit 9badf8d8):
# https://github.com/vllm-project/tpu-inference/blob/b8692ff01fa191343836996c27a39dc95f008b88/tpu_inference/layers/jax/embed.py
# Delete this module together with packed_int4_embedding, or once the pinned tpu-inference's decode asks the
# layer's quant method: the plugin then logs "already fixed upstream".
"""Make ``JaxEmbed.decode`` read a packed int4 table a block of vocabulary rows at a time.

Logits need every row, so the table is unpacked, but never whole: ``BLOCK_ROWS`` rows at a time are unpacked,
scaled to the table's dtype and multiplied with the hidden states, so besides the packed table the chip holds one
block of dequantized rows (``BLOCK_ROWS × d`` values) and the logits. Each logit is the same dot product a
dequantized table would give. A layer without a packed table takes upstream's own ``decode``.
"""

from __future__ import annotations

import inspect
from types import ModuleType

from ._patching import Outcome, Result, replace_method, upstream_method
from .packed_int4_embedding import dequantize_rows

MODULE = "tpu_inference.layers.jax.embed"
CLASS = "JaxEmbed"
_MARK = "_opendecide_int4_lm_head"
# 8192 rows of a 3,840-wide bf16 table are 60 MiB of transient values; 262,144 such rows packed are 0.47 GiB.
BLOCK_ROWS = 8192


def packed_logits(x, packed, scale, features: int, dtype, block_rows: int = BLOCK_ROWS):
    """``x @ table.T`` for a pack-quantized ``table``: ``x`` ``[t, d]`` → ``[t, vocab]`` in ``x``'s result dtype."""
    import jax
    import jax.numpy as jnp

    vocab = packed.shape[0]

    def block(start, rows):
        words = jax.lax.dynamic_slice_in_dim(packed, start, rows, axis=0)
        scales = jax.lax.dynamic_slice_in_dim(scale, start, rows, axis=0)
        return jnp.dot(x, dequantize_rows(words, scales, features, dtype).T)

    if vocab <= block_rows:
        return block(0, vocab)
    n_blocks = -(-vocab // block_rows)
    out_dtype = jnp.result_type(x.dtype, dtype)
    logits = jnp.zeros(x.shape[:-1] + (vocab,), out_dtype)

    def step(i, logits):
        # The last block starts early enough to stay inside the table; rows it shares with the one before are
        # written twice with the same values.
        start = jnp.minimum(i * block_rows, vocab - block_rows)
        return jax.lax.dynamic_update_slice_in_dim(logits, block(start, block_rows), start, axis=-1)

    return jax.lax.fori_loop(0, n_blocks, step, logits)


def apply(module: ModuleType) -> Result:
    """Replace ``JaxEmbed.decode`` in ``module`` with one that reads a packed table, if it needs it."""
    cls = getattr(module, CLASS, None)
    found = upstream_method(cls, "decode", _MARK)
    if isinstance(found, Result):
        return found
    original, source = found
    if "quant_method" in source:
        return Result(
            Outcome.ALREADY_FIXED, f"{CLASS}.decode asks the layer's quant method; delete {__name__}"
        )
    if "self.weight" not in source:
        return Result(Outcome.UNRECOGNISED, f"{CLASS}.decode does not read self.weight")

    def decode(self, x):
        if not getattr(self.quant_method, "packed_int4_table", False):
            return original(self, x)
        method = self.quant_method
        return packed_logits(
            x, self.weight_packed[...], self.weight_scale[...], method.features, method.dtype
        )

    replace_method(cls, "decode", decode, original, _MARK)
    return Result(
        Outcome.PATCHED,
        f"{CLASS}.decode computes logits from a packed int4 table, {BLOCK_ROWS} rows at a time "
        f"({inspect.getsourcefile(original)})",
    )
