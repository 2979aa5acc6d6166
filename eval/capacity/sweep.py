"""``decide eval load``: decisions/s and latency through the service, by concurrency and state length.

Short states (SST-2 reviews) at each concurrency, ``passes`` times (median and range reported), then
long states of about 1,024 and 3,072 tokens, each request's state unique from its first word (the
question part of the prompt is still shared, as in production; the state gets no prefix-cache help).
Requests go through the whole service (HTTP, validation, the decision path) — in process over ASGI,
or to a running server with ``url``. Evidence: ``load.jsonl`` (one line per run) and ``manifest.json``;
the report beside them: ``summary.json``, ``load.md`` and ``load.png``.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from eval.capacity.load import machine_info, run_load
from eval.decisions.tasks import TASKS, load_sample
from eval.evidence.manifest import Images, run_manifest, write_json
from readers.engines.base import Engine

CONCURRENCIES = (1, 4, 8, 16)
LONG_TOKENS = (1024, 3072)


def long_states(tokenizer: Any, tokens: int, count: int, seed: int = 0) -> list[str]:
    """``count`` distinct states of about ``tokens`` tokens: shuffled review sentences, numbered first."""
    words = " ".join(record.text for record in load_sample("sst2")).split()
    states = []
    for i in range(count):
        rng = random.Random(seed * 100_003 + i)
        text = f"Document {i}-{rng.getrandbits(32):08x}. " + " ".join(
            rng.choice(words) for _ in range(tokens * 2)
        )
        ids = tokenizer.encode(text, add_special_tokens=False)[:tokens]
        states.append(tokenizer.decode(ids))
    return states


async def run_sweep(
    engine: Engine,
    out: Path,
    *,
    url: str | None = None,
    service_app: Callable[[Engine], Any] | None = None,
    concurrencies=CONCURRENCIES,
    passes: int = 3,
    requests: int = 48,
    long_tokens=LONG_TOKENS,
    long_requests: int = 16,
    long_concurrency: int = 8,
    images: Images | None = None,
) -> list[dict]:
    """Run the sweep through the service on ``engine``; write ``load.jsonl`` and ``manifest.json``.

    The service is the one at ``url``, or ``service_app(engine)`` in process: the command passes
    ``service.app.create_app``, so this library imports no HTTP layer (tests/test_layers.py)."""
    if url is None and service_app is None:
        raise ValueError("give the service to load: url, or service_app to build one in process")
    out.mkdir(parents=True, exist_ok=True)
    question = {"answer": TASKS["sst2"].question()}
    short = [{"state": r.text, "questions": question} for r in load_sample("sst2")]
    transport = None if url else httpx.ASGITransport(app=service_app(engine))
    rows: list[dict] = []
    async with httpx.AsyncClient(
        base_url=url or "http://in-process", transport=transport, timeout=600
    ) as client:

        def sender(bodies, tokens: list[int]):
            async def send(i: int) -> bool:
                response = await client.post("/decide", json=bodies[i % len(bodies)])
                if response.status_code == 200:
                    tokens.append(response.json()["usage"]["input_tokens"])
                return response.status_code == 200

            return send

        await run_load(sender(short, []), requests=8, concurrency=4)  # warm-up, not recorded
        plan = [("short", short, c, requests) for c in concurrencies for _ in range(passes)]
        for n in long_tokens:
            bodies = [
                {"state": s, "questions": question}
                for s in long_states(engine.tokenizer, n, long_requests * passes)
            ]
            plan += [
                (
                    f"long-{n}",
                    bodies[p * long_requests : (p + 1) * long_requests],
                    long_concurrency,
                    long_requests,
                )
                for p in range(passes)
            ]
        passes_seen: dict[tuple[str, int], int] = {}
        for shape, bodies, concurrency, count in plan:
            tokens: list[int] = []
            result = await run_load(sender(bodies, tokens), requests=count, concurrency=concurrency)
            index = passes_seen[(shape, concurrency)] = passes_seen.get((shape, concurrency), -1) + 1
            rows.append({"shape": shape, "concurrency": concurrency, "pass": index, **result.as_json(),
                         "prompt_tokens_median": statistics.median(tokens) if tokens else None})  # fmt: skip
    (out / "load.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    manifest = run_manifest(
        "load",
        engines={"run": engine},
        args={"url": url, "passes": passes, "requests": requests, "long_tokens": list(long_tokens)},
        images=images,
    )
    manifest["machine"] = machine_info()
    write_json(out / "manifest.json", manifest)
    return rows


async def load_sweep(engine_spec: str, out: Path, *, engine_url: str | None = None, **options) -> list[dict]:
    """Open the engine ``engine_spec`` names, :func:`run_sweep` it into ``out`` and write the report
    (summary.json, load.md, load.png); returns the summary."""
    from readers.engines import open_engine_spec

    async with await open_engine_spec(engine_spec, engine_url=engine_url) as engine:
        rows = await run_sweep(engine, out, **options)
        return write_sweep_report(
            rows, out, f"{engine.info.name} ({engine.kind}, {engine.capabilities.read_mode.value})"
        )


def write_sweep_report(rows: list[dict], out: Path, title: str) -> list[dict]:
    """summary.json, load.md and load.png beside a sweep's load.jsonl; returns the summary."""
    summary = summarise(rows)
    (out / "load.md").write_text(sweep_table(summary))
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_sweep(summary, out / "load.png", title)
    return summary


