"""Engines behind the reader: ``local`` (the embedded model, in process) and ``vllm`` (HTTP).

open_engine("local")                      the local engine: the embedded SmolLM2, prepared on first use
open_engine("vllm", url="http://…:8000")  any vLLM server; read mode chosen by a start-up probe
open_engine("vllm", url="http://a:8000,http://b:8000")
                                          several servers of one model, reads routed by prefix
open_engine("vllm", url="dns+http://vllm-engine-headless:8000")
                                          every address of a name, re-resolved (readers/engines/addresses.py)
"""

from __future__ import annotations

from pathlib import Path

from readers.engines.base import (
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_TIMEOUT_S,
    DEFAULT_VLLM_TOP_K,
    Capabilities,
    Engine,
    EngineReply,
    LocalBatching,
    ModelInfo,
    ReadMode,
    ReadRequest,
)

ENGINE_KINDS = ("local", "vllm")


async def open_engine(
    kind: str,
    *,
    url: str | None = None,
    model_dir: Path | None = None,
    top_k: int | None = None,
    tokenizer: str | None = None,
    read_mode: ReadMode | None = None,
    workers: int | None = None,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    share_prefix: bool = True,
    batching: LocalBatching | None = None,
    prefill_first: bool = False,
) -> Engine:
    """Build the engine ``kind``; the vLLM engine probes the server before it is returned.

    ``share_prefix=False`` is the per-question path (no KV shared between a request's reads), kept
    to measure what sharing the state gains. ``batching`` sets the local engine's micro-batching and
    prefix cache (defaults: ``LocalBatching()``); vLLM schedules its own batches, and
    ``prefill_first`` reads a request's first question before the others (``VLLMEngine.read_many``)."""
    if kind == "local":
        from readers.embedded import prepare_embedded_model
        from readers.engines.local import LocalEngine

        if read_mode not in (None, ReadMode.EXACT if top_k is None else ReadMode.TOPK):
            raise ValueError("the local engine reads exact, or top-k with --top-k")
        return LocalEngine(
            model_dir or prepare_embedded_model(),
            top_k=top_k,
            workers=workers,
            share_prefix=share_prefix,
            batching=batching or LocalBatching(),
        )
    if kind == "vllm":
        from readers.engines.addresses import parse_engine_urls
        from readers.engines.routed import RoutedEngine
        from readers.engines.vllm import VLLMEngine

        if not url:
            raise ValueError("the vllm engine needs --engine-url")
        urls, by_name = parse_engine_urls(url)
        options = dict(
            top_k=top_k or DEFAULT_VLLM_TOP_K,
            tokenizer=tokenizer or (str(model_dir) if model_dir else None),
            read_mode=read_mode,
            max_in_flight=max_in_flight,
            timeout_s=timeout_s,
            share_prefix=share_prefix,
            prefill_first=prefill_first,
        )
        if by_name:
            return await RoutedEngine.connect_name(urls[0], **options)
        if len(urls) > 1:
            return await RoutedEngine.connect(urls, **options)
        return await VLLMEngine.connect(urls[0], **options)
    raise ValueError(f"unknown engine {kind!r}; choose one of {', '.join(ENGINE_KINDS)}")


__all__ = [
    "DEFAULT_VLLM_TOP_K",
    "ENGINE_KINDS",
    "Capabilities",
    "Engine",
    "EngineReply",
    "LocalBatching",
    "ModelInfo",
    "ReadMode",
    "ReadRequest",
    "open_engine",
    "open_engine_spec",
    "parse_engine_spec",
]


def parse_engine_spec(spec: str) -> tuple[str, ReadMode | None, str | None]:
    """``KIND[:READ_MODE][@URL]`` → (engine kind, read mode, url); e.g. ``local``, ``local:topk``,
    ``vllm:masked@http://127.0.0.1:8100``."""
    head, _, url = spec.partition("@")
    kind, _, read_mode_name = head.partition(":")
    if kind not in ENGINE_KINDS:
        raise ValueError(f"unknown engine {kind!r} in {spec!r}; choose one of {', '.join(ENGINE_KINDS)}")
    try:
        read_mode = ReadMode(read_mode_name) if read_mode_name else None
    except ValueError:
        raise ValueError(
            f"unknown read mode {read_mode_name!r} in {spec!r}; choose one of {', '.join(m.value for m in ReadMode)}"
        ) from None
    return kind, read_mode, url or None


async def open_engine_spec(
    spec: str, *, top_k: int | None = None, engine_url: str | None = None, **options
) -> Engine:
    """Open the engine a spec names; ``local:topk`` reads the top ``top_k`` (default 32)."""
    kind, read_mode, url = parse_engine_spec(spec)
    if kind == "local":
        top_k = (top_k or DEFAULT_VLLM_TOP_K) if read_mode is ReadMode.TOPK else None
    return await open_engine(kind, url=url or engine_url, top_k=top_k, read_mode=read_mode, **options)
