"""Is there a faster exact product than float32 on this CPU? The embedded model's matrix shapes, timed
side by side in one run, with each product's error against a float64 reference.

The local engine computes question tokens at the raw float32 forward's speed (bench/latency.py's
limit); a request whose new tokens must all be computed cannot beat that limit unless each product
runs faster at the same precision. Three ways of computing ``x @ W.T`` for SmolLM2-135M's projection
shapes (hidden 576, MLP 1536, key/value 192) and row counts from one question (16 rows) to a fresh
state (256):

- ``float32``: what the engine runs;
- ``bfloat16``: both operands rounded to bfloat16, the product in bfloat16 (on cores with AMX or
  AVX512-BF16, oneDNN's fast path);
- ``bf16 split``: each operand as a bfloat16 high part plus a bfloat16 low part and three products
  summed in float32 (hi·hi + hi·lo + lo·hi), the usual way to recover float32 accuracy from bfloat16
  units; PyTorch's CPU bfloat16 product returns bfloat16, so each partial product is rounded before
  the sum.

Per shape: median ms over ``--repeats`` (range), the speed ratio to float32, and the largest error
relative to the largest reference entry. The engine's exactness tests hold probabilities to 1e-4;
a product error well above float32's (~1e-7) reaches them through 30 layers.

Run: ``.venv/bin/python -m bench.matmul_precision --out evidence/latency/matmul-precision/precision.json``
(the markdown beside the JSON is the printed report)
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from eval.capacity.load import bench_args, cpu_flags, machine_info, run_bench
from eval.evidence.manifest import run_manifest

# (rows, in features, out features): SmolLM2-135M's projections (q/o 576→576, k/v 576→192, MLP
# 576→1536 and 1536→576) at one question's new tokens and a fresh state's.
SHAPES = [
    (rows, n_in, n_out)
    for rows in (16, 128, 256)
    for n_in, n_out in ((576, 576), (576, 192), (576, 1536), (1536, 576))
]


def split(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    high = t.to(torch.bfloat16)
    return high, (t - high.float()).to(torch.bfloat16)


def methods(x: torch.Tensor, w: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    w_high, w_low = split(w)  # weights are converted once, as an engine would at load

    def float32() -> torch.Tensor:
        return x @ w.T

    def bfloat16() -> torch.Tensor:
        return x.to(torch.bfloat16) @ w_high.T

    def bf16_split() -> torch.Tensor:
        x_high, x_low = split(x)
        return (x_high @ w_high.T).float() + (x_low @ w_high.T).float() + (x_high @ w_low.T).float()

    return {"float32": float32, "bfloat16": bfloat16, "bf16 split": bf16_split}


def timed(fn: Callable[[], torch.Tensor], repeats: int, inner: int) -> list[float]:
    fn()  # warm: oneDNN builds its kernel on first use
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - start) / inner * 1000)
    return samples


async def main(args: argparse.Namespace) -> dict:
    torch.manual_seed(args.seed)
    rows = []
    for n_rows, n_in, n_out in SHAPES:
        x = torch.randn(n_rows, n_in)
        w = torch.randn(n_out, n_in) / n_in**0.5
        reference = x.double() @ w.double().T
        scale = reference.abs().max().item()
        row: dict = {"rows": n_rows, "in": n_in, "out": n_out, "methods": {}}
        for name, fn in methods(x, w).items():
            samples = timed(fn, args.repeats, args.inner)
            error = (fn().double() - reference).abs().max().item() / scale
            row["methods"][name] = {
                "median_ms": statistics.median(samples),
                "samples_ms": samples,
                "rel_error": error,
            }
        rows.append(row)
    return {
        "manifest": run_manifest("bench:matmul_precision", engines={}, args=bench_args(args)),
        "machine": machine_info()
        | {
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            # torch's capability stops at AVX512; whether oneDNN has AMX for bfloat16 is the kernel's flags.
            "bf16_units": sorted(cpu_flags() & {"amx_bf16", "amx_tile", "avx512_bf16"}),
        },
        "rows": rows,
    }


def report(result: dict) -> str:
    machine = result["machine"]
    names = list(result["rows"][0]["methods"])
    lines = [
        f"torch {machine['torch']}, {machine['threads']} threads, CPU capability {machine['cpu_capability']} "
        f"(bfloat16 units: {', '.join(machine['bf16_units']) or 'none'}); "
        f"median ms over {result['manifest']['args']['repeats']} repeats (range); × = float32's time ÷ the method's; "
        "error = largest |product − float64| ÷ largest |float64|",
        "",
        "| rows × in → out | " + " | ".join(f"{name} ms | {name} × | {name} error" for name in names) + " |",
        "|---|" + "---|---|---|" * len(names),
    ]
    for row in result["rows"]:
        base = row["methods"]["float32"]["median_ms"]
        cells = [f"{row['rows']} × {row['in']} → {row['out']}"]
        for name in names:
            m = row["methods"][name]
            cells += [
                f"{m['median_ms']:.3f} ({min(m['samples_ms']):.3f}–{max(m['samples_ms']):.3f})",
                f"{base / m['median_ms']:.2f}",
                f"{m['rel_error']:.1e}",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed samples per method and shape")
    parser.add_argument("--inner", type=int, default=20, help="products per sample")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    return parser


if __name__ == "__main__":
    run_bench(parser(), main, report)
