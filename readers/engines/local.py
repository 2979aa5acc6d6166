"""The local engine: a Hugging Face causal LM run in process on the CPU, full-vocabulary log-softmax.

Reads are exact by default. ``top_k`` makes it answer like a top-k engine (only the k most likely
tokens come back), to measure what top-k costs on the same model.

How a batch of reads is computed (``share_prefix=True``, the default):

1. Reads arriving within ``batch_window_ms`` of each other on an idle engine (while it computes:
   those queued at its next chunk), up to ``max_batch`` reads, form one batch (micro-batching:
   concurrent requests share forward passes).
2. Every distinct prompt token of the batch is computed once, and none whose keys and values the
   engine keeps from earlier batches (``readers/engines/kvtree.py``, a radix tree of prompt tokens
   bounded by ``prefix_cache_mib``): the state shared by a request's questions, the question above a
   token trie's deeper reads, a content-free prior read's text, a request seen before.
3. The tokens to compute go through the model in chunks, in one sequence per chunk: a mask lets
   each token see exactly the tokens before it in its own prompt, positions are its own prompt's,
   so every read equals the same prompt read alone (to float rounding). A chunk holds at most
   ``chunk_tokens`` tokens and a bounded number of attention scores, so a read of many options
   works in bounded memory.
4. One compute thread runs every batch on the whole thread budget, a chunk at a time, taking turns
   between the batches in flight (``RUNNING_BATCHES``): a batch that arrives while a long one runs
   waits for one chunk, not for the long batch to end (unless it needs tokens the long one is still
   computing: then it waits for them rather than compute them twice). Why one thread: torch's
   OpenMP on Linux (libgomp) keeps a team of helper threads for every thread that ran a parallel
   region, and once it manages more threads than there are cores its helpers spin only ~100 times
   before they sleep. A forward is thousands of small parallel regions, so each then waits for its
   helpers to wake: on a 2-core machine, a 143-token chunk took 288 ms with 1.50 cores busy on a
   second thread with a team of its own, against 202 ms and 1.99 cores on the only one
   (``bench/openmp_teams.py``; docs/shared-state.md, "One compute thread").

``share_prefix=False`` is the per-question path: every read's whole prompt is computed on its own
(still micro-batched), nothing kept. It is kept to measure what reuse gains.

Each reply says how many of its prompt tokens the read computed and how many it reused.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import copy
import ctypes
import ctypes.util
import itertools
import threading
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
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
from readers.engines.kvtree import KV_TOKEN_DIM, Chunk, KVTree, Plan

TRIM_ABOVE_BYTES = 64 * 2**20
"""A batch whose chunks worked in more memory than this returns what it freed to the system."""
PICK_ROWS = 64
"""Full-vocabulary rows turned into label log-probs at once: Gemma's 262,144-token rows take 1 MiB
each in float32, so a 255-option trie level is never held whole."""


@dataclass
class _Job:
    """The reads of one ``read_many`` call, waiting for a batch."""

    requests: Sequence[ReadRequest]
    top_k: int | None
    share_prefix: bool
    submitted: float
    future: concurrent.futures.Future
    # Set when the caller is cancelled after the compute thread took the job (its future can no
    # longer be cancelled): a batch whose every job is abandoned stops at its next chunk.
    abandoned: threading.Event = field(default_factory=threading.Event)


class ReadsAbandoned(Exception):
    """A batch stopped between chunks: every caller of its reads was cancelled."""


class EngineClosed(RuntimeError):
    """A read sent to a local engine that was closed, or whose compute thread stopped."""


class _JobQueue:
    """Reads waiting for the compute thread."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._jobs: collections.deque[_Job] = collections.deque()
        self._closed = False
        self.dropped_reads = 0  # queued reads whose callers were cancelled before a batch took them

    def put(self, job: _Job) -> None:
        with self._ready:
            if self._closed:  # nothing would ever take it
                raise EngineClosed("the local engine is closed")
            self._jobs.append(job)
            self._ready.notify_all()

    def close(self) -> None:
        """The compute thread takes what is queued, then ends."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    def fail(self, error: BaseException) -> None:
        """Closes the queue and fails every queued job with ``error`` (the compute thread stopped)."""
        with self._ready:
            self._closed = True
            while self._jobs:
                job = self._jobs.popleft()
                if job.future.set_running_or_notify_cancel():
                    job.future.set_exception(error)

    def take(self, *, idle: bool, window_s: float, max_rows: int) -> list[_Job] | None:
        """The next batch: queued jobs up to ``max_rows`` reads (the last one taken may pass it; at
        least one job), a job whose caller was cancelled while it queued dropped (nothing is
        computed for it). ``idle`` (nothing else to compute): wait for a first job, then for those
        arriving within ``window_s`` of it; otherwise take only what is queued, maybe nothing ([]).
        None: closed and nothing queued."""
        with self._ready:
            batch: list[_Job] = []
            rows = 0
            while not batch:
                if not self._jobs:
                    if self._closed:
                        return None
                    if not idle:
                        return batch
                    self._ready.wait()
                    continue
                rows = self._take_queued(batch, rows, max_rows)
            deadline = time.monotonic() + window_s
            while idle and rows < max_rows and not self._closed:
                if self._jobs:
                    rows = self._take_queued(batch, rows, max_rows)
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._ready.wait(remaining)
            return batch

    def _take_queued(self, batch: list[_Job], rows: int, max_rows: int) -> int:
        while self._jobs and (not batch or rows < max_rows):
            job = self._jobs.popleft()
            if job.future.set_running_or_notify_cancel():
                batch.append(job)
                rows += len(job.requests)
            else:
                self.dropped_reads += len(job.requests)
        return rows


@dataclass
class Computed:
    """A batch's reads: the final hidden state of each prompt and the plan that computed them."""

    hidden: list[torch.Tensor]
    plan: Plan
    peak_bytes: int
    """The largest chunk's past and new keys and values plus its attention scores (an estimate)."""


