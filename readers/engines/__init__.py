"""Engines behind the reader: ``local`` (in-process model) and ``vllm`` (HTTP).

    open_engine("local")                      the embedded SmolLM2, prepared on first use
    open_engine("vllm", url="http://…:8000")  any vLLM server; read mode chosen by a start-up probe
"""

from __future__ import annotations

from pathlib import Path

from readers.engines.base import Capabilities, Engine, EngineLogprobs, ModelInfo, ReadMode, ReadRequest

ENGINE_KINDS = ("local", "vllm")
DEFAULT_VLLM_TOP_K = 32


async def open_engine(
    kind: str,
    *,
    url: str | None = None,
    model_dir: Path | None = None,
    top_k: int | None = None,
    tokenizer: str | None = None,
    workers: int = 2,
) -> Engine:
    """Build the engine ``kind``; the vLLM engine probes the server before it is returned."""
    if kind == "local":
        from readers.embedded import prepare_embedded_model
        from readers.engines.local import LocalEngine

        return LocalEngine(model_dir or prepare_embedded_model(), top_k=top_k, workers=workers)
    if kind == "vllm":
        from readers.engines.vllm import VLLMEngine

        if not url:
            raise ValueError("the vllm engine needs --engine-url")
        return await VLLMEngine.connect(url, top_k=top_k or DEFAULT_VLLM_TOP_K, tokenizer=tokenizer or (str(model_dir) if model_dir else None))
    raise ValueError(f"unknown engine {kind!r}; choose one of {', '.join(ENGINE_KINDS)}")


__all__ = [
    "Capabilities",
    "DEFAULT_VLLM_TOP_K",
    "ENGINE_KINDS",
    "Engine",
    "EngineLogprobs",
    "ModelInfo",
    "ReadMode",
    "ReadRequest",
    "open_engine",
]
