"""The radix tree of prompt tokens on its own: what a batch computes, what it reuses, what the tree keeps.

Keys and values here are stand-ins (a tensor per token holding its position), so the plans and the
eviction are checked without a model; tests/readers/test_shared_reads.py checks the reads against the
model's own single-sequence forward.
"""

from __future__ import annotations

import threading

import pytest
import torch

from readers.engines.kvtree import KV_TOKEN_DIM, KVTree, Plan, _common
from tests.readers.support import distinct_tokens

TOKEN_BYTES = 1 * 2 * 1 * 1 * 4  # [layers, 2, heads, tokens, dim] float32 with one of each


def run(
    tree: KVTree,
    prompts,
    reuse=True,
    *,
    keep=None,
    max_queries=512,
    max_scores=2**22,
    salts=None,
    hidden=False,
) -> Plan:
    """Plans and "computes" ``prompts``: each token's stand-in keys hold its position; with
    ``hidden``, each read's stand-in final hidden state (its prompt, as floats) is given to the tree."""
    reuse = [reuse] * len(prompts) if isinstance(reuse, bool) else reuse
    plan = tree.plan(prompts, reuse, keep, salts=salts)
    for queries in plan.chunks(max_queries, max_scores):
        chunk = plan.chunk_keys(queries)
        visible = chunk.visible()
        assert visible.shape == (len(queries), chunk.key_tokens + len(queries))
        for segment, offset in queries:
            kv = torch.full((1, 2, 1, 1, 1), float(segment.start + offset))
            segment.add_keys(kv)
    tree.finish(plan, [state_of(ids) for ids in prompts] if hidden else None)
    return plan


def state_of(ids) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.float32)


def test_a_prompt_read_again_takes_its_hidden_state_from_the_tree():
    """The tree keeps each read's final hidden state where the read ended: the same prompts again
    compute nothing and get exactly those states back (a repeated request of many options)."""
    tree = KVTree(2**20)
    state = tuple(range(100, 140))
    prompts = [state + (1, 2, 3), state + (1, 2), state + (5,)]
    run(tree, prompts, hidden=True)
    again = run(tree, prompts, hidden=True)
    assert again.computed_tokens == [0, 0, 0] and again.outputs == [None, None, None]
    assert again.cached_tokens == [len(ids) for ids in prompts]
    assert all(torch.equal(again.kept[i], state_of(ids)) for i, ids in enumerate(prompts))
    # A prompt ending at a held token no read ended at computes that token again, then keeps it.
    inner = state + (1,)
    assert run(tree, [inner], hidden=True).computed_tokens == [1]
    assert run(tree, [inner], hidden=True).computed_tokens == [0]


def test_kept_hidden_states_follow_a_split_and_count_in_the_byte_bound():
    tree = KVTree(2**20)
    run(tree, [(1, 2, 3, 4, 5)], hidden=True)
    assert tree.stats()["bytes"] == 5 * TOKEN_BYTES + state_of((1, 2, 3, 4, 5)).nbytes
    run(tree, [(1, 2, 3, 7)], hidden=True)  # splits (1, 2, 3, 4, 5) after its third token
    again = run(tree, [(1, 2, 3, 4, 5), (1, 2, 3, 7)])
    assert again.computed_tokens == [0, 0]
    assert torch.equal(again.kept[0], state_of((1, 2, 3, 4, 5)))
    tree.clear()
    assert tree.stats()["bytes"] == 0
    # Reads not to keep (content-free priors) leave no state behind, nor do reads computed alone.
    run(tree, [(1, 2, 3)], keep=[False], hidden=True)
    run(tree, [(4, 5, 6)], reuse=False, hidden=True)
    assert tree.stats()["bytes"] == 0
    assert run(tree, [(1, 2, 3)]).computed_tokens == [3]


def test_every_distinct_token_of_a_batch_is_computed_once_and_charged_to_one_read():
    tree = KVTree(2**20)
    state = tuple(range(100, 140))
    prompts = [state + (1, 2, 3), state + (1, 2, 4), state + (5,), state + (1, 2, 3)]
    plan = run(tree, prompts)
    assert sum(plan.computed_tokens) == distinct_tokens(prompts)
    assert plan.computed_tokens == [len(prompts[0]), 1, 1, 0]  # the repeat shares every token
    assert [p + c for p, c in zip(plan.computed_tokens, plan.cached_tokens)] == [len(ids) for ids in prompts]
    again = run(tree, prompts)  # all in the tree: each prompt's last token is read again, once
    assert again.computed_tokens == [1, 1, 1, 0]
    assert sum(again.cached_tokens) == sum(map(len, prompts)) - sum(again.computed_tokens)