# Read once, at import: a thread that has not used torch yet reports the count the last batch set.
_THREAD_BUDGET = max(1, torch.get_num_threads())
RUNNING_BATCHES = 2
"""Batches the compute thread takes turns between: a batch that arrives while a long one runs starts
at the long one's next chunk; more wait in the queue, in order (a read whose caller leaves while it
is queued costs nothing), and a running batch's working memory is held at most twice."""


def thread_budget() -> int:
    """torch's intra-op threads when this module was imported: the cores it uses, or OMP_NUM_THREADS."""
    return _THREAD_BUDGET


class LocalEngine(ClosingEngine):
    """Batches run on one compute thread (torch releases the GIL during the forward), on the whole
    thread budget, the batches in flight taking turns a chunk at a time (module docstring, 4)."""

    kind = "local"

    def __init__(
        self,
        model_dir: Path,
        *,
        top_k: int | None = None,
        dtype: str = "float32",
        share_prefix: bool = True,
        batching: LocalBatching = LocalBatching(),
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.thread_budget = thread_budget()
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
        self.stopped_batches = 0  # batches stopped between chunks, every caller cancelled
        # The batches the compute thread takes turns between, with their jobs (variants share it).
        self._running: collections.deque[tuple[list[_Job], Generator[bool, None, None]]] = collections.deque()
        self.batch_window_s = batching.batch_window_ms / 1000
        self.max_batch = batching.max_batch
        self.chunk_tokens = batching.chunk_tokens
        self.chunk_scores = batching.chunk_scores
        self.prefix_cache = KVTree(int(batching.prefix_cache_mib * 2**20))
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        bytes_per = torch.finfo(getattr(torch, dtype)).bits // 8
        self.kv_bytes_per_token = int(config.num_hidden_layers) * 2 * kv_heads * head_dim * bytes_per
        self._score_bytes = heads * 4  # float32 scores per query × key pair, over the heads
        self._probe = {
            "engine": "local",
            "model_dir": str(model_dir),
            "dtype": dtype,
            "share_prefix": share_prefix,
            "batch_window_ms": batching.batch_window_ms,
            "max_batch": batching.max_batch,
            "prefix_cache_mib": batching.prefix_cache_mib,
            "chunk_tokens": batching.chunk_tokens,
            "chunk_scores": batching.chunk_scores,
            "compute_threads": 1,
            "thread_budget": self.thread_budget,
        }
        self._set_top_k(top_k)
        self._jobs = _JobQueue()
        self._worker = threading.Thread(target=self._serve, name="local-engine", daemon=True)
        self._worker.start()
        self._owns_worker = True
        # A thread that used torch must be gone before the interpreter finalises, or the C++ runtime
        # aborts the process at exit ("terminate called without an active exception").
        atexit.register(_stop_worker, self._jobs, self._worker)

    @property
    def _in_flight(self) -> int:
        """Batches the compute thread is taking turns between."""
        return len(self._running)

    @property
    def dropped_reads(self) -> int:
        """Queued reads whose callers were cancelled before a batch took them."""
        return self._jobs.dropped_reads

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
            shares_tokens_in_call=self.share_prefix,
        )

    def with_top_k(self, top_k: int | None) -> LocalEngine:
        """The same loaded model read another way (exact, or top-k), sharing weights, compute thread
        and cache."""
        variant = copy.copy(self)
        variant._set_top_k(top_k)
        variant._owns_worker = False
        return variant

    def with_share_prefix(self, share_prefix: bool) -> LocalEngine:
        """The same loaded model on the shared path (True) or the per-question path (False)."""
        variant = copy.copy(self)
        variant.share_prefix = share_prefix
        variant._probe = {**self._probe, "share_prefix": share_prefix}
        variant._set_top_k(self.top_k)
        variant._owns_worker = False
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
        try:
            results, queued_ms, latency_ms = await asyncio.wrap_future(job.future)
        except asyncio.CancelledError:
            job.abandoned.set()
            raise
        return [
            EngineReply(
                logprobs=logprobs,
                read_mode=self.capabilities.read_mode,
                prompt_tokens=len(request.prompt_ids),
                latency_ms=latency_ms,
                queued_ms=queued_ms,
                computed_tokens=computed,
                cached_tokens=cached,
            )
            for request, (logprobs, computed, cached) in zip(requests, results)
        ]

    async def aclose(self) -> None:
        if self._owns_worker:
            await asyncio.to_thread(_stop_worker, self._jobs, self._worker)

    # Worker side ------------------------------------------------------------------------------

    def _serve(self) -> None:
        """The compute thread: batches in flight take turns, one step (a chunk) each. Should it stop
        on an error of its own, every read taken or queued fails with it rather than wait forever."""
        running = self._running
        try:
            self._take_turns(running)
        except BaseException as error:
            stopped = EngineClosed(f"the local engine's compute thread stopped: {error!r}")
            for jobs, steps in running:
                steps.close()  # a started batch fails its callers itself (``_run``)
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(stopped)
            self._jobs.fail(stopped)
            raise

    def _take_turns(self, running: collections.deque[tuple[list[_Job], Generator[bool, None, None]]]) -> None:
        # torch's per-thread setup runs on a thread's first torch call and reloads the process-wide
        # count, which another thread may have set since: run it first, then this thread's own count.
        torch.get_num_threads()
        torch.set_num_threads(self.thread_budget)
        waiting = 0  # batches in a row whose plan waited for tokens another batch is computing
        with torch.inference_mode():
            while True:
                jobs = (
                    self._jobs.take(idle=not running, window_s=self.batch_window_s, max_rows=self.max_batch)
                    if len(running) < RUNNING_BATCHES
                    else []
                )
                if jobs is None and not running:
                    return
                if jobs:
                    running.append((jobs, self._run(jobs)))
                if not running:
                    continue
                _, steps = running[0]  # stays counted in flight while it takes its step
                try:
                    blocked = next(steps)
                except StopIteration:
                    running.popleft()
                    waiting = 0
                    continue
                running.rotate(-1)
                waiting = waiting + 1 if blocked else 0
                if waiting >= len(running):  # every batch waits: on one computed outside this thread
                    self.prefix_cache.wait_for_change(timeout_s=0.05)
                    waiting = 0

    def _run(self, jobs: list[_Job]) -> Generator[bool, None, None]:
        """One batch, a step at a time (yields True while it waits for tree nodes another batch is
        computing, False after each chunk); its callers' futures get its replies or its error."""
        started = time.monotonic()
        requests = [(job, request) for job in jobs for request in job.requests]
        try:
            computed = yield from self._compute_steps(
                [request.prompt_ids for _, request in requests],
                [job.share_prefix for job, _ in requests],
                keep=[request.keep for _, request in requests],
                stop=lambda: all(job.abandoned.is_set() for job in jobs),
            )
            picks: list[dict[int, float]] = []
            for start in range(0, len(requests), PICK_ROWS):
                rows = self._logprobs(computed.hidden[start : start + PICK_ROWS])
                picks += [
                    _pick(row, request.label_ids, job.top_k)
                    for row, (job, request) in zip(rows, requests[start : start + PICK_ROWS])
                ]
                yield False  # a full-vocabulary head per group of rows: another batch's turn between
        except BaseException as error:
            if isinstance(error, ReadsAbandoned):
                self.stopped_batches += 1
            failure = error if isinstance(error, Exception) else EngineClosed("the local engine stopped")
            for job in jobs:
                job.future.set_exception(failure)
            if not isinstance(error, Exception):  # the generator closed, the thread stopping: go on
                raise
            return
        if computed.peak_bytes > TRIM_ABOVE_BYTES:
            _return_freed_memory()
        latency_ms = (time.monotonic() - started) * 1000
        self.batches += 1
        self.batched_reads += len(requests)
        plan = computed.plan
        results = list(zip(picks, plan.computed_tokens, plan.cached_tokens))
        at = 0
        for job in jobs:
            # A running future cannot be cancelled (``_JobQueue.take``), so this always lands.
            job.future.set_result(
                (results[at : at + len(job.requests)], (started - job.submitted) * 1000, latency_ms)
            )
            at += len(job.requests)

    def batch_logprobs(
        self, prompts: Sequence[Sequence[int]], reuse: bool | Sequence[bool] = True
    ) -> list[torch.Tensor]:
        """Full-vocabulary log-softmax after each prompt, computed as described in the module
        docstring; a prompt with ``reuse`` False is computed whole, on its own."""
        return list(self._logprobs(self.compute(prompts, reuse).hidden))

    def compute(
        self,
        prompts: Sequence[Sequence[int]],
        reuse: bool | Sequence[bool] = True,
        *,
        keep: Sequence[bool] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> Computed:
        """The final hidden state of each prompt, every distinct token computed once (module
        docstring), on the calling thread; ``keep`` False: that prompt's new tokens are not kept
        after the batch. ``stop`` True before a chunk: raise ``ReadsAbandoned`` there, the tree left
        as if the batch never ran (a chunk already running cannot be stopped: torch finishes it)."""
        steps = self._compute_steps(prompts, reuse, keep=keep, stop=stop, wait=True)
        with torch.inference_mode():
            while True:
                try:
                    next(steps)
                except StopIteration as done:
                    return done.value

    def _compute_steps(
        self,
        prompts: Sequence[Sequence[int]],
        reuse: bool | Sequence[bool],
        *,
        keep: Sequence[bool] | None,
        stop: Callable[[], bool] | None,
        wait: bool = False,
    ) -> Generator[bool, None, Computed]:
        """``compute`` a step at a time: yields True while its plan waits for tree nodes another batch
        is computing (``wait`` False: the compute thread runs that batch meanwhile), False after each
        chunk; returns the ``Computed``. The caller holds ``torch.inference_mode``."""
        if isinstance(reuse, bool):
            reuse = [reuse] * len(prompts)
        while (plan := self.prefix_cache.plan(prompts, reuse, keep, wait=wait)) is None:
            if stop is not None and stop():
                raise ReadsAbandoned  # nothing planned yet: nothing to take out of the tree
            yield True
        try:
            wanted = {(id(segment), offset) for segment, offset in plan.outputs}
            hidden: dict[tuple[int, int], torch.Tensor] = {}
            peak = 0
            for queries in plan.chunks(self.chunk_tokens, self.chunk_scores):
                if stop is not None and stop():
                    raise ReadsAbandoned
                chunk = plan.chunk_keys(queries)
                peak = max(peak, self.chunk_bytes(chunk))
                new_kv, states = self._forward(chunk)
                at = 0
                for segment, group in itertools.groupby(queries, key=lambda query: query[0]):
                    n = sum(1 for _ in group)
                    segment.pieces.append(new_kv[:, :, :, at : at + n])
                    at += n
                for row, (segment, offset) in enumerate(queries):
                    if (id(segment), offset) in wanted:
                        hidden[(id(segment), offset)] = states[row].clone()
                yield False
            self.prefix_cache.finish(plan)
        except BaseException:
            self.prefix_cache.abandon(plan)
            raise
        return Computed([hidden[(id(segment), offset)] for segment, offset in plan.outputs], plan, peak)

    def chunk_bytes(self, chunk: Chunk) -> int:
        """A chunk's working memory, estimated: its past and new keys and values, held twice (the
        past is assembled, then each layer's cache concatenates the new keys to it), and the attention
        scores of one layer."""
        keys = chunk.key_tokens + len(chunk.queries)
        return 2 * keys * self.kv_bytes_per_token + len(chunk.queries) * keys * self._score_bytes

    def _forward(self, chunk: Chunk) -> tuple[torch.Tensor, torch.Tensor]:
        """One chunk through the decoder against its past keys: the chunk's own keys and values
        [layers, 2, kv heads, tokens, head dim] and its last hidden states [tokens, hidden]."""
        from transformers import DynamicCache

        past_tokens = chunk.key_tokens
        cache = DynamicCache()
        if past_tokens:
            past = torch.cat([kv for _, kv in chunk.keys], dim=KV_TOKEN_DIM)
            cache = DynamicCache([(layer[0][None], layer[1][None]) for layer in past])
        queries, keys = chunk.positions()
        ids = torch.tensor([[segment.tokens[offset] for segment, offset in chunk.queries]])
        mask = chunk.visible()[None, None]
        hidden = self._decoder(
            input_ids=ids,
            attention_mask=self._layer_masks(mask, queries[None], keys[None]),
            position_ids=queries[None],
            cache=cache,
            use_cache=True,
        ).last_hidden_state[0]
        new_kv = torch.stack(
            [
                torch.stack((layer.keys[0, :, past_tokens:], layer.values[0, :, past_tokens:]))
                for layer in cache.layers
            ]
        )
        return new_kv, hidden

    def _logprobs(self, hidden: Sequence[torch.Tensor]) -> torch.Tensor:
        """Full-vocabulary log-softmax rows from final hidden states."""
        if not hidden:
            return torch.empty(0, self.info.vocab_size)
        with torch.inference_mode():
            logits = self._head(torch.stack(list(hidden))).float()
            if self._softcap:  # as the model's own forward does after its head (Gemma 2)
                logits = torch.tanh(logits / self._softcap) * self._softcap
            return torch.log_softmax(logits, dim=-1)

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


def _load_malloc_trim():
    library = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(library).malloc_trim if library else None
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _load_malloc_trim()


def _return_freed_memory() -> None:
    """Hands a batch's freed working memory back to the system. glibc keeps freed blocks below its
    (adaptive) mmap threshold in its arenas, so after one large read the process would stay as large
    as that read's peak; ``malloc_trim`` releases them (measured in bench/latency.py: retained RSS)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _stop_worker(jobs: _JobQueue, worker: threading.Thread) -> None:
    """Let queued batches finish, then end the compute thread (idempotent)."""
    jobs.close()
    worker.join()
