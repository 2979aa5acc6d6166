"""``decide eval throughput``: output tokens/s, time to first token and per-token latency of a server.

The study's sweep: 256 generated tokens per request (``ignore_eos``, so every request generates all
of them), at 1, 4 and 16 concurrent requests, with a short prompt and with prompts of about 1,024 and
3,072 tokens. Every prompt is unique from its first token (a numbered nonce, then words drawn with
a per-request seed), so the prefix cache cannot serve one request's prompt to another. Prompts are
sized with the server's own tokenizer (``/tokenize``) and sent as token ids to ``/v1/completions``,
streamed, so the first token's arrival is seen.

Per (shape, concurrency): ``passes`` passes of ``waves`` × concurrency requests. A pass's output
tokens/s is its generated tokens over its wall time; the report gives the median and range over
passes, and the median time to first token (TTFT) and per-token latency (time after the first token
over the tokens after it) over all requests. Failed requests are counted beside the rest.
Evidence: ``throughput.jsonl`` (one line per request, appended pass by pass: a killed sweep resumes),
``manifest.json``, ``summary.json``, ``throughput.md``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from eval.evidence.manifest import MANIFEST, MANIFEST_VERSION, Images, RunRefused, git_revision, write_json

CONCURRENCIES = (1, 4, 16)
PROMPT_TOKENS = {"short": 32, "long-1024": 1024, "long-3072": 3072}
OUTPUT_TOKENS = 256
REQUESTS = "throughput.jsonl"
WORDS = (
    "river stone market window garden letter engine cloud harbor signal forest ladder candle mirror "
    "orbit thread valley canvas anchor pepper silver meadow planet rocket violet tunnel whisper"
).split()


def prompt_text(index: int, seed: int, words: int) -> str:
    """A prompt that no other index shares from its first token: a numbered nonce, then seeded words."""
    rng = random.Random(seed * 1_000_003 + index)
    return f"Request {index}-{rng.getrandbits(48):012x}: " + " ".join(rng.choice(WORDS) for _ in range(words))


async def prompt_ids(client: httpx.AsyncClient, model: str, index: int, seed: int, tokens: int) -> list[int]:
    """``tokens`` token ids of request ``index``'s prompt, cut by the served tokenizer."""
    response = await client.post(
        "/tokenize", json={"model": model, "prompt": prompt_text(index, seed, tokens * 2)}
    )
    response.raise_for_status()
    return response.json()["tokens"][:tokens]


async def one_request(
    client: httpx.AsyncClient, model: str, prompt: list[int], output_tokens: int
) -> dict[str, Any]:
    """One streamed completion: TTFT, end-to-end time and tokens generated, or the error."""
    body = {
        "model": model, "prompt": prompt, "max_tokens": output_tokens, "temperature": 0, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    started = time.monotonic()
    first = None
    tokens = 0
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                return {
                    "ok": False,
                    "error": f"http {response.status_code}: {(await response.aread())[:300]!r}",
                }
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0].get("text") and first is None:
                    first = time.monotonic()
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
    except httpx.HTTPError as error:
        return {"ok": False, "error": f"{type(error).__name__}: {error}"}
    ended = time.monotonic()
    ttft = (first or ended) - started
    return {
        "ok": True,
        "prompt_tokens": len(prompt),
        "output_tokens": tokens,
        "ttft_ms": ttft * 1000,
        "e2e_ms": (ended - started) * 1000,
        "per_token_ms": (ended - (first or ended)) * 1000 / max(1, tokens - 1),
    }


async def run_throughput(
    url: str,
    out: Path,
    *,
    model: str | None = None,
    concurrencies=CONCURRENCIES,
    shapes: dict[str, int] | None = None,
    passes: int = 3,
    waves: int = 2,
    output_tokens: int = OUTPUT_TOKENS,
    seed: int = 0,
    engine_log: str | None = None,
    images: Images | None = None,
    transport=None,
) -> dict[str, Any]:
    """Run the sweep against the server at ``url``; writes the evidence and returns the summary.

    Each pass's requests are appended to ``throughput.jsonl`` as the pass finishes, so a killed sweep
    keeps every finished pass, and the same call on the same ``out`` resumes it: passes already there
    are skipped (their prompts' numbers too, so no prompt repeats), under a manifest of the same model
    and settings (another is refused)."""
    from eval.capacity.load import machine_info

    shapes = dict(PROMPT_TOKENS if shapes is None else shapes)
    out.mkdir(parents=True, exist_ok=True)
    args = {"concurrencies": list(concurrencies), "shapes": shapes, "passes": passes, "waves": waves,
            "output_tokens": output_tokens, "seed": seed}  # fmt: skip
    async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=1800, transport=transport) as client:
        models = (await client.get("/v1/models")).json()["data"]
        model = model or models[0]["id"]
        version = await client.get("/version")
        manifest = {
            "manifest_version": MANIFEST_VERSION,
            "run": "throughput",
            "status": "started",
            "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "git": dict(git_revision()),
            "server": {"url": url, "model": model, "root": models[0].get("root"),
                       "server_version": version.json().get("version") if version.status_code == 200 else None},
            "images": {"engine": (images or Images()).engine, "service": (images or Images()).service},
            "args": args,
            "machine": machine_info(),
        }  # fmt: skip
        if engine_log is not None:
            from eval.capacity.kv_log import read_engine_log

            manifest.update(read_engine_log(engine_log))
        rows = _finished_passes(out, manifest)
        write_json(out / MANIFEST, manifest)
        done = {(row["shape"], row["concurrency"], row["pass"]) for row in rows}
        index = 0  # every request of the run gets its own prompt, resumed runs included
        await one_request(
            client, model, await prompt_ids(client, model, -1, seed, 16), 8
        )  # warm-up, not recorded
        with (out / REQUESTS).open("a", encoding="utf-8") as journal:
            for shape, tokens in shapes.items():
                for concurrency in concurrencies:
                    for pass_ in range(passes):
                        count = waves * concurrency
                        first, index = index, index + count
                        if (shape, concurrency, pass_) in done:
                            continue
                        prompts = [
                            await prompt_ids(client, model, first + i, seed, tokens) for i in range(count)
                        ]
                        started = time.monotonic()
                        results = await _concurrently(client, model, prompts, concurrency, output_tokens)
                        wall_s = time.monotonic() - started
                        finished = [{"shape": shape, "concurrency": concurrency, "pass": pass_, "pass_wall_s": wall_s, **r} for r in results]  # fmt: skip
                        # One write per pass, flushed: a kill leaves whole passes (a torn one is dropped on resume).
                        journal.write("".join(json.dumps(row) + "\n" for row in finished))
                        journal.flush()
                        rows += finished
    manifest["status"] = "success"
    write_json(out / MANIFEST, manifest)
    summary = summarize(rows)
    write_json(out / "summary.json", summary)
    (out / "throughput.md").write_text(throughput_table(summary, model))
    return summary