def summarise(rows: list[dict]) -> list[dict]:
    groups: dict[tuple[str, int], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["shape"], row["concurrency"]), []).append(row)
    summary = []
    for (shape, concurrency), runs in groups.items():
        rates = [r["decisions_per_s"] for r in runs]
        summary.append({
            "shape": shape, "concurrency": concurrency, "passes": len(runs),
            "decisions_per_s": statistics.median(rates), "decisions_per_s_range": [min(rates), max(rates)],
            "p50_ms": statistics.median(r["p50_ms"] for r in runs), "p90_ms": statistics.median(r["p90_ms"] for r in runs),
            "p99_ms": statistics.median(r["p99_ms"] for r in runs), "failed": sum(r["failed"] for r in runs),
            "prompt_tokens_median": statistics.median(r["prompt_tokens_median"] for r in runs if r["prompt_tokens_median"]),
        })  # fmt: skip
    return summary


def sweep_table(summary: list[dict]) -> str:
    lines = [
        "| states | prompt tokens | concurrency | decisions/s (median, range) | p50 ms | p90 ms | p99 ms | failed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        lo, hi = s["decisions_per_s_range"]
        lines.append(
            f"| {s['shape']} | {s['prompt_tokens_median']:.0f} | {s['concurrency']} | {s['decisions_per_s']:.2f} ({lo:.2f}–{hi:.2f}) | "
            f"{s['p50_ms']:.0f} | {s['p90_ms']:.0f} | {s['p99_ms']:.0f} | {s['failed']} |"
        )
    return "\n".join(lines) + "\n"


def plot_sweep(summary: list[dict], path: Path, title: str) -> None:
    from eval.evidence.figures import plt

    short = sorted((s for s in summary if s["shape"] == "short"), key=lambda s: s["concurrency"])
    figure, axis = plt.subplots(figsize=(6.0, 4.0), dpi=120)
    xs = [s["concurrency"] for s in short]
    axis.errorbar(
        xs, [s["decisions_per_s"] for s in short],
        yerr=[[s["decisions_per_s"] - s["decisions_per_s_range"][0] for s in short], [s["decisions_per_s_range"][1] - s["decisions_per_s"] for s in short]],
        marker="o", capsize=3, label="short states (median, range)",
    )  # fmt: skip
    for s in summary:
        if s["shape"] != "short":
            axis.scatter(
                [s["concurrency"]],
                [s["decisions_per_s"]],
                marker="s",
                label=f"{s['shape']} ({s['prompt_tokens_median']:.0f} tokens)",
            )
    axis.set_xlabel("concurrency")
    axis.set_ylabel("decisions/s")
    axis.set_xticks(xs)
    axis.set_title(title, fontsize=9)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
