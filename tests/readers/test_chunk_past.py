"""The chunked forward's ``_Past``: the keys and values a batch's chunks attend to, kept from chunk to
chunk. Stand-in keys (each token's holds its segment and offset) through real plans of the token
tree, so what each chunk sees and what was copied are checked without a model;
tests/readers/test_shared_reads.py checks the reads against the model's own forward."""

from __future__ import annotations

import pytest
import torch

from readers.engines.chunked import _Past
from readers.engines.kvtree import KV_TOKEN_DIM, KVTree

SHAPE = (1, 2, 1, 1)  # layers, keys and values, kv heads, head dim


def stand_in(segment, offset: int) -> float:
    return segment.order * 10_000 + offset


def compute(tree: KVTree, prompts, max_queries: int) -> list[int]:
    """Runs ``prompts`` chunk by chunk through a ``_Past``, writing each new token's stand-in where
    the layers would; checks every chunk's past against the keys it attends to; returns the tokens
    each chunk's ``hold`` copied in."""
    plan = tree.plan(prompts, [True] * len(prompts))
    past = _Past(SHAPE, torch.float32, max(len(ids) for ids in prompts))
    copied = []
    for queries in plan.chunks(max_queries, 2**22):
        chunk = plan.chunk_keys(queries)
        before = past.copied_tokens
        kv = past.hold(chunk)
        copied.append(past.copied_tokens - before)
        expected = [kv_piece for _, kv_piece in chunk.keys]
        if expected:
            held = kv.narrow(KV_TOKEN_DIM, 0, chunk.key_tokens)
            assert torch.equal(held, torch.cat(expected, dim=KV_TOKEN_DIM))
        new = (
            torch.tensor([stand_in(s, o) for s, o in queries]).reshape(1, 1, 1, -1, 1).expand(1, 2, 1, -1, 1)
        )
        kv.narrow(KV_TOKEN_DIM, chunk.key_tokens, len(queries)).copy_(new)  # as the layers write
        at = chunk.key_tokens
        for segment, offset in queries:
            segment.add_keys(kv.narrow(KV_TOKEN_DIM, at, 1))
            assert segment.filled == offset + 1
            at += 1
    tree.finish(plan)
    return copied


def test_a_long_prompt_copies_no_past_after_its_first_chunk():
    """A 600-token prompt in 16-token chunks: each chunk's past is the last chunk's past and tokens,
    already in place (copied anew per chunk it would be 16 + 32 + ... + 592 tokens)."""
    copied = compute(KVTree(2**20), [tuple(range(1000, 1600))], max_queries=16)
    assert len(copied) == 38 and sum(copied) == 0


def test_branches_copy_only_what_the_last_chunk_did_not_hold():
    """A shared 200-token prefix, then two 40-token branches, in 16-token chunks: the second branch's
    chunks find the prefix in place (their past drops the first branch's tokens after it); at most
    the first branch's tokens that shared a chunk with the second's are copied, never the prefix."""
    prefix = tuple(range(1000, 1200))
    prompts = [prefix + tuple(range(1, 41)), prefix + tuple(range(41, 81))]
    copied = compute(KVTree(2**20), prompts, max_queries=16)
    assert sum(copied) <= 40, copied


def test_a_past_from_the_tree_is_copied_once_then_kept():
    tree = KVTree(2**20)
    prefix = tuple(range(1000, 1300))
    compute(tree, [prefix + (1,)], max_queries=64)
    copied = compute(tree, [prefix + tuple(range(2, 100))], max_queries=16)
    assert copied[0] == len(prefix) and sum(copied[1:]) == 0, copied


@pytest.mark.parametrize("max_queries", [1, 7, 64])
def test_every_chunk_attends_to_exactly_its_keys_in_a_trie_of_reads(max_queries):
    """Reads that end inside each other and branch at several depths (a token trie under a state),
    cut into chunks of any size: ``compute`` checks each chunk's held past against its keys."""
    state = tuple(range(500, 620))
    names = [(1, 2, 3), (1, 2, 4), (1, 5), (6,), (6, 7, 8, 9)]
    prompts = [state + name[:depth] for name in names for depth in range(1, len(name) + 1)]
    copied = compute(KVTree(2**20), prompts, max_queries=max_queries)
    assert sum(copied) <= sum(len(name) for name in names)  # the state is never copied
