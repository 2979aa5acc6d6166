"""The local engine: a Hugging Face causal LM run in process on the CPU, full-vocabulary log-softmax.

Reads are exact by default. ``top_k`` makes it answer like a top-k engine (only the k most likely
tokens come back), to measure what top-k costs on the same model.

How a batch of reads is computed (``share_prefix=True``, the default):

1. Reads arriving within ``batch_window_ms`` of each other, up to ``max_batch`` reads, form one
   batch (micro-batching: concurrent requests share forward passes).
2. Each read's prompt splits at ``ReadRequest.prefix_tokens`` into a prefix (system prompt and
   state) and a suffix (its question). Distinct prefixes not in the prefix cache are computed in one
   right-padded forward; their keys and values go into a bounded LRU cache keyed by token ids, so a
   state repeated across requests is not recomputed.
3. All suffixes are read in one forward against their prefixes' keys and values: the past is padded
   to the longest prefix, the suffixes right-padded, and a 4-D mask hides the padding; positions
   continue from each read's own prefix length, so every read sees exactly what it would alone.

``share_prefix=False`` is the per-question path: every read's whole prompt is computed (still
micro-batched), no prefix cache. It is kept to measure what sharing gains.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import copy
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from readers.embedded import model_manifest
from readers.engines.base import (
    Capabilities,
    ClosingEngine,
    EngineReply,
    LocalBatching,
    ModelInfo,
    ReadMode,
    ReadRequest,
)

KV = list[
    tuple[torch.Tensor, torch.Tensor]
]  # per layer: keys, values of one sequence, [1, heads, tokens, dim]


class PrefixCache:
    """Keys and values of prompt prefixes, keyed by token ids, least recently used evicted first.

    Bounded by bytes: SmolLM2-135M in float32 holds 46,080 bytes per token (30 layers × keys and
    values × 3 heads × 64 dims × 4 bytes), so 256 MiB keep about 5,800 prefix tokens.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("prefix_cache_mib must be 0 (off) or positive")
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[tuple[int, ...], tuple[KV, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, prefix: tuple[int, ...]) -> KV | None:
        if not self.max_bytes:
            return None
        with self._lock:
            entry = self._entries.get(prefix)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(prefix)
            self.hits += 1
            return entry[0]

    def put(self, prefix: tuple[int, ...], kv: KV) -> None:
        size = sum(k.nbytes + v.nbytes for k, v in kv)
        if size > self.max_bytes:  # also the "off" case, max_bytes 0
            return
        with self._lock:
            if prefix in self._entries:
                return
            self._entries[prefix] = (kv, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self.bytes -= evicted

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "entries": len(self._entries),
                "bytes": self.bytes,
                "max_bytes": self.max_bytes,
                "hits": self.hits,
                "misses": self.misses,
            }


@dataclass
class _Job:
    """The reads of one ``read_many`` call, waiting for a batch."""

    requests: Sequence[ReadRequest]
    top_k: int | None
    share_prefix: bool
    submitted: float
    future: concurrent.futures.Future


# Read once, at import: a thread that has not used torch yet reports the count the last worker set.
_THREAD_BUDGET = max(1, torch.get_num_threads())
DEFAULT_MAX_WORKERS = 2
"""The default's cap. Measured on two cores (evidence/multi-question-4); idle workers each take
the next job (the queue wakes a different one per job), so many of them would split concurrent
reads into batches of one instead of batching them."""


def thread_budget() -> int:
    """torch's intra-op threads when this module was imported: the cores it uses, or OMP_NUM_THREADS."""
    return _THREAD_BUDGET


class LocalEngine(ClosingEngine):
    """Batches run on ``workers`` threads (torch releases the GIL during the forward), each with
    ``thread_budget() // workers`` intra-op threads (at least one).

    The default is one worker per thread of the budget, at most ``DEFAULT_MAX_WORKERS``, for a
    server's concurrent load: on two cores, 10-question requests at concurrency 4 read 14.0 decisions/s against 11.4
    with one worker on both threads, and one-question requests at concurrency 8 read alike (2.92 and
    2.85). ``workers=1`` suits one client at a time: a lone request, or one large batch, has every
    thread (N=1 490 ms against 677; evidence/multi-question-4 and its embedded-workers-1/)."""

    kind = "local"

    def __init__(
        self,
        model_dir: Path,
        *,
        top_k: int | None = None,
        workers: int | None = None,
        dtype: str = "float32",
        share_prefix: bool = True,
        batching: LocalBatching = LocalBatching(),
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        budget = thread_budget()
        workers = min(budget, DEFAULT_MAX_WORKERS) if workers is None else workers
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.threads = max(1, budget // workers)
        model_dir = Path(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        # sdpa takes the boolean 4-D masks built below as they are.
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=getattr(torch, dtype), attn_implementation="sdpa"
        )
        self.model.eval()
        self._decoder = self.model.get_decoder()
        self._head = self.model.get_output_embeddings()
        config = self.model.config
        # Gemma 3's sliding layers see only the last `sliding_window` keys. The decoder takes the 4-D
        # masks built below as they are, for every layer, so those layers get their own (``_layer_masks``).
        sliding = "sliding_attention" in (getattr(config, "layer_types", None) or ())
        self._window = int(config.sliding_window) if sliding and config.sliding_window else None
        self._softcap = getattr(config, "final_logit_softcapping", None)
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
        self.share_prefix = share_prefix
        self.batches = 0  # forward batches run, and the reads in them: how much micro-batching happened
        self.batched_reads = 0
        self.dropped_reads = 0  # queued reads whose callers were cancelled before a batch took them
        self.batch_window_s = batching.batch_window_ms / 1000
        self.max_batch = batching.max_batch
        self.prefix_cache = PrefixCache(int(batching.prefix_cache_mib * 2**20))
        self._pad_id = int(
            self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else self.tokenizer.eos_token_id or 0
        )
        self._probe = {
            "engine": "local",
            "model_dir": str(model_dir),
            "dtype": dtype,
            "share_prefix": share_prefix,
            "batch_window_ms": batching.batch_window_ms,
            "max_batch": batching.max_batch,
            "prefix_cache_mib": batching.prefix_cache_mib,
            "workers": workers,
            "threads_per_worker": self.threads,
        }
        self._set_top_k(top_k)
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._workers = [
            threading.Thread(target=self._serve, name=f"local-engine-{i}", daemon=True)
            for i in range(workers)
        ]
        for worker in self._workers:
            worker.start()
        self._owns_workers = True
        # Worker threads that used torch must be gone before the interpreter finalises, or the C++
        # runtime aborts the process at exit ("terminate called without an active exception").
        atexit.register(_stop_workers, self._jobs, self._workers)

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
        """The same loaded model read another way (exact, or top-k), sharing weights, workers and cache."""
        variant = copy.copy(self)
        variant._set_top_k(top_k)
        variant._owns_workers = False
        return variant

    def with_share_prefix(self, share_prefix: bool) -> LocalEngine:
        """The same loaded model on the shared path (True) or the per-question path (False)."""
        variant = copy.copy(self)
        variant.share_prefix = share_prefix
        variant._probe = {**self._probe, "share_prefix": share_prefix}
        variant._set_top_k(self.top_k)
        variant._owns_workers = False
        return variant

    def next_token_logprobs(self, prompt_ids: Sequence[int]) -> torch.Tensor:
        """Full-vocabulary log-softmax after ``prompt_ids``: one sequence, no cache, no padding (the
        reference every batched read is tested against)."""
        with torch.inference_mode():
            ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
            logits = self.model(input_ids=ids, logits_to_keep=1, use_cache=False).logits[0, -1]
            return torch.log_softmax(logits.float(), dim=-1)

    async def read(self, request: ReadRequest) -> EngineReply:
        return (await self.read_many([request]))[0]

    async def read_many(self, requests: Sequence[ReadRequest]) -> list[EngineReply]:
        if not requests:
            return []
        job = _Job(
            list(requests), self.top_k, self.share_prefix, time.monotonic(), concurrent.futures.Future()
        )
        self._jobs.put(job)
        results, queued_ms, latency_ms = await asyncio.wrap_future(job.future)
        return [
            EngineReply(
                logprobs=logprobs,
                read_mode=self.capabilities.read_mode,
                prompt_tokens=len(request.prompt_ids),
                latency_ms=latency_ms,
                queued_ms=queued_ms,
            )
            for request, logprobs in zip(requests, results)
        ]

    async def aclose(self) -> None:
        if self._owns_workers:
            await asyncio.to_thread(_stop_workers, self._jobs, self._workers)

    # Worker side ------------------------------------------------------------------------------

    def _serve(self) -> None:
        # Per worker thread: the calling thread (and so the caller's own torch work) keeps its count.
        # torch's per-thread setup runs on a thread's first torch call and reloads the process-wide
        # count, which any other thread may have set since: run it first, then set this worker's.
        torch.get_num_threads()
        torch.set_num_threads(self.threads)
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if not job.future.set_running_or_notify_cancel():
                self.dropped_reads += len(
                    job.requests
                )  # its caller went away while it queued: compute nothing for it
                continue
            jobs, rows = [job], len(job.requests)
            deadline = time.monotonic() + self.batch_window_s
            while rows < self.max_batch:
                try:
                    more = (
                        self._jobs.get(timeout=max(deadline - time.monotonic(), 0))
                        if self.batch_window_s
                        else self._jobs.get_nowait()
                    )
                except queue.Empty:
                    break
                if more is None:
                    self._jobs.put(None)  # the next loop ends this worker
                    break
                if more.future.set_running_or_notify_cancel():
                    jobs.append(more)
                    rows += len(more.requests)
                else:
                    self.dropped_reads += len(more.requests)
            self._run(jobs)

    def _run(self, jobs: list[_Job]) -> None:
        started = time.monotonic()
        try:
            rows = self.batch_logprobs(
                [request.prompt_ids for job in jobs for request in job.requests],
                [
                    request.prefix_tokens if job.share_prefix else 0
                    for job in jobs
                    for request in job.requests
                ],
            )
        except BaseException as error:
            for job in jobs:
                job.future.set_exception(error)
            return
        latency_ms = (time.monotonic() - started) * 1000
        self.batches += 1
        self.batched_reads += len(rows)
        at = 0
        for job in jobs:
            results = [
                _pick(rows[at + i], request.label_ids, job.top_k) for i, request in enumerate(job.requests)
            ]
            at += len(job.requests)
            # A running future cannot be cancelled (set_running_or_notify_cancel above), so this always lands.
            job.future.set_result((results, (started - job.submitted) * 1000, latency_ms))

    def batch_logprobs(
        self, prompts: Sequence[Sequence[int]], prefix_tokens: Sequence[int]
    ) -> list[torch.Tensor]:
        """Full-vocabulary log-softmax after each prompt, computed as described in the module docstring;
        a prompt with ``prefix_tokens`` 0 is computed whole."""
        with torch.inference_mode():
            splits = [self._split(tuple(ids), n) for ids, n in zip(prompts, prefix_tokens)]
            kv: dict[tuple[int, ...], KV] = {}
            missing = []
            for prefix in dict.fromkeys(prefix for prefix, _ in splits if prefix):
                cached = self.prefix_cache.get(prefix)
                if cached is None:
                    missing.append(prefix)
                else:
                    kv[prefix] = cached
            for start in range(0, len(missing), self.max_batch):
                for prefix, prefix_kv in zip(
                    missing[start : start + self.max_batch],
                    self._prefill(missing[start : start + self.max_batch]),
                ):
                    kv[prefix] = prefix_kv
                    self.prefix_cache.put(prefix, prefix_kv)
            out: list[torch.Tensor] = []
            for start in range(0, len(splits), self.max_batch):
                out += self._suffixes(splits[start : start + self.max_batch], kv)
            return out

    def _split(self, ids: tuple[int, ...], prefix_tokens: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        if not ids:
            raise ValueError("a read needs at least one prompt token")
        cut = min(prefix_tokens, len(ids) - 1)  # the suffix keeps the last token
        return ids[:cut], ids[cut:]

    def _prefill(self, prefixes: list[tuple[int, ...]]) -> list[KV]:
        """Keys and values of each prefix, from one right-padded forward (padding sits after the
        real tokens, so no real token attends to it and no query row is fully masked)."""
        lengths = [len(prefix) for prefix in prefixes]
        width = max(lengths)
        ids = torch.full((len(prefixes), width), self._pad_id, dtype=torch.long)
        real = torch.zeros((len(prefixes), width), dtype=torch.bool)
        for row, prefix in enumerate(prefixes):
            ids[row, : len(prefix)] = torch.tensor(prefix)
            real[row, : len(prefix)] = True
        causal = torch.ones((width, width), dtype=torch.bool).tril()
        mask = (causal[None] & real[:, None, :])[:, None]
        positions = torch.arange(width).expand(len(prefixes), width)
        from transformers import DynamicCache

        cache = DynamicCache()
        masks = self._layer_masks(mask, positions, positions)
        self._decoder(
            input_ids=ids, attention_mask=masks, position_ids=positions, cache=cache, use_cache=True
        )
        return [
            [
                (
                    layer.keys[row : row + 1, :, :length].clone(),
                    layer.values[row : row + 1, :, :length].clone(),
                )
                for layer in cache.layers
            ]
            for row, length in enumerate(lengths)
        ]

    def _suffixes(
        self, rows: list[tuple[tuple[int, ...], tuple[int, ...]]], kv: dict[tuple[int, ...], KV]
    ) -> list[torch.Tensor]:
        """Log-softmax after each suffix, read in one forward against its prefix's keys and values."""
        from transformers import DynamicCache

        count = len(rows)
        past = max(len(prefix) for prefix, _ in rows)
        width = max(len(suffix) for _, suffix in rows)
        ids = torch.full((count, width), self._pad_id, dtype=torch.long)
        real = torch.zeros((count, past + width), dtype=torch.bool)
        positions = torch.zeros((count, width), dtype=torch.long)
        for row, (prefix, suffix) in enumerate(rows):
            ids[row, : len(suffix)] = torch.tensor(suffix)
            real[row, : len(prefix)] = True
            real[row, past : past + len(suffix)] = True
            positions[row] = torch.arange(len(prefix), len(prefix) + width)
        # Query i (at key index past + i) sees every past key and the suffix keys up to itself.
        causal = torch.cat(
            [
                torch.ones((width, past), dtype=torch.bool),
                torch.ones((width, width), dtype=torch.bool).tril(),
            ],
            dim=1,
        )
        mask = (causal[None] & real[:, None, :])[:, None]
        cache = DynamicCache()
        if past:
            template = next(kv[prefix] for prefix, _ in rows if prefix)
            layers = []
            for layer, (keys, values) in enumerate(template):
                batch_keys = keys.new_zeros((count, keys.shape[1], past, keys.shape[3]))
                batch_values = values.new_zeros((count, values.shape[1], past, values.shape[3]))
                for row, (prefix, _) in enumerate(rows):
                    if prefix:
                        batch_keys[row, :, : len(prefix)] = kv[prefix][layer][0][0]
                        batch_values[row, :, : len(prefix)] = kv[prefix][layer][1][0]
                layers.append((batch_keys, batch_values))
            cache = DynamicCache(layers)
        # Key positions: the padded past holds each prefix's tokens at their own positions (padding is masked).
        key_positions = torch.cat([torch.arange(past).expand(count, past), positions], dim=1)
        hidden = self._decoder(
            input_ids=ids,
            attention_mask=self._layer_masks(mask, positions, key_positions),
            position_ids=positions,
            cache=cache,
            use_cache=True,
        ).last_hidden_state
        last = hidden[torch.arange(count), torch.tensor([len(suffix) - 1 for _, suffix in rows])]
        logits = self._head(last).float()
        if self._softcap:  # as the model's own forward does after its head (Gemma 2)
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return list(torch.log_softmax(logits, dim=-1))

    def _layer_masks(
        self, mask: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """``mask`` for every layer, or with a sliding window, per layer type: sliding layers also
        hide keys ``sliding_window`` or more positions before the query (as transformers' own masks)."""
        if self._window is None:
            return mask
        near = (query_positions[:, :, None] - key_positions[:, None, :]) < self._window
        return {"full_attention": mask, "sliding_attention": mask & near[:, None]}


def _pick(logprobs: torch.Tensor, label_ids: Sequence[int], top_k: int | None) -> dict[int, float]:
    if top_k is None:
        return {token_id: float(logprobs[token_id]) for token_id in label_ids}
    values, ids = torch.topk(logprobs, top_k)
    return dict(zip(ids.tolist(), values.tolist()))


def _stop_workers(jobs: queue.Queue, workers: list[threading.Thread]) -> None:
    """Let queued batches finish, then end every worker (idempotent)."""
    if any(worker.is_alive() for worker in workers):
        for _ in workers:
            jobs.put(None)
        for worker in workers:
            worker.join()