def _finished_passes(out: Path, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The request rows of the passes a previous run on ``out`` finished (rewritten without a torn
    or partial pass), after checking that it measured the same model with the same settings."""
    path = out / REQUESTS
    if not path.is_file():
        return []
    if (out / MANIFEST).is_file():
        existing = json.loads((out / MANIFEST).read_text())
        for field, mine, theirs in (
            ("model", manifest["server"]["model"], existing.get("server", {}).get("model")),
            ("settings", manifest["args"], existing.get("args")),
        ):
            if mine != theirs:
                raise RunRefused(
                    f"{out} holds a sweep with {field} {theirs!r}, not {mine!r}: use another --out"
                )
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a torn last line: the pass it belongs to is redone
    waves = manifest["args"]["waves"]
    per_pass: dict[tuple, list[dict]] = {}
    for row in rows:
        per_pass.setdefault((row["shape"], row["concurrency"], row["pass"]), []).append(row)
    kept = [row for (_, c, _), group in per_pass.items() if len(group) == waves * c for row in group]
    path.write_text("".join(json.dumps(row) + "\n" for row in kept))
    return kept


async def _concurrently(
    client: httpx.AsyncClient, model: str, prompts: list[list[int]], concurrency: int, output_tokens: int
) -> list[dict[str, Any]]:
    gate = asyncio.Semaphore(concurrency)

    async def send(prompt: list[int]) -> dict[str, Any]:
        async with gate:
            return await one_request(client, model, prompt, output_tokens)

    return list(await asyncio.gather(*(send(p) for p in prompts)))


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``"<shape>@c<concurrency>"`` → output tokens/s (median and range over passes), median TTFT and
    per-token latency over requests, requests and failures."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["shape"], row["concurrency"]), []).append(row)
    summary = {}
    for (shape, concurrency), group in groups.items():
        ok = [r for r in group if r["ok"]]
        by_pass: dict[int, list[dict]] = {}
        for r in group:
            by_pass.setdefault(r["pass"], []).append(r)
        rates = [
            sum(r.get("output_tokens", 0) for r in rs if r["ok"]) / rs[0]["pass_wall_s"]
            for rs in by_pass.values()
        ]
        summary[f"{shape}@c{concurrency}"] = {
            "shape": shape,
            "concurrency": concurrency,
            "passes": len(by_pass),
            "requests": len(group),
            "failed": len(group) - len(ok),
            "prompt_tokens": statistics.median(r["prompt_tokens"] for r in ok) if ok else None,
            "output_tokens_per_s": statistics.median(rates),
            "output_tokens_per_s_range": [min(rates), max(rates)],
            "ttft_ms_median": statistics.median(r["ttft_ms"] for r in ok) if ok else None,
            "per_token_ms_median": statistics.median(r["per_token_ms"] for r in ok) if ok else None,
        }
    return summary


def load_summary(run: Path) -> dict[str, dict[str, Any]]:
    return json.loads((run / "summary.json").read_text())


def throughput_table(summary: dict[str, dict[str, Any]], model: str) -> str:
    lines = [
        f"{model}: output tokens/s per pass (median, range), median TTFT and per-token latency over requests.",
        "",
        "| prompt | prompt tokens | concurrency | output tok/s (median, range) | TTFT ms | per-token ms | requests | failed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summary.values():
        lo, hi = s["output_tokens_per_s_range"]
        ttft = "—" if s["ttft_ms_median"] is None else f"{s['ttft_ms_median']:.0f}"
        per_token = "—" if s["per_token_ms_median"] is None else f"{s['per_token_ms_median']:.1f}"
        lines.append(
            f"| {s['shape']} | {s['prompt_tokens']:.0f} | {s['concurrency']} | {s['output_tokens_per_s']:.1f} ({lo:.1f}–{hi:.1f}) | "
            f"{ttft} | {per_token} | {s['requests']} | {s['failed']} |"
        )
    return "\n".join(lines) + "\n"
