"""What each request of bench/latency.py cost: the engine reads it caused and their tokens (distinct,
computed, cached), per-row aggregates over the samples, and this process's memory."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from readers.engines.base import EngineReply, ReadRequest


class ReadRecordingEngine:
    """The engine it wraps, unchanged, with every read it was asked for and the reply it gave
    kept in ``reads``: what the bench counts tokens on. Everything else is the wrapped engine's."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.reads: list[tuple[ReadRequest, EngineReply]] = []

    def __getattr__(self, name: str) -> Any:  # kind, info, capabilities, tokenizer, …
        return getattr(self.engine, name)

    async def read(self, request: ReadRequest) -> EngineReply:
        reply = await self.engine.read(request)
        self.reads.append((request, reply))
        return reply

    async def read_many(self, requests: Sequence[ReadRequest]) -> list[EngineReply]:
        replies = await self.engine.read_many(requests)
        self.reads.extend(zip(requests, replies))
        return replies

    async def aclose(self) -> None:
        await self.engine.aclose()

    def take(self) -> list[tuple[ReadRequest, EngineReply]]:
        """The reads since the last ``take``."""
        reads, self.reads = self.reads, []
        return reads


def distinct_tokens(prompts: Sequence[Sequence[int]]) -> int:
    """Nodes of the token trie of ``prompts``: the tokens an engine must compute at least once.

    >>> distinct_tokens([(1, 2, 3), (1, 2, 4), (1, 2, 3), (5,)])
    5
    """
    root: dict = {}
    count = 0
    for prompt in prompts:
        node = root
        for token in prompt:
            child = node.get(token)
            if child is None:
                child = node[token] = {}
                count += 1
            node = child
    return count


def block_floor_tokens(prompts: Sequence[Sequence[int]], block_size: int) -> int:
    """The fewest tokens an engine that reuses whole blocks of ``block_size`` computes for ``prompts``
    from an empty cache, in the best order: what ``distinct_tokens`` is for an engine without blocks.

    A read reuses at most its prompt but the last token, in whole blocks (vLLM: the first
    ``(length - 1) // block_size`` blocks), and computes the rest itself, however many reads share
    that rest (the trie levels of a multi-token label: each computes the partial block under its
    last token). Every block below is computed once, by the first read that needs it, unless one
    read's own part already completes it.

    >>> block_floor_tokens([(1, 2, 3, 4, 5), (1, 2, 3, 4, 6)], 2)  # blocks (1, 2), (3, 4) once; 5, 6
    6
    >>> block_floor_tokens([(1, 2, 3, 4), (1, 2, 3, 4, 5)], 2)  # the first's own (3, 4) serves the second
    5
    """
    # A block is named by its parent's name and its tokens: a whole prefix without hashing it anew.
    names: dict[tuple[int, tuple[int, ...]], int] = {}
    required: set[int] = set()
    completed: set[int] = set()
    own = 0
    for prompt in prompts:
        reused = (len(prompt) - 1) // block_size * block_size
        own += len(prompt) - reused
        parent = -1
        for end in range(block_size, len(prompt) + 1, block_size):
            parent = names.setdefault((parent, tuple(prompt[end - block_size : end])), len(names))
            (required if end <= reused else completed).add(parent)
    return own + block_size * len(required - completed)


def token_counts(
    reads: Sequence[tuple[ReadRequest, EngineReply]], block_size: int | None = None
) -> dict[str, Any]:
    """What one request's reads cost: reads, prompt tokens, distinct tokens, the fewest an engine
    with KV blocks of ``block_size`` computes (``block_floor_tokens``; None without a block size),
    and the computed and cached tokens the engine reported (None unless every read reported them)."""
    computed = [reply.computed_tokens for _, reply in reads]
    cached = [reply.cached_tokens for _, reply in reads]
    prompts = [request.prompt_ids for request, _ in reads]
    return {
        "reads": len(reads),
        "prompt_tokens": sum(len(prompt) for prompt in prompts),
        "distinct_tokens": distinct_tokens(prompts),
        "block_floor_tokens": block_floor_tokens(prompts, block_size) if block_size else None,
        "computed_tokens": None if None in computed or not reads else sum(computed),
        "cached_tokens": None if None in cached or not reads else sum(cached),
    }


def memory_mib() -> dict[str, float]:
    """This process's resident memory now (VmRSS) and at its peak (VmHWM), MiB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def reset_peak_memory() -> bool:
    """Reset VmHWM to the current RSS (``5`` to clear_refs, Linux ≥ 4.0); False where refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def summary(samples: Sequence[float]) -> dict[str, float | None]:
    if not samples:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples)}


class Rows:
    """Per-request samples of each (shape, variant) row, aggregated at the end."""

    def __init__(self) -> None:
        self.samples: dict[tuple[str, str], list[dict]] = {}

    def add(self, shape: str, variant: str, sample: dict) -> None:
        self.samples.setdefault((shape, variant), []).append(sample)

    def aggregate(self, limit_tokens_per_s: float) -> list[dict]:
        rows = []
        for (shape, variant), samples in self.samples.items():
            done = [s for s in samples if s["ok"]]
            latencies = [s["latency_ms"] for s in done]
            effective = [s["distinct_tokens"] / (s["latency_ms"] / 1000) for s in done]
            computed = [s["computed_tokens"] for s in done]
            known = None not in computed and bool(done)
            floors = [s.get("block_floor_tokens") for s in done]
            floored = None not in floors and bool(done)
            hits = [s["prefix_cache_hits"] for s in done if s.get("prefix_cache_hits") is not None]
            queries = [s["prefix_cache_queries"] for s in done if s.get("prefix_cache_queries") is not None]
            row = {
                "shape": shape,
                "variant": variant,
                "requests": len(samples),
                "failed": len(samples) - len(done),
                **{f"{k}_ms": v for k, v in summary(latencies).items()},
                "reads": statistics.median([s["reads"] for s in done]) if done else None,
                "prompt_tokens": statistics.median([s["prompt_tokens"] for s in done]) if done else None,
                "distinct_tokens": statistics.median([s["distinct_tokens"] for s in done]) if done else None,
                "computed_tokens": statistics.median(computed) if known else None,
                "computed_over_distinct": statistics.median(
                    [s["computed_tokens"] / s["distinct_tokens"] for s in done]
                )
                if known
                else None,
                "block_floor_tokens": statistics.median(floors) if floored else None,
                "computed_over_block_floor": statistics.median(
                    [s["computed_tokens"] / s["block_floor_tokens"] for s in done]
                )
                if known and floored
                else None,
                "cached_tokens": statistics.median([s["cached_tokens"] for s in done])
                if done and None not in [s["cached_tokens"] for s in done]
                else None,
                "effective_tokens_per_s": statistics.median(effective) if effective else None,
                "effective_over_limit": statistics.median(effective) / limit_tokens_per_s
                if effective
                else None,
                "samples_ms": latencies,
            }
            if queries:
                row["prefix_cache_hit_rate"] = sum(hits) / sum(queries) if sum(queries) else None
            rows.append(row)
        return rows
