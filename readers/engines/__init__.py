"""Engines behind the reader: ``local`` (the embedded model, in process) and ``vllm`` (HTTP).

open_engine("local")                      the local engine: the embedded SmolLM2, prepared on first use
open_engine("local", model="gemma3-270m") another embedded model (readers/embedded.py lists them)
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
LOCAL_DTYPES = ("float32", "bfloat16")
"""What the local engine computes in. float32 is the default and the reference: every read equals the
same prompt read alone to 1e-4. bfloat16 is an opt-in for speed where the CPU has bf16 units
(``avx512_bf16``, AMX): on this project's 2-core AMD EPYC, 600 reads of the shipped tasks took 20.6 s
against 50.9 s, with the largest change of any option's probability 0.079 and 6 of 600 answers
different; under the current layout and its own attention (``readers/engines/attention.py``) 0.064 and
8 of 600 (docs/shared-state.md, "The embedded engine in bfloat16" and "First seen"). The bound it is
offered under: answers equal on at least 98% of records, every probability within 0.1 of float32's
(``tests/readers/test_local_precision.py`` holds the probabilities on a sample of every task)."""


async def open_engine(
    kind: str,
    *,
    url: str | None = None,
    model_dir: Path | None = None,
    top_k: int | None = None,
    tokenizer: str | None = None,
    read_mode: ReadMode | None = None,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    share_prefix: bool = True,
    batching: LocalBatching | None = None,
    prefill_first: bool = False,
    model: str | None = None,
    chat_template: str | None = None,
    dtype: str = "float32",
) -> Engine:
    """Build the engine ``kind``; the vLLM engine probes the server before it is returned.

    ``share_prefix=False`` is the per-question path (no KV shared between a request's reads), kept
    to measure what sharing the state gains. ``batching`` sets the local engine's micro-batching and
    prefix cache (defaults: ``LocalBatching()``); vLLM schedules its own batches, and
    ``prefill_first`` reads a request's first question before the others (``VLLMEngine.read_many``).

    ``model`` names an embedded model (``readers.embedded.EMBEDDED_MODELS``; default SmolLM2), prepared on
    first use: the local engine runs it, and a vLLM engine (serving it from ``decide engine start --model``)
    reads its tokenizer from the prepared folder. ``dtype`` is what the local engine computes in
    (``LOCAL_DTYPES``); a vLLM server's is set when it starts. ``chat_template`` (jinja text, as vLLM's
    ``--chat-template``) replaces the tokenizer's template; an engine left with none is refused."""
    if kind == "local":
        folder = model_folder(model, model_dir)
        from readers.engines.local import LocalEngine

        if read_mode not in (None, ReadMode.EXACT if top_k is None else ReadMode.TOPK):
            raise ValueError("the local engine reads exact, or top-k with --top-k")
        engine: Engine = LocalEngine(
            folder,
            top_k=top_k,
            dtype=dtype,
            share_prefix=share_prefix,
            batching=batching or LocalBatching(),
        )
    elif kind == "vllm":
        from readers.engines.addresses import parse_engine_urls
        from readers.engines.routed import RoutedEngine
        from readers.engines.vllm import VLLMEngine

        if not url:
            raise ValueError("the vllm engine needs --engine-url")
        if dtype != "float32":
            raise ValueError("--dtype sets the local engine's precision; a vLLM server's is its own --dtype")
        urls, by_name = parse_engine_urls(url)
        options = dict(
            top_k=top_k or DEFAULT_VLLM_TOP_K,
            tokenizer=tokenizer or (str(model_folder(model, model_dir)) if model or model_dir else None),
            read_mode=read_mode,
            max_in_flight=max_in_flight,
            timeout_s=timeout_s,
            share_prefix=share_prefix,
            prefill_first=prefill_first,
            chat_template=chat_template,
        )
        if by_name:
            engine = await RoutedEngine.connect_name(urls[0], **options)
        elif len(urls) > 1:
            engine = await RoutedEngine.connect(urls, **options)
        else:
            engine = await VLLMEngine.connect(urls[0], **options)
    else:
        raise ValueError(f"unknown engine {kind!r}; choose one of {', '.join(ENGINE_KINDS)}")
    try:
        return with_chat_template(engine, chat_template)
    except NoChatTemplate:
        await engine.aclose()
        raise


def model_folder(model: str | None, model_dir: Path | None) -> Path:
    """The folder ``--model NAME`` (prepared on first use) or ``--model-dir`` names; default the embedded
    SmolLM2. ``readers.embedded.ModelUnavailable`` when the name is unknown or its packages are missing."""
    from readers.embedded import DEFAULT_EMBEDDED, prepare_embedded_model

    if model is not None and model_dir is not None:
        raise ValueError("give --model (an embedded model) or --model-dir (a folder), not both")
    if model_dir is not None:
        return Path(model_dir)
    return prepare_embedded_model(name=model or DEFAULT_EMBEDDED)


class NoChatTemplate(ValueError):
    """The engine's tokenizer has no chat template, or one that cannot render the reader's turns."""


# The turns every read renders (readers/labels.py ChatTemplate): a system, a user and an assistant message.
_PROBE_TURNS = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": "a"},
]


def with_chat_template(engine: Engine, chat_template: str | None) -> Engine:
    """``engine`` with ``chat_template`` as its tokenizer's template; ``NoChatTemplate`` when it then has
    none or the template cannot render a system, user and assistant turn.

    Checked at opening because every read renders the template: a base model's folder (no template)
    would otherwise fail each request instead of the start-up."""
    tokenizer = engine.tokenizer
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    if not getattr(tokenizer, "chat_template", None):
        raise NoChatTemplate(
            f"{engine.info.name} has no chat template (a base model?): pass --chat-template FILE, a jinja "
            "template that renders the system, user and assistant turns"
        )
    try:
        tokenizer.apply_chat_template(_PROBE_TURNS, tokenize=False)
    except Exception as error:  # jinja's syntax and undefined errors, the template's raise_exception
        raise NoChatTemplate(
            f"{engine.info.name}'s chat template cannot render a system, user and assistant turn: {error}"
        ) from None
    return engine


__all__ = [
    "DEFAULT_VLLM_TOP_K",
    "ENGINE_KINDS",
    "LOCAL_DTYPES",
    "Capabilities",
    "Engine",
    "EngineReply",
    "LocalBatching",
    "ModelInfo",
    "NoChatTemplate",
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
