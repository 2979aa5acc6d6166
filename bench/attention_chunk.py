"""One layer's attention for one chunk of trie-node tokens over a long option list, per precision.

The shape of a repeated 255-described-option question on the embedded SmolLM2 (docs/shared-state.md,
"The embedded engine in bfloat16"): ``--queries`` new tokens (a 128-token chunk) attending to
``--keys`` keys (the ~3,900-token list and the chunk), 9 query heads and 3 key/value heads of 64, a
boolean mask, through ``torch.nn.functional.scaled_dot_product_attention`` as the local engine's
forward runs it. Printed per precision: the median ms of ``--repeats`` calls and the GFLOP/s
(multiply-adds of the scores and of the weighted values, counted twice).

    .venv/bin/python -m bench.attention_chunk
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def median_ms(dtype: torch.dtype, queries: int, keys: int, repeats: int) -> float:
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, HEADS, queries, HEAD_DIM, generator=generator).to(dtype)
    k = torch.randn(1, KV_HEADS, keys, HEAD_DIM, generator=generator).to(dtype)
    v = torch.randn(1, KV_HEADS, keys, HEAD_DIM, generator=generator).to(dtype)
    mask = torch.ones(1, 1, queries, keys, dtype=torch.bool)
    mask[..., keys - queries :] = torch.tril(torch.ones(queries, queries, dtype=torch.bool))
    F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, default=128)
    parser.add_argument("--keys", type=int, default=4028)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    flop = 2 * 2 * HEADS * args.queries * args.keys * HEAD_DIM
    print(
        f"{args.queries} queries × {args.keys} keys, {torch.get_num_threads()} threads, torch {torch.__version__}\n"
    )
    print("| precision | ms, median | GFLOP/s |")
    print("|---|---|---|")
    for dtype in (torch.float32, torch.bfloat16):
        ms = median_ms(dtype, args.queries, args.keys, args.repeats)
        print(f"| {str(dtype).removeprefix('torch.')} | {ms:.1f} | {flop / ms / 1e6:.0f} |")


if __name__ == "__main__":
    main()
