"""The local engine: a Hugging Face causal LM run in process on the CPU, full-vocabulary log-softmax.

Reads are exact by default. ``top_k`` makes it answer like a top-k engine (only the k most likely
tokens come back), to measure what top-k costs on the same model.

How a batch of reads is computed (``share_prefix=True``, the default):

1. Reads arriving within ``batch_window_ms`` of each other on an idle engine (while it computes:
   those queued at its next chunk), up to ``max_batch`` reads, form one batch (micro-batching:
   concurrent requests share forward passes; the queue is ``readers/engines/jobs.py``).
2. Every distinct prompt token of the batch is computed once, and none whose keys and values the
   engine keeps from earlier batches (``readers/engines/kvtree.py``, a radix tree of prompt tokens
   bounded by ``prefix_cache_mib``): the state shared by a request's questions, the question above a
   token trie's deeper reads, a content-free prior read's text, a request seen before.
3. The tokens to compute go through the model in chunks, in one sequence per chunk: a mask lets
   each token see exactly the tokens before it in its own prompt, positions are its own prompt's,
   so every read equals the same prompt read alone (to float rounding). A chunk holds at most
   ``chunk_tokens`` tokens and a bounded number of attention scores, so a read of many options
   works in bounded memory (``readers/engines/chunked.py``).
4. One compute thread (this module) runs every batch on the whole thread budget, a chunk at a time, taking turns
   between the batches in flight (``RUNNING_BATCHES`` per tenant, ``MAX_RUNNING_BATCHES`` in all):
   the smallest batch takes the next chunk, unless its tenant was passed over for ``MAX_PASSED_S`` of
   other tenants' chunks, or a batch for ``MAX_PASSED_TURNS`` of its own tenant's (``readers/engines/turns.py``).
   A batch that arrives while a long one runs waits for the chunk in progress, not for the long
   batch to end (unless it needs tokens the long one is still computing: then it waits
   for them rather than compute them twice, where the long one is the same tenant's; another tenant's
   prompt computes them itself, ``readers/engines/kvtree.py``). Why one thread: torch's
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
import threading
import time
from collections.abc import Generator, Sequence
from pathlib import Path

from opendecide.extras import needs_extra

with needs_extra("local", "the local engine"):
    import torch

from readers.embedded import model_manifest
from readers.engines import LOCAL_DTYPES
from readers.engines.attention import attention_function
from readers.engines.base import (
    Capabilities,
    ClosingEngine,
    EngineReply,
    LocalBatching,
    ModelInfo,
    ReadMode,
    ReadRequest,
)
from readers.engines.chunked import ChunkedForward
from readers.engines.freed_memory import TRIM_ABOVE_BYTES, return_freed_memory
from readers.engines.jobs import EngineClosed, Job, JobQueue, ReadsAbandoned
from readers.engines.turns import (
    MAX_RUNNING_BATCHES,
    ActiveTenants,
    Running,
    busy_tenants,
    chunk_limit,
    next_turn,
    passed_over,
)

PICK_ROWS = 64
"""Full-vocabulary rows turned into label log-probs at once: Gemma's 262,144-token rows take 1 MiB
each in float32, so a 255-option trie level is never held whole."""
# Read once, at import: a thread that has not used torch yet reports the count the last batch set.
_THREAD_BUDGET = max(1, torch.get_num_threads())


def thread_budget() -> int:
    """torch's intra-op threads when this module was imported: the cores it uses, or OMP_NUM_THREADS."""
    return _THREAD_BUDGET


