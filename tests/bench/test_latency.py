"""bench/latency.py end to end on the embedded model: one shape, one repeat, every JSON field there.

The figures themselves are never checked (no timed assertions): only that the run measures what its
docstring says, through the service, and counts tokens as defined.
"""

from __future__ import annotations

import json

import pytest

from bench import latency, latency_costs, latency_report
from readers.engines.base import EngineReply, ReadMode, ReadRequest


def reply(computed: int | None, cached: int | None) -> EngineReply:
    return EngineReply({1: -0.1}, ReadMode.EXACT, 3, 1.0, computed_tokens=computed, cached_tokens=cached)


def test_distinct_tokens_are_the_nodes_of_the_prompts_token_trie():
    assert latency_costs.distinct_tokens([]) == 0
    assert latency_costs.distinct_tokens([(1, 2, 3), (1, 2, 4), (1, 2, 3), (5,)]) == 5
    assert latency_costs.distinct_tokens([(1, 2), (1, 2, 3, 4)]) == 4  # a prompt inside another adds nothing


def test_tokens_computed_are_known_only_when_every_read_reports_them():
    a, b = ReadRequest((1, 2, 3), (7,), ("x",)), ReadRequest((1, 2, 4), (7,), ("x",))
    counts = latency_costs.token_counts([(a, reply(3, 0)), (b, reply(1, 2))])
    assert counts == {
        "reads": 2,
        "prompt_tokens": 6,
        "distinct_tokens": 4,
        "block_floor_tokens": None,
        "computed_tokens": 4,
        "cached_tokens": 2,
    }
    assert latency_costs.token_counts([(a, reply(3, 0)), (b, reply(None, None))])["computed_tokens"] is None
    assert latency_costs.token_counts([(a, reply(3, 0)), (b, reply(1, 2))], 2)["block_floor_tokens"] == 4


def test_the_block_floor_charges_each_read_its_last_partial_block():
    """vLLM reuses whole blocks below a prompt's last token only: reads that share a prefix ending
    inside a block each compute that block's tokens, which the token trie counts once."""
    floor = latency_costs.block_floor_tokens
    trie_level = [tuple(range(40)) + (node,) for node in (100, 101, 102)]  # blocks of 32: 8 + 1 each
    assert latency_costs.distinct_tokens(trie_level) == 43
    assert floor(trie_level, 32) == 32 + 3 * 9
    assert floor(trie_level, 1) == 43  # blocks of one token: the token trie itself
    assert floor([tuple(range(32))], 32) == 32  # the last token is always computed, so its whole block
    assert (
        floor([tuple(range(32)), tuple(range(33))], 32) == 33
    )  # the first computes the block the second reuses
    assert floor([], 32) == 0


def test_the_eight_question_floor_adds_only_the_extra_tokens_at_the_limit():
    def row(shape: str, ms: float, computed: int | None, variant: str = "cached") -> dict:
        return {"shape": shape, "variant": variant, "median_ms": ms, "computed_tokens": computed}

    # One question 100 ms computing 20 tokens; eight compute 120 more: at 1,000 tokens/s that is
    # 120 ms more, so no engine at that speed answers the eight in under 220 ms (2.2× one). The
    # fresh-state rows beside them are not the cached ones.
    fresh = [row("q1", 900, 200, "fresh"), row("q8", 1500, 330, "fresh")]
    floor = latency_report.questions_floor(fresh + [row("q1", 100, 20), row("q8", 250, 140)], 1000.0)
    assert floor == {
        "one_ms": 100,
        "extra_tokens": 120,
        "floor_ms": pytest.approx(220),
        "floor_ratio": pytest.approx(2.2),
        "measured_ratio": pytest.approx(2.5),
    }
    assert latency_report.questions_floor([row("q1", 100, 20)], 1000.0) is None  # no eight-question row
    assert latency_report.questions_floor(fresh, 1000.0) is None  # fresh states only
    assert latency_report.questions_floor([row("q1", 100, None), row("q8", 250, 140)], 1000.0) is None


