"""bench/gateway_replay.py: the simulated pool and the picker's scoring on traces small enough to check by hand,
and a recorded trace from the real service."""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import random

import pytest

from bench import gateway_replay as replay_bench
from bench.gateway_replay import (
    PICKER_BLOCK_TOKENS,
    Engine,
    PickerIndex,
    TracedRead,
    block_hashes,
    picker_choice,
    picker_weights,
    replay,
)

STATE = tuple(range(1000, 1000 + 200))  # a 200-token shared prefix


def args(**overrides) -> argparse.Namespace:
    values = dict(engines=2, max_num_seqs=4, kv_blocks=1000, engine_block=16, base_ms=10.0, ms_per_token=0.1,
                  load=0.5, seed=0)  # fmt: skip
    return argparse.Namespace(**{**values, **overrides})


def request(n: int, salt: str, questions: int = 3) -> list[TracedRead]:
    """One decision: ``questions`` reads in one engine call, the state first, then a 10-token question."""
    return [
        TracedRead(n, 1, salt, STATE + tuple(range(q * 10, q * 10 + 10)), len(STATE))
        for q in range(questions)
    ]


def test_the_picker_weights_are_the_shipped_configs():
    assert picker_weights() == {
        "queue-scorer": 2.0,
        "kv-cache-utilization-scorer": 2.0,
        "prefix-cache-scorer": 3.0,
    }


def test_block_hashes_are_chained_salted_and_count_a_partial_block_only_when_asked():
    ids = list(range(150))
    assert len(block_hashes("a", ids, 64, partial=False)) == 2
    assert len(block_hashes("a", ids, 64, partial=True)) == 3
    assert not set(block_hashes("a", ids, 64, partial=True)) & set(block_hashes("b", ids, 64, partial=True))
    # Chained: one changed token in block 1 changes block 1's hash and every later one, not block 0's.
    changed = [*ids[:70], -1, *ids[71:]]
    a, b = block_hashes("a", ids, 64, partial=True), block_hashes("a", changed, 64, partial=True)
    assert a[0] == b[0] and a[1] != b[1] and a[2] != b[2]


def test_the_picker_prefers_a_prefix_match_over_a_shorter_queue():
    engines = [Engine(4, 100), Engine(4, 100)]
    hashes = block_hashes("a", STATE, PICKER_BLOCK_TOKENS, partial=True)
    index = PickerIndex(100)
    index.add(hashes, 0)
    engines[0].waiting = [object()] * 5  # engine 0: the longest queue, so its queue score is 0
    # engine 0: 2·0 + 2·1 + 3·1 = 5; engine 1: 2·1 + 2·1 + 3·0 = 4.
    assert picker_choice(engines, hashes, index, picker_weights(), rng=random.Random(0)) == 0
    index = PickerIndex(100)
    index.add(hashes[:1], 0)  # a quarter of the blocks: 2·0 + 2 + 3·0.25 = 2.75 < 4
    assert picker_choice(engines, hashes, index, picker_weights(), rng=random.Random(0)) == 1


def test_a_state_asked_again_hits_the_cache_and_another_tenant_never_does():
    again = [request(0, "alpha"), request(1, "alpha")]
    for policy in ("affinity", "picker"):
        row = replay(again, policy, args())
        # Affinity keeps both requests on one engine: the first computes the state's 12 full blocks once
        # (192 tokens), then every other read of the six reuses them.
        assert row["prefix_cache_hits"] >= 5 * 192 if policy == "affinity" else row["prefix_cache_hits"] > 0
    other = [request(0, "alpha"), request(1, "beta")]
    for policy in replay_bench.POLICIES:
        own = replay([request(0, "alpha")], policy, args())["prefix_cache_hits"]
        both = replay(other, policy, args())["prefix_cache_hits"]
        assert both == 2 * own  # beta's identical prompt reuses nothing of alpha's


def test_affinity_keeps_a_call_together_and_round_robin_spreads_it():
    trace = [request(n, "alpha") for n in range(4)]
    assert replay(trace, "affinity", args())["requests_split_across_engines"] == 0
    assert replay(trace, "round_robin", args())["requests_split_across_engines"] == 4


def test_record_writes_each_read_with_its_tenants_salt(tmp_path):
    summary = asyncio.run(replay_bench.record(tmp_path, states_per_task=1, long_states=0, seed=3))
    with gzip.open(tmp_path / "trace.jsonl.gz", "rt") as lines:
        rows = [json.loads(line) for line in lines]
    assert summary["reads"] == len(rows) and summary["requests"] == 1 + max(r["request"] for r in rows)
    assert len({r["salt"] for r in rows}) == 2  # two tenants, two salts
    assert all(r["prompt_ids"] and all(isinstance(t, int) for t in r["prompt_ids"]) for r in rows)
    assert any(r["prefix_tokens"] > 0 for r in rows)
    assert replay_bench.read_trace(tmp_path / "trace.jsonl.gz")[0][0].prompt_ids == tuple(
        rows[0]["prompt_ids"]
    )


@pytest.mark.parametrize("policy", replay_bench.POLICIES)
def test_every_read_is_served_once(policy):
    trace = [request(n, "alpha" if n % 2 else "beta", questions=1 + n % 3) for n in range(12)]
    row = replay(trace, policy, args())
    assert row["reads"] == sum(len(r) for r in trace) == sum(row["reads_per_engine"])