def test_a_query_sees_exactly_the_tokens_before_it_in_its_own_prompt():
    tree = KVTree(2**20)
    run(tree, [(1, 2, 3, 4, 5)])  # in the tree now
    plan = tree.plan([(1, 2, 3, 7, 8), (1, 2, 9), (1, 2, 3, 4, 5)], [True] * 3)
    for queries in plan.chunks(2, 2**22):  # two tokens per forward: segments split across chunks
        chunk = plan.chunk_keys(queries)
        visible = chunk.visible()
        _, key_positions = chunk.positions()
        owners = [segment for segment, _ in chunk.keys for _ in range(segment_length(segment, chunk))]
        owners += [segment for segment, _ in queries]
        for row, (segment, offset) in enumerate(queries):
            prompt = path_tokens(segment)[: segment.start + offset + 1]
            seen = [
                (path_tokens(owner)[position], position)
                for owner, position, on in zip(owners, key_positions.tolist(), visible[row].tolist())
                if on
            ]
            assert seen == [(token, n) for n, token in enumerate(prompt)], (segment.tokens, offset)
        for segment, _ in queries:
            segment.add_keys(torch.zeros(1, 2, 1, 1, 1))
    tree.finish(plan)


def segment_length(segment, chunk) -> int:
    return next(kv.shape[KV_TOKEN_DIM] for s, kv in chunk.keys if s is segment)


def path_tokens(segment) -> tuple[int, ...]:
    chain = []
    while segment is not None:
        chain.append(segment.tokens)
        segment = segment.parent
    return tuple(token for tokens in reversed(chain) for token in tokens)


def test_chunks_hold_bounded_queries_and_scores_and_keep_depth_first_order():
    tree = KVTree(2**20)
    question = tuple(range(1000, 1300))
    prompts = [question + (n,) for n in range(50)]
    plan = tree.plan(prompts, [True] * len(prompts))
    chunks = plan.chunks(64, 64 * 400)
    assert all(len(chunk) <= 64 for chunk in chunks)
    for chunk in chunks:
        keys = plan.chunk_keys(chunk).key_tokens + len(chunk)
        assert len(chunk) == 1 or len(chunk) * keys <= 64 * 400
        for segment, _ in chunk:
            segment.add_keys(torch.zeros(1, 2, 1, 1, 1))
    flat = [query for chunk in chunks for query in chunk]
    assert len(flat) == distinct_tokens(prompts)
    tree.finish(plan)


def test_the_per_question_path_computes_every_prompt_whole_and_keeps_nothing():
    tree = KVTree(2**20)
    prompts = [(1, 2, 3), (1, 2, 3)]
    plan = run(tree, prompts, reuse=False)
    assert plan.computed_tokens == [3, 3] and plan.cached_tokens == [0, 0]
    assert tree.stats()["tokens"] == 0


def test_the_tree_is_bounded_and_evicts_the_least_recently_used_leaves():
    tree = KVTree(max_bytes=30 * TOKEN_BYTES)
    first, second, third = tuple(range(10)), tuple(range(100, 110)), tuple(range(200, 210))
    run(tree, [first])
    run(tree, [second])
    run(tree, [first + (7,)])  # uses first again: second is now the least recently used
    run(tree, [third])
    stats = tree.stats()
    assert stats["bytes"] <= 30 * TOKEN_BYTES and stats["evicted_nodes"] >= 1
    assert sum(run(tree, [first + (8,)]).computed_tokens) == 1  # first is kept
    assert sum(run(tree, [second + (9,)]).computed_tokens) == 11  # second was evicted
    tree.clear()
    assert tree.stats()["bytes"] == 0 and sum(run(tree, [first + (8,)]).computed_tokens) == 11
    off = KVTree(0)
    run(off, [first])
    assert off.stats() | {"computed_tokens": 0, "reused_tokens": 0} == {
        "salts": 0,
        "nodes": 0,
        "tokens": 0,
        "bytes": 0,
        "max_bytes": 0,
        "computed_tokens": 0,
        "reused_tokens": 0,
        "evicted_nodes": 1,
    }
    with pytest.raises(ValueError, match="prefix_cache_mib"):
        KVTree(-1)


def test_a_failed_batch_leaves_nothing_half_computed():
    tree = KVTree(2**20)
    plan = tree.plan([(1, 2, 3)], [True])
    tree.abandon(plan)
    assert sum(run(tree, [(1, 2, 3, 4)]).computed_tokens) == 4  # nothing of (1, 2, 3) was kept