@pytest.mark.slow  # loads a second copy of the model and runs ~256-token forwards: about 20 s on two cores
@pytest.mark.anyio
async def test_one_shape_end_to_end_on_the_embedded_model(tmp_path):
    args = latency.parser().parse_args(["--shapes", "choice4", "--repeats", "1", "--limit-repeats", "1"])
    result = await latency.main(args)
    json.dumps(result)  # the file --out writes

    manifest = result["manifest"]
    assert manifest["run"] == "bench:latency" and manifest["args"]["shapes"] == ["choice4"]
    assert set(manifest["engines"]) == {"local"} and manifest["engines"]["local"]["revision"]
    assert {"commit", "dirty"} <= set(manifest["git"]) and result["machine"]["cores"] >= 1

    local = result["engines"]["local"]
    limit = local["limit"]
    assert limit["prompt_tokens"] == 256 and "1" in limit["by_threads_tokens_per_s"]
    assert limit["tokens_per_s"] == pytest.approx(max(limit["by_threads_tokens_per_s"].values()))
    assert local["threads"]["compute_threads"] == 1
    rows = {row["variant"]: row for row in local["rows"]}
    assert set(rows) == {"first-seen", "again"} and {row["shape"] for row in local["rows"]} == {"choice4"}
    first, again = rows["first-seen"], rows["again"]
    for row in (first, again):
        assert row["requests"] == 1 and row["failed"] == 0 and row["median_ms"] > 0
        assert row["distinct_tokens"] <= row["prompt_tokens"]
        assert row["effective_over_limit"] == pytest.approx(
            row["effective_tokens_per_s"] / local["limit"]["tokens_per_s"]
        )
        if row["computed_tokens"] is None:  # an engine that does not report what it computed
            assert row["computed_over_distinct"] is None
    # A question seen for the first time also pays its content-free prior reads; asked again, it does not.
    assert first["reads"] > again["reads"] and first["distinct_tokens"] > again["distinct_tokens"]
    memory = local["memory"]
    assert memory["after_shape"] == "choice4" and memory["peak_rss_mib"] >= memory["retained_rss_mib"] > 0
    assert "| choice4 | first-seen |" in latency_report.report(result)


def test_the_report_prints_the_floor_beside_the_measured_ratio():
    def row(shape: str, ms: float, computed: int) -> dict:
        return {
            "shape": shape, "variant": "cached", "failed": 0, "median_ms": ms, "min_ms": ms, "max_ms": ms,
            "reads": 1, "distinct_tokens": 232, "computed_tokens": computed, "computed_over_distinct": 0.1,
            "effective_tokens_per_s": 1.0, "effective_over_limit": 0.1,
        }  # fmt: skip

    limit = {"tokens_per_s": 1000.0, "range_tokens_per_s": [990.0, 1010.0], "prompt_tokens": 256,
             "threads": 2, "by_threads_tokens_per_s": {"2": 1000.0}}  # fmt: skip
    result = {
        "machine": {"cpu": "cpu", "cores": 2},
        "manifest": {"args": {"repeats": 3, "state": "short"}},
        "engines": {
            "local": {"kind": "local", "limit": limit, "rows": [row("q1", 100, 20), row("q8", 250, 140)]}
        },
    }
    assert (
        "8 questions on a cached state: 2.50× one question; floor 2.20× at the limit "
        "(one question's 100 ms + 120 more tokens computed = 220 ms)"
    ) in latency_report.report(result)
    # An engine with KV blocks (vLLM) gets the block floor beside the distinct tokens.
    blocked = row("q1", 100, 20) | {"block_floor_tokens": 240, "computed_over_block_floor": 0.08}
    result["engines"]["local"] |= {"kv_block_size": 32, "rows": [blocked]}
    assert "| q1 | cached | 100 (100–100) | 1 | 232 | 20 | 0.10 | 240 | 0.08 |" in latency_report.report(
        result
    )


def test_layouts_to_compare_are_named_from_the_registry():
    """``--prompt-versions`` reads the option shapes under each layout named; an unknown one is
    refused before any engine starts."""
    args = latency.parser().parse_args(["--prompt-versions", "decide-prompt/7", "decide-prompt/9"])
    assert args.prompt_versions == ["decide-prompt/7", "decide-prompt/9"]
    assert latency.parser().parse_args([]).prompt_versions == [latency.PROMPT_VERSION]
    with pytest.raises(SystemExit):
        latency.parser().parse_args(["--prompt-versions", "decide-prompt/0"])
