"""The local engine's bfloat16 attention: two bfloat16 matrix products per key-value head.

On a CPU without AMX, torch's fused attention (``scaled_dot_product_attention``) computes bfloat16 inputs
in float32, ~110-130 GFLOP/s on this project's 2-core AMD EPYC in either precision, where a bfloat16
matrix product of the same shapes runs at 260-400 GFLOP/s (avx512_bf16; ``torch.bmm`` timed once, by a
script not kept). A read of many described options is mostly attention (each option's tokens attend to a
~4,000-token list), so the bfloat16 engine attends with plain matrix products instead (``bench/attention_chunk.py`` times both kernels: one layer,
128 queries over 4,028 keys, 11.3 ms fused, 6.3 ms here; evidence/latency/past-in-place/kernel.md):

- the query heads that share one key-value head are stacked along the queries, so each product reads
  that head's keys once and no key or value is copied per query head (transformers' ``repeat_kv``);
- queries go in blocks of 128: past that a block's scores leave the cores' caches and the softmax
  slows by half;
- the keys are transposed once per layer into rows the scores' product reads in order, and a block
  masks its scores only from the first key one of its queries does not see (``ForwardMasks``, built
  once per forward): a chunk of a long list sees all of the list before it;
- scores and probabilities are rounded to bfloat16 between the products (softmax itself sums in
  float32), where the fused kernel keeps the scores in float32. On the shipped tasks that moved nothing
  measurable (8 answers of 600 differ from float32's, 9 with the fused kernel, docs/shared-state.md),
  within the bfloat16 engine's stated bound (``readers.engines.LOCAL_DTYPES``); the float32 engine keeps
  the fused kernel and its 1e-4 exactness.

On a CPU with AMX the fused kernel computes bfloat16 on the tiles and is as fast or faster per layer,
but not at the request (255 described options first seen: 6.2 s fused, 6.0 s here;
evidence/latency/amx/), so one kernel serves both kinds of CPU.

The mask is the chunked forward's boolean 4-D mask (``readers/engines/chunked.py``), one per layer type.
"""

from __future__ import annotations

import math

from opendecide.extras import needs_extra

with needs_extra("local", "the local engine"):
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "opendecide_grouped"
"""The name the engine loads a bfloat16 model with (``attn_implementation``)."""


def grouped_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    grouped_masks: ForwardMasks | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``query`` [1, heads, q, d], ``key`` and ``value``
    [1, kv heads, k, d], ``attention_mask`` boolean [1, 1, q, k] (True: visible); returns [1, q, heads, d].
    ``grouped_masks``: the forward's ``ForwardMasks``, so its layers prepare each mask once.
    Anything else (a batch, a float mask, soft-capped scores) goes to transformers' sdpa function."""
    plain = (
        query.shape[0] == 1
        and attention_mask is not None
        and attention_mask.dtype == torch.bool
        and attention_mask.shape[:2] == (1, 1)
        and kwargs.get("softcap") is None
        and not dropout
    )
    if not plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    _, heads, _, dim = query.shape
    scale = dim**-0.5 if scaling is None else scaling
    masks = ForwardMasks() if grouped_masks is None else grouped_masks
    # Keys as [kv heads, d, k], contiguous: the scores' product runs ~30% faster on them than on the
    # transposed view of the cache (one copy per layer, shared by the blocks).
    keys = key[0].transpose(1, 2).contiguous()
    if math.frexp(scale)[0] == 0.5:  # a power of two: scaling the queries first is exact
        query, scale = query * scale, 1.0
    blocks = [
        _block(query[0, :, at : at + QUERY_BLOCK], keys, value[0], hidden, scale)
        for at, hidden in masks.blocks(attention_mask, heads // key.shape[1])
    ]
    out = torch.cat(blocks, dim=1) if len(blocks) > 1 else blocks[0]  # [heads, q, d]
    return out.transpose(0, 1)[None].contiguous(), None


QUERY_BLOCK = 128


class ForwardMasks:
    """One forward's masks prepared for ``_block`` once, for all its layers (the chunked forward
    passes one per forward, ``readers/engines/chunked.py``): per block of queries, the first key
    some query of the block does not see and which keys from there each query does not, stacked for
    the heads that share a key-value head. Only the keys from there are masked in the scores: a chunk
    of an option list sees all of the list before it, so masking every key (an additive mask over
    all the scores, rebuilt per layer) cost as much as the softmax's exponentials in some layers."""

    def __init__(self) -> None:
        self._prepared: list[tuple[torch.Tensor, int, list[tuple[int, tuple[int, torch.Tensor]]]]] = []

    def blocks(self, mask: torch.Tensor, groups: int) -> list[tuple[int, tuple[int, torch.Tensor]]]:
        """``mask`` [1, 1, q, k] (True: visible) as (first query, (first hidden key, hidden
        [groups · block, k - it])) per block of queries."""
        for known, known_groups, blocks in self._prepared:  # a forward has one mask per layer type
            if known is mask and known_groups == groups:
                return blocks
        visible = mask[0, 0]
        blocks = []
        for at in range(0, visible.shape[0], QUERY_BLOCK):
            block = visible[at : at + QUERY_BLOCK]
            partly = (~block.all(dim=0)).nonzero()
            first = int(partly[0]) if len(partly) else block.shape[1]
            blocks.append((at, (first, (~block[:, first:]).repeat(groups, 1))))
        self._prepared.append((mask, groups, blocks))
        return blocks


def _block(
    query: torch.Tensor,
    keys: torch.Tensor,
    value: torch.Tensor,
    hidden: tuple[int, torch.Tensor],
    scale: float,
) -> torch.Tensor:
    """Queries [heads, q, d] against every key (``keys`` [kv heads, d, k], ``value`` [kv heads, k, d]);
    ``hidden``: from which key on, which keys each stacked query does not see (``ForwardMasks``)."""
    heads, queries, dim = query.shape
    kv_heads = keys.shape[0]
    first, tail = hidden
    # The heads of one key-value head are adjacent (transformers' repeat_kv order): [kv heads, groups·q, d].
    stacked = query.reshape(kv_heads, -1, dim)
    if scale == 1.0:
        scores = torch.bmm(stacked, keys)
    else:  # beta 0: the first argument gives only the shape; alpha scales in the product's accumulator
        scores = torch.baddbmm(query.new_zeros(1, 1, 1), stacked, keys, beta=0, alpha=scale)
    if first < scores.shape[-1]:
        scores[..., first:].masked_fill_(tail, float("-inf"))
    probabilities = torch.softmax(scores, dim=-1)
    return torch.bmm(probabilities, value).reshape(heads, queries, dim)


def register() -> str:
    """``NAME`` registered with transformers (attention and mask functions; idempotent); returns it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, grouped_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # boolean masks, as sdpa's
    return NAME


def attention_function(dtype: str) -> str:
    """The ``attn_implementation`` the local engine loads a model with in ``dtype``."""
    return register() if dtype == "bfloat16" else "sdpa"
