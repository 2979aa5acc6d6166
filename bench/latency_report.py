"""The printed report of bench/latency.py (also the markdown beside its JSON): per engine its limit,
one table row per (shape, variant), the eight-question floor and the process's memory."""

from __future__ import annotations

from collections.abc import Sequence


def fmt(value: float | None, spec: str = ".0f") -> str:
    return "n/a" if value is None else format(value, spec)


def questions_floor(rows: Sequence[dict], limit_tokens_per_s: float) -> dict | None:
    """What 8 questions on a cached state cost at least, beside one: one question's measured latency
    plus the tokens the 8 compute beyond it at the raw limit. The ratio of that floor to one question
    is the best any engine that computes those tokens at this machine's raw speed can reach; None
    unless both cached rows ran and reported the tokens they computed."""
    by_shape = {(row["shape"], row["variant"]): row for row in rows}
    one, eight = by_shape.get(("q1", "cached")), by_shape.get(("q8", "cached"))
    if not one or not eight or None in (one["median_ms"], eight["median_ms"]):
        return None
    if None in (one["computed_tokens"], eight["computed_tokens"]):
        return None
    extra = eight["computed_tokens"] - one["computed_tokens"]
    floor_ms = one["median_ms"] + extra / limit_tokens_per_s * 1000
    return {
        "one_ms": one["median_ms"],
        "extra_tokens": extra,
        "floor_ms": floor_ms,
        "floor_ratio": floor_ms / one["median_ms"],
        "measured_ratio": eight["median_ms"] / one["median_ms"],
    }


def threads(count: int) -> str:
    return f"{count} thread" + ("s" if count != 1 else "")


def report(result: dict) -> str:
    machine = result["machine"]
    args = result["manifest"]["args"]
    lines = [
        f"machine: {machine['cpu']} ({machine['cores']} cores); repeats per row: {args['repeats']}; "
        f"option shapes on the {args['state']} state; one request at a time; latency median (min–max)",
    ]
    for name, engine in result["engines"].items():
        limit = engine["limit"]
        lines += [
            "",
            f"## {name} ({engine['kind']}): limit {limit['tokens_per_s']:.0f} prompt tokens/s "
            f"({limit['range_tokens_per_s'][0]:.0f}–{limit['range_tokens_per_s'][1]:.0f}, "
            f"{limit['prompt_tokens']}-token fresh prompt"
            + (f", {threads(limit['threads'])}" if limit["threads"] else "")
            + ")"
            + "".join(
                f"; at {threads(int(count))}: {speed:.0f} tokens/s"
                for count, speed in limit["by_threads_tokens_per_s"].items()
                if int(count) != limit["threads"]
            ),
        ]
        if engine.get("threads"):
            lines.append("engine threads: " + ", ".join(f"{k} {v}" for k, v in engine["threads"].items()))
        vllm = any("prefix_cache_hit_rate" in row for row in engine["rows"])
        blocks = engine.get("kv_block_size")
        if blocks:
            lines.append(
                f"KV blocks of {blocks} tokens: the block floor is the fewest tokens an engine reusing "
                "whole blocks computes for the request's reads (bench/latency_costs.py block_floor_tokens)"
            )
        lines += [
            "",
            "| shape | variant | ms | reads | distinct tokens | computed | computed ÷ distinct |"
            + (" block floor | computed ÷ floor |" if blocks else "")
            + " effective tok/s | ÷ limit |"
            + (" cached (replies) | prefix-cache hit rate |" if vllm else ""),
            "|---|---|---|---|---|---|---|"
            + ("---|---|" if blocks else "")
            + "---|---|"
            + ("---|---|" if vllm else ""),
        ]
        for row in engine["rows"]:
            failed = f" [{row['failed']} failed]" if row["failed"] else ""
            cells = [
                row["shape"],
                row["variant"],
                f"{fmt(row['median_ms'])} ({fmt(row['min_ms'])}–{fmt(row['max_ms'])}){failed}",
                fmt(row["reads"]),
                fmt(row["distinct_tokens"]),
                fmt(row["computed_tokens"]),
                fmt(row["computed_over_distinct"], ".2f"),
            ]
            if blocks:
                cells += [fmt(row["block_floor_tokens"]), fmt(row["computed_over_block_floor"], ".2f")]
            cells += [
                fmt(row["effective_tokens_per_s"]),
                fmt(row["effective_over_limit"], ".2f"),
            ]
            if vllm:
                cells += [fmt(row["cached_tokens"]), fmt(row.get("prefix_cache_hit_rate"), ".1%")]
            lines.append("| " + " | ".join(cells) + " |")
        floor = questions_floor(engine["rows"], limit["tokens_per_s"])
        if floor:
            lines += [
                "",
                f"8 questions on a cached state: {floor['measured_ratio']:.2f}× one question; floor "
                f"{floor['floor_ratio']:.2f}× at the limit (one question's {fmt(floor['one_ms'])} ms + "
                f"{fmt(floor['extra_tokens'])} more tokens computed = {fmt(floor['floor_ms'])} ms)",
            ]
        memory = engine.get("memory")
        if memory:
            lines += [
                "",
                f"process RSS around {memory['after_shape']}: before {memory['before_rss_mib']:.0f} MiB, "
                f"peak {memory['peak_rss_mib']:.0f} MiB"
                + ("" if memory["peak_reset_before_shape"] else " (peak since the process started)")
                + f", retained {memory['retained_rss_mib']:.0f} MiB",
            ]
    return "\n".join(lines)
