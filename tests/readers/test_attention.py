"""readers/engines/attention.py: the bfloat16 engine's grouped attention against transformers' sdpa
function, on the masks the chunked forward builds (a past, branches that do not see each other)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from readers.engines.attention import NAME, ForwardMasks, attention_function, grouped_attention

HEADS, KV_HEADS, DIM = 9, 3, 64
LAYER = SimpleNamespace(num_key_value_groups=HEADS // KV_HEADS, is_causal=True)


def tree_case(dtype: torch.dtype, queries: int = 24, past: int = 40, seed: int = 0):
    """A chunk of ``queries`` tokens in two branches after a ``past``: each branch sees the past and
    its own earlier tokens, not the other branch (as two options read after one state)."""
    generator = torch.Generator().manual_seed(seed)
    keys = past + queries

    def draw(*shape):
        return (torch.randn(*shape, generator=generator) * 2).to(dtype)

    q, k, v = draw(1, HEADS, queries, DIM), draw(1, KV_HEADS, keys, DIM), draw(1, KV_HEADS, keys, DIM)
    mask = torch.zeros(1, 1, queries, keys, dtype=torch.bool)
    mask[..., :past] = True
    half = queries // 2
    for first, last in ((0, half), (half, queries)):
        for row in range(first, last):
            mask[0, 0, row, past + first : past + row + 1] = True
    return q, k, v, mask


def test_grouped_attention_equals_sdpa_in_float32():
    q, k, v, mask = tree_case(torch.float32)
    grouped, _ = grouped_attention(LAYER, q, k, v, mask)
    reference, _ = sdpa_attention_forward(LAYER, q, k, v, mask)
    assert grouped.shape == reference.shape == (1, q.shape[2], HEADS, DIM)
    assert torch.allclose(grouped, reference, atol=1e-5)


def test_a_scale_that_is_not_a_power_of_two_scales_the_scores():
    """Power-of-two scales (SmolLM2's 1/8, Gemma 3's 1/16) scale the queries first, exactly; any
    other scales the scores in the product."""
    q, k, v, mask = tree_case(torch.float32)
    grouped, _ = grouped_attention(LAYER, q, k, v, mask, scaling=0.1)
    reference, _ = sdpa_attention_forward(LAYER, q, k, v, mask, scaling=0.1)
    assert torch.allclose(grouped, reference, atol=1e-5)
    default, _ = grouped_attention(LAYER, q, k, v, mask)
    assert not torch.allclose(grouped, default, atol=1e-3)


def test_a_forward_prepares_each_mask_once_for_all_its_layers():
    """The layers of one forward share its ``ForwardMasks``: a mask is prepared on the first layer
    and given back to the others; another mask (Gemma's sliding layers) is prepared on its own. A
    block's masked keys start at the first key one of its queries does not see."""
    q, k, v, mask = tree_case(torch.float32, queries=24, past=40)
    masks = ForwardMasks()
    first = masks.blocks(mask, 3)
    assert masks.blocks(mask, 3) is first
    [(at, (hidden_from, hidden))] = first
    assert at == 0 and hidden_from == 40  # the second branch does not see the first's first token
    assert hidden.shape == (3 * 24, k.shape[2] - hidden_from)
    sliding = mask.clone()
    sliding[..., :10] = False
    assert masks.blocks(sliding, 3)[0][1][0] == 0
    out, _ = grouped_attention(LAYER, q, k, v, mask, grouped_masks=masks)
    assert torch.equal(out, grouped_attention(LAYER, q, k, v, mask)[0])


def test_each_query_head_reads_its_own_key_value_head():
    """A key-value head whose values are all one number: the query heads it serves (three adjacent
    heads, transformers' repeat_kv order) output exactly that number, and no other head does."""
    q, k, v, mask = tree_case(torch.float32)
    v = torch.zeros_like(v)
    v[0, 1] = 7.0
    out, _ = grouped_attention(LAYER, q, k, v, mask)
    served = ((out[0] - 7.0).abs() < 1e-4).all(dim=-1).all(dim=0)  # per head
    assert served.tolist() == [False, False, False, True, True, True, False, False, False]


def test_in_bfloat16_it_is_attention_over_scores_rounded_to_bfloat16():
    """What the kernel gives up against float32 is the rounding of its scores (and of the probabilities
    and the output): it is within bfloat16's output rounding of float32 attention over the scores
    rounded to bfloat16, while float32 attention over the exact scores is farther off."""
    q, k, v, mask = tree_case(torch.bfloat16, queries=64, past=300)
    grouped, _ = grouped_attention(LAYER, q, k, v, mask)
    stacked = q[0].float().reshape(KV_HEADS, -1, DIM)
    hidden = (
        torch.zeros(mask.shape[-2:])
        .masked_fill(~mask[0, 0], float("-inf"))
        .repeat(LAYER.num_key_value_groups, 1)
    )
    scores = torch.baddbmm(hidden, stacked, k[0].float().transpose(1, 2), alpha=DIM**-0.5)

    def attend(s):
        out = torch.bmm(torch.softmax(s, dim=-1), v[0].float()).reshape(HEADS, -1, DIM)
        return out.transpose(0, 1)[None]

    rounded_error = (grouped.float() - attend(scores.bfloat16().float())).abs().max().item()
    exact_error = (grouped.float() - attend(scores)).abs().max().item()
    assert grouped.dtype == torch.bfloat16
    assert rounded_error < 0.03 < exact_error, (rounded_error, exact_error)


def test_queries_past_one_block_equal_each_block_alone():
    q, k, v, mask = tree_case(torch.float32, queries=300, past=50)
    whole, _ = grouped_attention(LAYER, q, k, v, mask)
    reference, _ = sdpa_attention_forward(LAYER, q, k, v, mask)
    assert torch.allclose(whole, reference, atol=1e-5)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda q, k, v, m: (q, k, v, torch.zeros(m.shape, dtype=q.dtype)), id="float mask"),
        pytest.param(
            lambda q, k, v, m: (q.expand(2, -1, -1, -1), k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1), m),
            id="batch of two",
        ),  # fmt: skip
    ],
)
def test_anything_but_one_boolean_masked_sequence_goes_to_sdpa(change):
    q, k, v, mask = change(*tree_case(torch.float32))
    grouped, _ = grouped_attention(LAYER, q, k, v, mask)
    reference, _ = sdpa_attention_forward(LAYER, q, k, v, mask)
    assert torch.equal(grouped, reference)


def test_the_engine_attends_with_it_only_in_bfloat16(local_engine):
    assert attention_function("float32") == "sdpa"
    assert attention_function("bfloat16") == NAME
    from transformers import AttentionInterface

    assert AttentionInterface()[NAME] is grouped_attention
    # The engine says which kernel read its answers (the float32 engine the tests share: sdpa).
    assert local_engine.capabilities.probe["attention"] == "sdpa"
    assert local_engine.model.config._attn_implementation == "sdpa"