class LocalEngine(ChunkedForward, ClosingEngine):
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

        if dtype not in LOCAL_DTYPES:
            raise ValueError(f"dtype {dtype!r}: the local engine computes in {' or '.join(LOCAL_DTYPES)}")
        self.dtype = dtype
        self.thread_budget = thread_budget()
        model_dir = Path(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        # Both take the boolean 4-D masks the chunked forward builds as they are: torch's fused sdpa in
        # float32, and in bfloat16 matrix products that run at bfloat16's speed (readers/engines/attention.py).
        attention = attention_function(dtype)
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=getattr(torch, dtype), attn_implementation=attention
        )
        model.eval()
        ChunkedForward.__init__(self, model, dtype=dtype, batching=batching)
        config = model.config
        vocab_size = int(config.vocab_size)
        manifest = model_manifest(model_dir)
        self.info = ModelInfo(
            name=manifest.get("name", model_dir.name),
            revision=precision_revision(manifest.get("revision", "local-folder"), dtype),
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
        self._running: collections.deque[Running] = collections.deque()
        self._active = ActiveTenants()  # who started a batch lately (compute thread only)
        self.batch_window_s = batching.batch_window_ms / 1000
        self.max_batch = batching.max_batch
        self._probe = {
            "engine": "local",
            "model_dir": str(model_dir),
            "dtype": dtype,
            "attention": attention,  # transformers' attn_implementation: which kernel read the answers
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
        self._jobs = JobQueue()
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
            features=True,
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

    async def read(self, request: ReadRequest) -> EngineReply:
        return (await self.read_many([request]))[0]

    async def read_many(self, requests: Sequence[ReadRequest]) -> list[EngineReply]:
        if not requests:
            return []
        job = Job(
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
                features=features,
            )
            for request, (logprobs, computed, cached, features) in zip(requests, results)
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
            for batch in running:
                batch.steps.close()  # a started batch fails its callers itself (``_run``)
                for job in batch.jobs:
                    if not job.future.done():
                        job.future.set_exception(stopped)
            self._jobs.fail(stopped)
            raise

    def _take_turns(self, running: collections.deque[Running]) -> None:
        # torch's per-thread setup runs on a thread's first torch call and reloads the process-wide
        # count, which another thread may have set since: run it first, then this thread's own count.
        torch.get_num_threads()
        torch.set_num_threads(self.thread_budget)
        with torch.inference_mode():
            while True:
                jobs = (
                    self._jobs.take(
                        idle=not running, window_s=self.batch_window_s, max_rows=self.max_batch,
                        busy=busy_tenants(running),
                    )
                    if len(running) < MAX_RUNNING_BATCHES
                    else []
                )  # fmt: skip
                if jobs is None and not running:
                    return
                if jobs:
                    running.append(Running(jobs, self._run(jobs)))
                    self._active.started(jobs[0].tenant)
                if not running:
                    continue
                turn = next_turn(running)
                if turn is None:  # every batch waits: on tokens computed outside this thread
                    self.prefix_cache.wait_for_change(timeout_s=0.05)
                    for batch in running:
                        batch.blocked = False
                    continue
                stepped = time.monotonic()
                try:  # it stays counted in flight while it takes its step
                    turn.blocked = next(turn.steps)
                except StopIteration:
                    running.remove(turn)
                    for batch in running:  # its tokens are in the tree now: whoever waited may plan
                        batch.blocked = False
                    continue
                if not turn.blocked:
                    passed_over(running, turn, time.monotonic() - stepped)

    def _chunk_limit(self, batch_tokens: int, tenant: str | None) -> int:
        """A batch's next chunk at most (``readers/engines/turns.py``, ``chunk_limit``)."""
        return chunk_limit(
            self.chunk_tokens,
            batch_tokens,
            others_active=self._active.besides(tenant) or self._jobs.waiting_besides(tenant),
            batches_running=len(self._running),
        )

    def _run(self, jobs: list[Job]) -> Generator[bool, None, None]:
        """One batch, a step at a time (yields True while it waits for tree nodes another batch is
        computing, False after each chunk); its callers' futures get its replies or its error."""
        started = time.monotonic()
        requests = [(job, request) for job in jobs for request in job.requests]
        batch_tokens = sum(len(request.prompt_ids) for _, request in requests)
        try:
            computed = yield from self._compute_steps(
                [request.prompt_ids for _, request in requests],
                [job.share_prefix for job, _ in requests],
                keep=[request.keep for _, request in requests],
                stop=lambda: all(job.abandoned.is_set() for job in jobs),
                tenant=jobs[0].tenant,  # a batch is one tenant's (``JobQueue.take``)
                salts=[request.cache_salt for _, request in requests],
                chunk_limit=lambda: self._chunk_limit(batch_tokens, jobs[0].tenant),
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
            return_freed_memory()
        latency_ms = (time.monotonic() - started) * 1000
        self.batches += 1
        self.batched_reads += len(requests)
        plan = computed.plan
        # The hidden state where a read asked for it, as float32 whatever the engine computes in.
        features = [
            tuple(computed.hidden[i].float().tolist()) if request.features else None
            for i, (_, request) in enumerate(requests)
        ]
        results = list(zip(picks, plan.computed_tokens, plan.cached_tokens, features))
        at = 0
        for job in jobs:
            # A running future cannot be cancelled (``JobQueue.take``), so this always lands.
            job.future.set_result(
                (results[at : at + len(job.requests)], (started - job.submitted) * 1000, latency_ms)
            )
            at += len(job.requests)


def precision_revision(revision: str, dtype: str) -> str:
    """The model revision as answers and calibrations name it: a bfloat16 engine's reads are another
    function of the same weights, so its calibration fits and decision records are kept apart from
    float32's (they are keyed by revision) and every answer says which it was."""
    return revision if dtype == "float32" else f"{revision}+{dtype}"


def _pick(logprobs: torch.Tensor, label_ids: Sequence[int], top_k: int | None) -> dict[int, float]:
    if top_k is None:
        return {token_id: float(logprobs[token_id]) for token_id in label_ids}
    values, ids = torch.topk(logprobs, top_k)
    return dict(zip(ids.tolist(), values.tolist()))


def _stop_worker(jobs: JobQueue, worker: threading.Thread) -> None:
    """Let queued batches finish, then end the compute thread (idempotent)."""
    jobs.close()
    worker.join()
