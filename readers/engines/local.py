"""The in-process engine: a Hugging Face causal LM on the CPU, full-vocabulary log-softmax.

Reads are exact by default. ``top_k`` makes it answer like a top-k engine (only the k most likely
tokens come back), to measure what top-k costs on the same model.
"""

from __future__ import annotations

import asyncio
import copy
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from readers.embedded import model_manifest
from readers.engines.base import ClosingEngine, Capabilities, EngineReply, ModelInfo, ReadMode, ReadRequest


class LocalEngine(ClosingEngine):
    """Forward passes run on a pool of worker threads (torch releases the GIL during the forward),
    so a request waits only for a free worker, never on a lock held around Python code."""

    kind = "local"

    def __init__(self, model_dir: Path, *, top_k: int | None = None, workers: int = 2, dtype: str = "float32") -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model_dir = Path(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
        self.model.eval()
        config = self.model.config
        vocab_size = int(config.vocab_size)
        manifest = model_manifest(model_dir)
        self.info = ModelInfo(
            name=manifest.get("name", model_dir.name),
            revision=manifest.get("revision", "local-folder"),
            description=manifest.get("description", f"Hugging Face model folder {model_dir}"),
            release_date=manifest.get("release_date", ""),
            context_length=int(config.max_position_embeddings),
            vocab_size=vocab_size,
        )
        self._probe = {"engine": "local", "model_dir": str(model_dir), "dtype": dtype}
        self._set_top_k(top_k)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="local-engine")
        self._owns_pool = True

    def _set_top_k(self, top_k: int | None) -> None:
        vocab_size = self.info.vocab_size
        if top_k is not None and not 1 <= top_k <= vocab_size:
            raise ValueError(f"top_k must be between 1 and the vocabulary size {vocab_size}")
        self.top_k = top_k
        self.capabilities = Capabilities(
            read_mode=ReadMode.EXACT if top_k is None else ReadMode.TOPK,
            max_logprobs=vocab_size,
            top_k=top_k or vocab_size,
            probe={**self._probe, "top_k": top_k},
        )

    def with_top_k(self, top_k: int | None) -> LocalEngine:
        """The same loaded model read another way (exact, or top-k), sharing weights and workers."""
        variant = copy.copy(self)
        variant._set_top_k(top_k)
        variant._owns_pool = False
        return variant

    def next_token_logprobs(self, prompt_ids: tuple[int, ...]) -> torch.Tensor:
        """Full-vocabulary log-softmax at the position after ``prompt_ids``."""
        with torch.inference_mode():
            ids = torch.tensor([prompt_ids], dtype=torch.long)
            logits = self.model(input_ids=ids, logits_to_keep=1, use_cache=False).logits[0, -1]
            return torch.log_softmax(logits.float(), dim=-1)

    def _read(self, request: ReadRequest, submitted: float) -> tuple[dict[int, float], float, float]:
        started = time.monotonic()
        logprobs = self.next_token_logprobs(request.prompt_ids)
        if self.top_k is None:
            result = {token_id: float(logprobs[token_id]) for token_id in request.label_ids}
        else:
            values, ids = torch.topk(logprobs, self.top_k)
            result = dict(zip(ids.tolist(), values.tolist()))
        return result, (started - submitted) * 1000, (time.monotonic() - started) * 1000

    async def read(self, request: ReadRequest) -> EngineReply:
        logprobs, queued_ms, latency_ms = await asyncio.get_running_loop().run_in_executor(
            self._pool, self._read, request, time.monotonic()
        )
        return EngineReply(
            logprobs=logprobs,
            read_mode=self.capabilities.read_mode,
            prompt_tokens=len(request.prompt_ids),
            latency_ms=latency_ms,
            queued_ms=queued_ms,
        )

    async def aclose(self) -> None:
        if self._owns_pool:
            self._pool.shutdown(wait=False, cancel_futures=True)
