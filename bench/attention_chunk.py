"""One layer's attention for one chunk of trie-node tokens over a long option list, per precision.

The shape of a repeated 255-described-option question on the embedded SmolLM2 (docs/shared-state.md,
"The embedded engine in bfloat16"): ``--queries`` new tokens (a 128-token chunk) attending to
``--keys`` keys (the ~3,900-token list and the chunk), 9 query heads and 3 key/value heads of 64, a
boolean mask, through each kernel the local engine can run: transformers' sdpa function (torch's fused
``scaled_dot_product_attention``, the float32 engine's) and ``readers/engines/attention.py``'s grouped
matrix products (the bfloat16 engine's). The inputs are what a layer gets in the chunked forward: keys
and values held in a larger tensor (``readers/engines/chunked.py:_Past`` keeps room for the chunks to
come), and for the grouped kernel the mask prepared once (``ForwardMasks``), as for a forward's 30
layers, so each call times one layer. Printed per kernel and precision, measured in one run: the
median ms of ``--repeats`` calls, the GFLOP/s (multiply-adds of the scores and of the weighted values,
counted twice) and the largest difference from float32 sdpa's output.

    .venv/bin/python -m bench.attention_chunk
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64
ROOM = 512  # tokens of room after the keys in the tensor that holds them


def median_ms(kernel, inputs: tuple, repeats: int) -> tuple[float, torch.Tensor]:
    out = kernel(*inputs)  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        kernel(*inputs)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), out.float()


def inputs(dtype: torch.dtype, queries: int, keys: int) -> tuple:
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, HEADS, queries, HEAD_DIM, generator=generator).to(dtype)
    held = torch.randn(2, 1, KV_HEADS, keys + ROOM, HEAD_DIM, generator=generator).to(dtype)
    k, v = held.narrow(3, 0, keys)  # views, as the layers' caches give them
    mask = torch.ones(1, 1, queries, keys, dtype=torch.bool)
    mask[..., keys - queries :] = torch.tril(torch.ones(queries, queries, dtype=torch.bool))
    return q, k, v, mask


def kernels() -> dict:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from readers.engines.attention import ForwardMasks, grouped_attention

    layer = SimpleNamespace(num_key_value_groups=HEADS // KV_HEADS, is_causal=True)
    masks = ForwardMasks()  # one forward: the mask prepared on the first call (the warm-up)
    return {
        "sdpa": lambda q, k, v, mask: sdpa_attention_forward(layer, q, k, v, mask)[0],
        "grouped": lambda q, k, v, mask: grouped_attention(layer, q, k, v, mask, grouped_masks=masks)[0],
    }


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
    print("| kernel | precision | ms, median | GFLOP/s | max abs diff from float32 sdpa |")
    print("|---|---|---|---|---|")
    reference = None
    with torch.inference_mode():
        for name, kernel in kernels().items():
            for dtype in (torch.float32, torch.bfloat16):
                ms, out = median_ms(kernel, inputs(dtype, args.queries, args.keys), args.repeats)
                reference = out if reference is None else reference
                diff = (out - reference).abs().max().item()
                precision = str(dtype).removeprefix("torch.")
                print(f"| {name} | {precision} | {ms:.1f} | {flop / ms / 1e6:.0f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
