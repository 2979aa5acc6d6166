"""The limit bench/latency.py measures each row against: the model's raw forward speed on this
machine, in prompt tokens/s, on a fresh ~256-token prompt (bench/latency.py's docstring)."""

from __future__ import annotations

import concurrent.futures
import os
import secrets
import statistics
import time
from typing import Any

import httpx

from bench.latency_shapes import LONG_STATE

LIMIT_PROMPT_TOKENS = 256


def limit_prompt(tokenizer: Any) -> list[int]:
    """A ~256-token prompt no engine has seen: the long state, a fresh tag first, cut to length."""
    text = " ".join(LONG_STATE.format(tag=secrets.token_hex(6)) for _ in range(2))
    return tokenizer.encode(text, add_special_tokens=False)[:LIMIT_PROMPT_TOKENS]


async def raw_limit(kind: str, engine: Any, engine_client: httpx.AsyncClient | None, repeats: int) -> dict:
    """The model's raw forward speed here, prompt tokens/s (bench/latency.py's docstring)."""
    if kind == "local":
        import torch

        def forwards(count: int) -> list[float]:
            engine.next_token_logprobs(limit_prompt(engine.tokenizer))  # warm at this thread count
            speeds = []
            for _ in range(count):
                prompt = limit_prompt(engine.tokenizer)
                started = time.perf_counter()
                engine.next_token_logprobs(prompt)
                speeds.append(len(prompt) / (time.perf_counter() - started))
            return speeds

        # Every thread of this process, and one: on cores where other work also runs, all threads can
        # be the slower (OpenMP threads wait on each other), and a limit below what one thread reaches
        # would not be a limit. The faster is the limit; both are kept. Each count on a fresh thread of
        # its own, which ends after it: a thread that ran torch keeps its OpenMP team, and with more
        # such threads than cores every team's helpers sleep between parallel regions (the engine's
        # module docstring, 4), which made the main thread's count up to 10x slower here.
        def on_own_thread(threads: int) -> list[float]:
            def run() -> list[float]:
                torch.get_num_threads()  # torch's per-thread setup first, then this thread's count
                torch.set_num_threads(threads)
                return forwards(repeats)

            with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
                return pool.submit(run).result()

        by_threads = {
            threads: on_own_thread(threads) for threads in dict.fromkeys((len(os.sched_getaffinity(0)), 1))
        }
    else:
        from readers.engines.vllm import completion_body

        samples = []
        for _ in range(repeats + 1):
            prompt = limit_prompt(engine.tokenizer)
            body = completion_body(engine.served_name, prompt, top_k=1) | {
                "cache_salt": secrets.token_urlsafe(16)
            }
            started = time.perf_counter()
            response = await engine_client.post("/v1/completions", json=body)
            elapsed = time.perf_counter() - started
            response.raise_for_status()
            samples.append(len(prompt) / elapsed)
        by_threads = {None: samples[1:]}  # the server's own threads; the first request warms it
    threads, samples = max(by_threads.items(), key=lambda item: statistics.median(item[1]))
    return {
        "tokens_per_s": statistics.median(samples),
        "range_tokens_per_s": [min(samples), max(samples)],
        "prompt_tokens": LIMIT_PROMPT_TOKENS,
        "threads": threads,
        "by_threads_tokens_per_s": {
            str(count): statistics.median(speeds) for count, speeds in by_threads.items() if count
        },
        "samples_tokens_per_s": samples,
    }