def test_a_batch_waits_for_tokens_another_batch_is_computing_then_reuses_them():
    tree = KVTree(2**20)
    state = tuple(range(50))
    first = tree.plan([state + (1,)], [True])
    planned: list[Plan] = []
    second = threading.Thread(target=lambda: planned.append(tree.plan([state + (2,)], [True])))
    second.start()
    second.join(timeout=0.2)
    assert second.is_alive()  # waiting: the state is being computed by the first batch
    for queries in first.chunks(512, 2**22):
        for segment, _ in queries:
            segment.add_keys(torch.zeros(1, 2, 1, 1, 1))
    tree.finish(first)
    second.join(timeout=5)
    assert planned and planned[0].computed_tokens == [1]  # only its own question token


def test_another_tenants_batch_computes_the_tokens_itself_instead_of_waiting():
    """Issue 39: tenant b's short prompt ran into the system prompt that tenant a's forty-state batch
    was computing and waited for the whole batch (p50 30 s). It now computes its prompt on its own at
    once; a batch of a's own still waits and reuses."""
    tree = KVTree(2**20)
    system = tuple(range(30))
    flood = tree.plan([system + tuple(range(100, 400))], [True], tenant="a")
    polite = tree.plan([system + (7, 8)], [True], wait=False, tenant="b")
    assert polite is not None and polite.computed_tokens == [32]  # the whole prompt, no waiting
    assert tree.plan([system + (9,)], [True], wait=False, tenant="a") is None  # a's own: waits
    for plan in (flood, polite):
        for queries in plan.chunks(512, 2**22):
            for segment, _ in queries:
                segment.add_keys(torch.zeros(1, 2, 1, 1, 1))
        tree.finish(plan)
    assert tree.plan([system + (9,)], [True], wait=False, tenant="a").computed_tokens == [1]


def test_reads_not_to_keep_share_a_batch_and_leave_the_tree_after_it():
    """Content-free prior reads (ReadRequest.keep False) must not evict the question they serve."""
    tree = KVTree(2**20)
    system = tuple(range(20))
    question = system + tuple(range(100, 130))
    prior_reads = [system + (n,) + tuple(range(100, 130)) for n in (7, 8, 9)]
    plan = run(tree, [question, *prior_reads], keep=[True, False, False, False])
    assert sum(plan.computed_tokens) == distinct_tokens([question, *prior_reads])
    assert tree.stats()["tokens"] == len(question)  # the system line is kept: the question passes through it
    assert sum(run(tree, [question]).computed_tokens) == 1
    assert sum(run(tree, [prior_reads[0]]).computed_tokens) == len(prior_reads[0]) - len(system)


def test_a_prompt_reuses_only_tokens_of_its_own_salt():
    """One tree per cache salt (issue 40): salt b's identical prompt computes every token; salt a's
    again reuses them; a salt whose tokens all left the tree leaves no root behind."""
    tree = KVTree(2**20)
    prompt = tuple(range(100, 140))
    run(tree, [prompt], salts=["a"])
    other = run(tree, [prompt], salts=["b"])
    assert other.cached_tokens == [0] and other.computed_tokens == [len(prompt)]
    assert run(tree, [prompt], salts=["a"]).cached_tokens == [len(prompt) - 1]
    both = run(tree, [prompt, prompt + (7,)], salts=["a", "c"])  # one batch, two salts
    assert both.cached_tokens == [len(prompt) - 1, 0]
    assert tree.stats()["salts"] == 3
    tree.clear()
    assert tree.stats()["salts"] == 0


@pytest.mark.parametrize("length", [1, 2, 3, 7, 64, 1000])
def test_common_counts_the_matching_run_at_every_mismatch(length):
    tokens = tuple(range(length))
    for at in (0, 5):
        for cut in range(length + 1):
            changed = tokens[:cut] + tuple(-1 - t for t in tokens[cut:])
            ids = (9,) * at + changed
            assert _common(tokens, ids, at) == cut
            assert _common(tokens, (9,) * at + tokens[:cut], at) == cut  # the prompt ends inside the node


def test_a_salt_streaming_new_states_evicts_its_own_tokens_not_a_salt_holding_less():
    """Past the bound, the salt holding the most gives back its least recently used leaves first: b's
    stream of new prompts never evicts a's prompt, though a's was used least recently of all."""
    tree = KVTree(max_bytes=40 * TOKEN_BYTES)
    kept = tuple(range(10))
    run(tree, [kept], salts=["a"])
    for i in range(10):
        run(tree, [tuple(range(1000 * (i + 1), 1000 * (i + 1) + 10))], salts=["b"])
    assert tree.stats()["bytes"] <= 40 * TOKEN_BYTES
    assert run(tree, [kept + (1,)], salts=["a"]).computed_tokens == [1]  # a's ten tokens were kept
    # b's own: its latest prompts are kept, its oldest went.
    assert run(tree, [tuple(range(10_000, 10_010)) + (1,)], salts=["b"]).computed_tokens == [1]
    assert run(tree, [tuple(range(1000, 1010)) + (1,)], salts=["b"]).computed_tokens == [11]
