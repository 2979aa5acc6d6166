"""The engine seam: async reads of next-token log-probs, plus what the engine can do.

Engines are the only code that talks to a model. The reader builds token-id prompts and label ids;
an engine returns log-probs for the next token and says what those numbers are (``ReadMode``).
``read_many`` takes the reads of one request (one state, many questions): their prompts share a
prefix (``ReadRequest.prefix_tokens``) that an engine may compute once.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from readers.images import StateImage

Tier = Literal["interactive", "batch"]


class ReadMode(enum.StrEnum):
    """What an engine's log-probs cover, best first.

    - ``exact``: full-vocabulary log-probs of every label token (GPU/CPU vLLM ``logprob_token_ids``,
      the local engine).
    - ``masked``: the engine masks the vocabulary to the label tokens before computing log-probs, so
      every label comes back and differences between labels are exact (structured-output choice).
    - ``topk``: only the top-k tokens come back; a missing label gets the floor.
    """

    EXACT = "exact"
    MASKED = "masked"
    TOPK = "topk"


@dataclass(frozen=True)
class ModelInfo:
    """Which model answers, as reported in every answer and manifest."""

    name: str
    revision: str
    description: str
    release_date: str
    context_length: int
    vocab_size: int


@dataclass(frozen=True)
class Capabilities:
    """What the engine accepts, found at start-up (probe evidence kept for manifests)."""

    read_mode: ReadMode
    max_logprobs: int
    top_k: int
    probe: dict[str, Any] = field(default_factory=dict)
    shares_tokens_in_call: bool = False
    """The engine computes each distinct prompt token of one ``read_many`` call once (the local
    engine's token tree), so a token trie's levels can all go in one call. Otherwise (vLLM) a level's
    prompts reuse the level above only once it is computed: one call per level."""
    images: bool = False
    """The served model reads images (a vLLM engine's start-up probe, ``readers/engines/vllm.py``):
    ``ReadRequest.images`` are read, not ignored."""
    image_tokens: int = 0
    """Prompt tokens one image takes, as the engine counted the probe's image (its prompt count less
    the text's): what admission prices an image at before it is read (``service/pricing.py``)."""
    features: bool = False
    """The engine returns the model's final hidden state at a read's position where the read asks
    (``ReadRequest.features``): the local engine. A probe calibration needs it (``calibration.probe``)."""


@dataclass(frozen=True)
class ReadRequest:
    """One next-token read: the prompt cut at the answer slot and the label tokens to read.

    ``prefix_tokens`` leading prompt ids are shared with every other read of the same state (system
    prompt and state); 0 when unknown. A hint for reuse and routing only: the read's result never
    depends on it.
    """

    prompt_ids: tuple[int, ...]
    label_ids: tuple[int, ...]
    label_texts: tuple[str, ...]
    prefix_tokens: int = 0
    keep: bool = True
    """Whether an engine that keeps prompts' keys and values for later requests should keep this
    one's. A content-free prior read is read once per question (the service keeps the prior it
    gives): kept, its thousands of tokens for a long option list would evict the question itself.
    A hint: the read's result never depends on it."""
    affinity_key: str | None = None
    """A caller's own routing key (OpenAI's ``prompt_cache_key``): reads with one key go to one
    engine of a fleet, whatever their prompts. None: the shared prefix decides. A hint for routing
    only: the read's result never depends on it."""
    tenant: str | None = None
    """Whose read: an engine serving many callers takes turns between tenants (the local engine's
    queue, ``readers/engines/jobs.py``), so one tenant's many reads do not wait out another's one.
    None: the service's own reads (the readiness probe). A hint for scheduling only: the read's
    result never depends on it."""
    cache_salt: str | None = None
    """Whose prompt cache: an engine that keeps computed prompt tokens reuses them only for reads of
    the same salt (the local engine's tree per salt, vLLM's ``cache_salt``), so no caller learns
    from ``tokens_reused`` or latency what another sent (issue 40). A tenant's, or the cache group
    its key file names (``service.scopes.Caller.cache_salt``). None: unsalted, the service's own
    reads. The read's result never depends on it."""
    tier: Tier | None = None
    """How urgent: ``interactive`` (a caller waits on one decision) or ``batch`` (``/decide/batch``,
    calibration example sets). An engine behind a router that schedules by priority names it there
    (vLLM behind GKE Inference Gateway: the InferenceObjective header, ``readers/engines/vllm.py``).
    None: the engine's default. A hint for scheduling only: the read's result never depends on it."""
    features: bool = False
    """Return the model's final hidden state at the answer slot (``EngineReply.features``), where the
    engine can (``Capabilities.features``); the reader asks for it at a question's first read."""
    images: tuple[StateImage, ...] = ()
    """The state's images, read before its text (``readers.images``): only an engine whose
    ``Capabilities.images`` is true reads them; the service refuses them for any other (a 400
    naming the engine and model) before a read is made."""


@dataclass(frozen=True)
class EngineReply:
    """Next-token log-probs as the engine returned them.

    ``logprobs`` maps token id to log-prob. In ``topk`` mode it holds the k tokens returned (labels
    may be missing); in ``exact`` and ``masked`` mode it holds at least the label tokens.
    ``normalised_over_labels`` is true when the values are renormalised over the label tokens only
    (a mask applied before the log-softmax), so their total mass says nothing about the vocabulary.
    """

    logprobs: dict[int, float]
    read_mode: ReadMode
    prompt_tokens: int
    latency_ms: float
    normalised_over_labels: bool = False
    queued_ms: float = 0.0
    """Time the read waited for a free engine slot before ``latency_ms`` began."""
    computed_tokens: int | None = None
    """Prompt tokens whose keys and values this read computed; None where the engine does not say.
    A token shared by several reads of one batch is counted once, on the first read that needs it,
    so the reads' sum is what the engine computed."""
    cached_tokens: int | None = None
    """Prompt tokens whose keys and values came from the engine's prefix cache (or from another read
    of the same batch); ``computed_tokens + cached_tokens == prompt_tokens`` where both are known."""
    features: tuple[float, ...] | None = None
    """The model's final hidden state at the read's position (the unembedding's input, after the
    last norm), where the read asked for it and the engine returns it; else None."""


class ClosingEngine:
    """Makes an engine an async context manager: ``async with await open_engine(...) as engine``.

    Opening is awaited on its own (a vLLM engine probes its server first); leaving the block closes.
    """

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        return None

    async def read_many(self, requests: Sequence[ReadRequest]) -> list[EngineReply]:
        """The reads of one request, in order; by default each through ``read``, concurrently."""
        return list(await asyncio.gather(*(self.read(request) for request in requests)))


class Engine(Protocol):
    """What the reader needs from an engine. ``read`` and ``read_many`` are the only calls that
    reach a model; ``read_many(requests)[i]`` equals ``read(requests[i])`` up to float rounding."""

    kind: str
    info: ModelInfo
    capabilities: Capabilities
    tokenizer: Any

    async def read(self, request: ReadRequest) -> EngineReply: ...

    async def read_many(self, requests: Sequence[ReadRequest]) -> list[EngineReply]: ...

    async def aclose(self) -> None: ...

    async def __aenter__(self) -> Engine: ...

    async def __aexit__(self, *exc_info) -> None: ...


# vLLM engine defaults, here so the command line reads them without importing the HTTP client.
DEFAULT_MAX_IN_FLIGHT = 16  # reads in flight per vLLM server at once (like its --max-num-seqs)
DEFAULT_TIMEOUT_S = 30.0  # seconds a vLLM engine waits for a reply
DEFAULT_VLLM_TOP_K = 32  # log-probs a top-k read asks for: what TPU serving returns at most


@dataclass(frozen=True)
class LocalBatching:
    """The local engine's batching: how long a batch waits for company (ms), how many reads one
    batch holds, how many MiB of prompt keys and values it keeps for tokens seen again (0: none kept
    between batches), and how much one forward computes at most.

    256 MiB holds about 5,800 tokens of SmolLM2-135M's float32 KV (46,080 bytes per token)."""

    batch_window_ms: float = 2.0
    max_batch: int = 16
    prefix_cache_mib: float = 256.0
    chunk_tokens: int = 512
    """Prompt tokens computed in one forward at most (a long prompt goes through in chunks)."""
    chunk_scores: int = 2**22
    """Query × key attention scores per head one forward may hold: with SmolLM2's 9 heads in float32,
    4M scores take 151 MiB."""

    def __post_init__(self) -> None:
        if self.batch_window_ms < 0:
            raise ValueError("batch_window_ms must be 0 or more")
        if self.max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if self.prefix_cache_mib < 0:
            raise ValueError("prefix_cache_mib must be 0 (off) or positive")
        if self.chunk_tokens < 1:
            raise ValueError("chunk_tokens must be at least 1")
        if self.chunk_scores < self.chunk_tokens:
            raise ValueError("chunk_scores must be at least chunk_tokens")
