"""Which models fit which chip, before renting it (``decide survey``).

From a model's metadata (licence, config, parameter count): weight bytes, KV-cache bytes per token,
the chip's usable memory minus a stated activation reserve, and so the KV tokens left and the
concurrency they allow at ``--max-model-len``. Verdict: ``fits``; ``tight`` (less than 2 GiB left
for KV); ``no``.

- Weights: ``safetensors`` parameter total when the metadata has it, else counted from the config
  (decoder-only llama/qwen/granite/smollm shapes: embeddings, attention, MLP, norms), × dtype bytes.
- KV bytes per token: 2 (K and V) × KV heads × head dim × KV dtype bytes, summed over layers that
  keep their own KV. A sliding-window layer holds at most ``window`` tokens per sequence, so it counts
  for window / max_model_len of a token's KV; KV-shared layers (``num_kv_shared_layers``) count zero.
- KV dtype: vLLM's ``--kv-cache-dtype``. ``auto`` (its default, on every chip) stores KV in the
  weights' dtype; ``fp8`` stores one byte per value, as ``float8_e5m2`` on v6e and ``float8_e4m3fn``
  elsewhere (see ``kv_dtype``).
- Multimodal configs (Gemma 3's ``Gemma3ForConditionalGeneration``) nest the language model under
  ``text_config``, often naming only the fields that differ from transformers' defaults: layers,
  heads and head dim are read from that section with the defaults filled in by transformers' own
  config class. Their weights include a vision tower the config count does not cover, so they need
  the Hub's ``safetensors`` total.
- Usable memory: chip memory × ``--gpu-memory-utilization``. TPU: 0.92, vLLM's default, which is
  what gives the caps seen in start-up logs (v5e 14.49 GiB of 15.75, v6e 28.74 GiB of 31.24:
  tpu-inference caps HBM at limit × utilisation). NVIDIA L4: 22.4 GiB × 0.9. The activation reserve
  (0.25 GiB by default) is the gap left between cap, weights and KV in the reference study's v5e
  start-ups; with it, predictions land within 5% of the KV tokens measured there (see the tests).
- A fixed KV pool (vLLM's ``--kv-cache-memory-bytes``, ``kv_cache_gib`` here) replaces
  "usable − weights − reserve". vLLM documents that such a pool ignores the utilisation, so on a GPU
  weights + reserve + pool must fit the whole memory; on TPU the worker sizes KV from its cap, so
  the cap stays the limit. On ``cpu`` (vLLM-CPU) the pool is required, host memory being the user's.
- KV tokens are whole blocks, as vLLM allocates them: 128 tokens per block on TPU (tpu-inference's
  usage report) and on vLLM-CPU (its default), 16 on CUDA.
- Measured capacity (a start-up log's "KV cache size" and TPU "Memory statistics" lines, via
  ``eval.capacity.kv_log``) is set beside the prediction: KV tokens, and on TPU the cap and the memory in use
  before the KV cache (weights plus what the reserve stands for).

The check against the reference study's published builds is :mod:`eval.capacity.survey_study`. This
module stays one (~500 lines): every rule above feeds the one sizing in :func:`survey_model`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

GIB = 1024**3
DTYPE_BYTES = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "fp8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
}
# vLLM's --kv-cache-dtype choices the survey sizes (its fp8_inc and fp8_ds_mla are for other backends)
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
# vLLM's --dtype names → the dtype they load weights (and, with kv-cache-dtype auto, KV) in
VLLM_DTYPES = {
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float": "float32",
    "float32": "float32",
}
CHIPS = ("v5e", "v6e", "l4", "cpu")
CHIP_TOTAL_GIB: dict[str, float | None] = {"v5e": 15.75, "v6e": 31.24, "l4": 22.4, "cpu": None}
DEFAULT_MEMORY_UTILISATION = {"v5e": 0.92, "v6e": 0.92, "l4": 0.9, "cpu": None}
TPU_CHIPS = ("v5e", "v6e")
BLOCK_TOKENS = {"v5e": 128, "v6e": 128, "l4": 16, "cpu": 128}
# the device word vLLM puts before "KV cache size" ("GPU" for CUDA, else the device type upper-cased)
LOG_DEVICE_CHIPS = {"CPU": ("cpu",), "GPU": ("l4",), "TPU": TPU_CHIPS}
DEFAULT_RESERVE_GIB = 0.25
TIGHT_GIB = 2.0


def text_config(config: dict) -> dict:
    """The language model's config: ``config`` itself, or its ``text_config`` with the fields the
    file leaves out filled from transformers' config class for that model type (Gemma 3's 4B
    config.json names 6 of them; heads, KV heads, head dim and layer types are defaults)."""
    nested = config.get("text_config")
    if nested is None:
        return config
    from transformers import AutoConfig

    outer = {key: value for key, value in config.items() if key != "model_type"}
    try:
        resolved = AutoConfig.for_model(config.get("model_type", ""), **outer).get_text_config().to_dict()
    except (ValueError, KeyError):  # a model type this transformers does not know: the file's fields only
        return dict(nested)
    return {key: value for key, value in resolved.items() if value is not None}


def kv_dtype(chip: str, kv_cache_dtype: str, weights_dtype: str) -> str:
    """The dtype KV is stored in for vLLM's ``--kv-cache-dtype`` on ``chip``.

    ``auto`` is the weights' dtype on every chip, TPU v6e included. tpu-inference's model runner
    (tpu_inference/runner/tpu_runner.py, read at b8692ff, 2026-08-22: ``if cache_dtype == "auto":
    cache_dtype = self.dtype``) sizes the KV cache in the model dtype. The v6e start-up line
    "Automatically using fp8_e5m2 for FP8 KV cache on TPU v6e." comes from
    ``TpuPlatform.fp8_dtype()`` (tpu_inference/platforms/tpu_platform.py, same commit), which
    only says which fp8 variant ``fp8`` means there: it is logged whether or not fp8 KV is asked for.
    """
    if kv_cache_dtype == "auto":
        return weights_dtype
    if kv_cache_dtype == "fp8":
        return "float8_e5m2" if chip == "v6e" else "float8_e4m3fn"
    return {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}.get(kv_cache_dtype, kv_cache_dtype)


def parameter_count(config: dict) -> int:
    """Parameters of a decoder-only transformer from its config (llama-like shapes)."""
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or hidden // heads
    vocab, inter = config["vocab_size"], config["intermediate_size"]
    attention = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    if config.get("attention_bias"):
        attention += heads * head_dim + 2 * kv_heads * head_dim + hidden
    qk_norm = 2 * head_dim if config.get("model_type") in ("qwen3", "qwen3_moe", "gemma3_text") else 0
    per_layer = attention + qk_norm + 3 * hidden * inter + 2 * hidden
    if config.get("model_type") == "gemma3_text":
        per_layer += 2 * hidden  # pre/post feed-forward norms
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", False) else 2)
    return embeddings + layers * per_layer + hidden


def kv_bytes_per_token(
    config: dict, *, max_model_len: int, dtype_bytes: int, sliding_kv: str = "window"
) -> float:
    """KV bytes one token costs. Full-attention layers use ``global_head_dim`` and
    ``num_global_key_value_heads`` where the config has them (Gemma 4: 512-wide, fewer heads).
    ``sliding_kv="window"`` charges a sliding layer window / max_model_len of a token; ``"full"`` charges
    it the whole token, as tpu-inference allocated Gemma 4 12B's cache in the reference study (its
    9,728 tokens beside 11.31 GiB of weights are 336 KiB a token: every layer at full length)."""
    kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    sliding_layer = 2 * kv_heads * head_dim * dtype_bytes
    full_layer = (
        2
        * (config.get("num_global_key_value_heads") or kv_heads)
        * (config.get("global_head_dim") or head_dim)
        * dtype_bytes
    )
    layers = config["num_hidden_layers"]
    types = config.get("layer_types") or ["full_attention"] * layers
    shared = config.get("num_kv_shared_layers", 0) or 0
    window = config.get("sliding_window") or max_model_len
    share = 1.0 if sliding_kv == "full" else min(1.0, window / max_model_len)
    total = 0.0
    for kind in types[: layers - shared]:
        total += sliding_layer * share if kind == "sliding_attention" else full_layer
    return total


# Weight formats (``--weight-format``): bytes per parameter of the quantized linear layers, and how the
# token embedding is stored. Group-scaled 4-bit stores half a byte per value plus one bf16 scale per 32;
# per-channel int8/fp8 add one float32 scale per output row, under 0.1% of the layer, left out.
# ``-emb4``: the embedding as int4 groups of 32, and a tied output head as a second int4 copy (vLLM
# ties a head by copying ``.weight``, which a packed table lacks: the study wrote an untied int4
# lm_head); ``-emb8``: the embedding as int8 with a bf16 scale per 32 columns, the head reading the same
# table (the study's 26B v5e build). Everything else (norms, router, towers) stays bf16.
GROUP_INT4_BYTES = 0.5 + 2 / 32
GROUP_INT8_BYTES = 1 + 2 / 32
# format: (bytes per linear parameter, bytes per embedding parameter or None for bf16, tied head copied)
WEIGHT_FORMATS = {
    "bf16": (2.0, None, False),
    "fp8": (1.0, None, False),
    "w8a8": (1.0, None, False),
    "w8a8-emb4": (1.0, GROUP_INT4_BYTES, True),
    "w4a16": (GROUP_INT4_BYTES, None, False),
    "w4a16-emb8": (GROUP_INT4_BYTES, GROUP_INT8_BYTES, False),
}
SLIDING_KV = ("window", "full")


def parameter_classes(meta: dict, config: dict) -> dict:
    """Parameters by how a weight format stores them: ``linear`` (the decoder's projections, experts
    included), ``embedding`` (the token table), ``head`` (an untied lm_head), ``other`` (norms, router,
    towers). From the metadata's ``parameters`` when it has them, else counted from a llama-like config."""
    if "parameters" in meta:
        classes = dict(meta["parameters"])
        classes.setdefault("head", 0)
        return classes
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    total = parameter_count(config)
    embedding = vocab * hidden
    head = 0 if config.get("tie_word_embeddings", False) else embedding
    norms = config["num_hidden_layers"] * 2 * hidden + hidden
    if config.get("model_type") == "gemma3_text":
        norms += config["num_hidden_layers"] * 2 * hidden
    return {"linear": total - embedding - head - norms, "embedding": embedding, "head": head, "other": norms}


def format_weight_bytes(classes: dict, weight_format: str, *, tied: bool) -> float:
    """Bytes of weights in ``weight_format`` (``WEIGHT_FORMATS``)."""
    linear_bytes, table_bytes, head_copied = WEIGHT_FORMATS[weight_format]
    total = classes["linear"] * linear_bytes + classes["other"] * 2
    if table_bytes is None:
        return total + (classes["embedding"] + classes["head"]) * 2
    head = classes["embedding"] if tied and head_copied else classes["head"]
    return total + (classes["embedding"] + head) * table_bytes


@dataclass(frozen=True)
class SurveyRow:
    model: str
    license: str
    architecture: str
    chip: str
    weights_gib: float
    kv_bytes_per_token: float
    kv_dtype: str
    usable_gib: float | None
    reserve_gib: float
    kv_gib: float
    kv_tokens: int
    max_concurrency: float
    verdict: str
    measured_kv_tokens: int | None = None
    measured_cap_gib: float | None = None
    measured_in_use_gib: float | None = None
    measured_source: str | None = None
    kv_pool_fixed: bool = False
    why_not: str | None = None

    def as_json(self) -> dict:
        return asdict(self)


def usable_gib(chip: str, memory_utilisation: float | None = None) -> float | None:
    """The memory vLLM lets weights, activations and KV share on ``chip`` (None on ``cpu``)."""
    total = CHIP_TOTAL_GIB[chip]
    return None if total is None else total * (memory_utilisation or DEFAULT_MEMORY_UTILISATION[chip])


def survey_model(
    model: str,
    meta: dict,
    *,
    chip: str,
    max_model_len: int,
    reserve_gib: float = DEFAULT_RESERVE_GIB,
    kv_cache_gib: float | None = None,
    dtype: str | None = None,
    kv_cache_dtype: str = "auto",
    memory_utilisation: float | None = None,
    measured: dict | None = None,
    weight_format: str | None = None,
    sliding_kv: str = "window",
) -> SurveyRow:
    """One model on one chip. ``kv_cache_dtype`` is vLLM's ``--kv-cache-dtype`` (see ``kv_dtype``).
    ``measured`` is ``eval.capacity.kv_log.measured_capacity``'s dict; without it the metadata's
    ``measured_kv_tokens[chip]`` (if any) is shown. ``weight_format`` (``WEIGHT_FORMATS``) sizes the
    weights as that build stores them (``parameter_classes``); None: every parameter in ``dtype``."""
    if weight_format is not None and weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"weight_format {weight_format!r} is not one of {', '.join(WEIGHT_FORMATS)}")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}")
    outer = meta["config"]
    config = text_config(outer)
    dtype = (
        dtype
        or meta.get("dtype")
        or outer.get("torch_dtype")
        or outer.get("dtype")
        or config.get("torch_dtype")
        or config.get("dtype")
        or "bfloat16"
    )
    if weight_format is not None:
        dtype = "bfloat16"  # quantized builds compute (and, with kv-cache-dtype auto, keep KV) in bf16
    dtype_bytes = DTYPE_BYTES[dtype]
    params = meta.get("safetensors_total")
    if weight_format is not None and "parameters" not in meta and "vision_config" in outer:
        raise ValueError(
            f"{model}: a weight format needs the metadata's parameters by class (the config counts no vision tower)"
        )
    if weight_format is not None:
        tied = bool(config.get("tie_word_embeddings", outer.get("tie_word_embeddings", False)))
        weights = format_weight_bytes(parameter_classes(meta, config), weight_format, tied=tied) / GIB
    elif not params and "vision_config" in outer:
        raise ValueError(
            f"{model}: the config counts the language model only, not its vision tower; give the Hub's safetensors total"
        )
    else:
        weights = (params or parameter_count(config)) * dtype_bytes / GIB
    stored_kv = kv_dtype(chip, kv_cache_dtype, dtype)
    kv_per_token = kv_bytes_per_token(
        config, max_model_len=max_model_len, dtype_bytes=DTYPE_BYTES[stored_kv], sliding_kv=sliding_kv
    )
    usable = usable_gib(chip, memory_utilisation)
    why_not = None
    if kv_cache_gib is not None:
        kv_gib = kv_cache_gib
        limit = usable if chip in TPU_CHIPS else CHIP_TOTAL_GIB[chip]
        if limit is not None and weights + reserve_gib + kv_cache_gib > limit:
            why_not = f"{weights:.2f} + {reserve_gib:.2f} + {kv_cache_gib:.2f} > {limit:.2f} GiB"
    elif usable is None:
        raise ValueError(
            f"chip {chip!r} has no fixed memory: give the KV pool (vLLM --kv-cache-memory-bytes) as kv_cache_gib"
        )
    else:
        kv_gib = usable - weights - reserve_gib
        if kv_gib <= 0:
            why_not = f"weights + reserve {weights + reserve_gib:.2f} ≥ {usable:.2f} GiB"
    block = BLOCK_TOKENS[chip]
    kv_tokens = 0 if why_not or not kv_per_token else int(kv_gib * GIB // (kv_per_token * block)) * block
    if why_not is None and kv_tokens < max_model_len:
        why_not = f"{kv_tokens:,} KV tokens < one {max_model_len:,}-token request"
    verdict = "no" if why_not else "tight" if kv_gib < TIGHT_GIB else "fits"
    kv_measured = (measured or {}).get("kv_capacity") or {}
    memory = (measured or {}).get("memory_statistics") or {}
    return SurveyRow(
        model=model, license=meta.get("license", "unknown"), architecture=(outer.get("architectures") or ["?"])[0], chip=chip,
        weights_gib=weights, kv_bytes_per_token=kv_per_token, kv_dtype=stored_kv, usable_gib=usable,
        reserve_gib=reserve_gib, kv_gib=max(kv_gib, 0.0), kv_tokens=kv_tokens, max_concurrency=kv_tokens / max_model_len, verdict=verdict,
        measured_kv_tokens=kv_measured.get("kv_cache_tokens") if measured else (meta.get("measured_kv_tokens") or {}).get(chip),
        measured_cap_gib=memory.get("total_hbm_limit_cap_gib"), measured_in_use_gib=memory.get("total_hbm_used_gib"),
        measured_source=(measured or {}).get("source"), kv_pool_fixed=kv_cache_gib is not None, why_not=why_not,
    )  # fmt: skip


def measurement_mismatch(measured: dict, *, chip: str, max_model_len: int) -> str | None:
    """Why a measured capacity cannot stand beside a prediction for ``chip`` at ``max_model_len``, if it cannot."""
    kv = measured.get("kv_capacity") or {}
    device = kv.get("device")
    if device in LOG_DEVICE_CHIPS and chip not in LOG_DEVICE_CHIPS[device]:
        return f"the log is from a {device} server, not {chip}"
    if measured.get("memory_statistics") and chip not in TPU_CHIPS:
        return f"the log has a TPU memory line, and the chip is {chip}"
    if kv.get("max_model_len") and kv["max_model_len"] != max_model_len:
        return f"the server ran --max-model-len {kv['max_model_len']}: survey with the same --max-model-len"
    return None


def load_metadata(path: Path) -> dict[str, dict]:
    """Saved metadata: one JSON file {model_id: {license, config, safetensors_total?, measured_kv_tokens?}}."""
    return {key: value for key, value in json.loads(path.read_text()).items() if not key.startswith("_")}


def fetch_metadata(model: str, *, endpoint: str | None = None, cache_dir: Path | None = None) -> dict:
    """Metadata from the Hugging Face Hub (network): licence, parameter total, config.json at the
    revision the model info names. ``endpoint``: another Hub than ``HF_ENDPOINT`` (a mirror)."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint)
    info = api.model_info(model)
    config = json.loads(
        Path(api.hf_hub_download(model, "config.json", revision=info.sha, cache_dir=cache_dir)).read_text()
    )
    safetensors = getattr(info, "safetensors", None)
    return {
        "license": (info.card_data or {}).get("license", "unknown") if info.card_data else "unknown",
        "config": config,
        "safetensors_total": getattr(safetensors, "total", None),
    }


def survey_table(rows: list[SurveyRow]) -> str:
    lines = [
        "| model | licence | chip | weights GiB | KV bytes/token | KV dtype | KV GiB (usable − weights − reserve) | KV tokens | max concurrency | measured KV tokens | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        measured = f"{r.measured_kv_tokens:,} ({_delta(r)})" if r.measured_kv_tokens else "—"
        pool = (
            "fixed pool"
            if r.kv_pool_fixed
            else f"{r.usable_gib:.2f} − {r.weights_gib:.2f} − {r.reserve_gib:.2f}"
        )
        verdict = f"no ({r.why_not})" if r.why_not else r.verdict
        lines.append(
            f"| {r.model} | {r.license} | {r.chip} | {r.weights_gib:.2f} | {r.kv_bytes_per_token:,.0f} | {r.kv_dtype} | "
            f"{r.kv_gib:.2f} ({pool}) | {r.kv_tokens:,} | {r.max_concurrency:.1f}x | {measured} | {verdict} |"
        )
    return "\n".join(lines) + "\n"


def measured_table(rows: list[SurveyRow]) -> str:
    """Predicted beside measured, for the rows given a server log or run (``--measured``)."""
    lines = [
        "| model | chip | KV tokens predicted | measured | Δ | usable GiB predicted | measured cap | weights + reserve GiB | measured in use before KV |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    shown = [r for r in rows if r.measured_source]
    for r in shown:
        tokens = f"{r.measured_kv_tokens:,} | {_delta(r)}" if r.measured_kv_tokens else "— | —"
        cap, in_use = _gib(r.measured_cap_gib), _gib(r.measured_in_use_gib)
        lines.append(
            f"| {r.model} | {r.chip} | {r.kv_tokens:,} | {tokens} | {_gib(r.usable_gib)} | {cap} | {r.weights_gib + r.reserve_gib:.2f} | {in_use} |"
        )
    return "\n".join(lines) + "\n" if shown else ""


def _delta(row: SurveyRow) -> str:
    """Predicted minus measured KV tokens, relative to measured (none when the prediction is "no")."""
    if row.why_not:
        return "—"
    return f"{(row.kv_tokens - row.measured_kv_tokens) / row.measured_kv_tokens:+.1%}"


def _gib(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def survey_models(
    models: Sequence[str],
    *,
    chip: str,
    metadata: Path | None = None,
    licences: set[str] | None = None,
    measured: Sequence[str] = (),
    max_model_len: int = 4096,
    reserve_gib: float = DEFAULT_RESERVE_GIB,
    kv_cache_gib: float | None = None,
    dtype: str = "auto",
    kv_cache_dtype: str = "auto",
    memory_utilisation: float | None = None,
    weight_format: str | None = None,
    sliding_kv: str = "window",
) -> tuple[list[SurveyRow], list[str]]:
    """``decide survey``: each model on ``chip`` (offline from ``metadata``, else from the Hub); models
    whose licence is not in ``licences`` are left out and named. ``measured`` holds ``MODEL=PATH``
    items (a start-up log, or a run that recorded one) set beside the prediction; ``dtype`` is vLLM's
    ``--dtype`` (``auto``: the config's).

    Every option is checked before any file is read or the Hub is asked: a ValueError names the
    command's option (``--chip``, ``--measured``, …), or ``--metadata`` for a model it lacks."""
    check_survey_options(
        chip=chip, max_model_len=max_model_len, kv_cache_gib=kv_cache_gib, dtype=dtype,
        kv_cache_dtype=kv_cache_dtype, memory_utilisation=memory_utilisation,
    )  # fmt: skip
    if weight_format is not None and weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"--weight-format {weight_format!r}: choose one of {', '.join(WEIGHT_FORMATS)}")
    if sliding_kv not in SLIDING_KV:
        raise ValueError(f"--sliding-kv {sliding_kv!r}: choose one of {', '.join(SLIDING_KV)}")
    measurements = measured_capacities(measured, models=models, chip=chip, max_model_len=max_model_len)
    saved = load_metadata(metadata) if metadata else {}
    rows, skipped = [], []
    for model in models:
        meta = saved.get(model) or (None if metadata else fetch_metadata(model))
        if meta is None:
            raise ValueError(f"--metadata: {model} is not in {metadata}")
        if licences and meta.get("license") not in licences:
            skipped.append(
                f"{model} (licence {meta.get('license')}{'; its --measured unused' if model in measurements else ''})"
            )
            continue
        rows.append(
            survey_model(
                model,
                meta,
                chip=chip,
                max_model_len=max_model_len,
                reserve_gib=reserve_gib,
                kv_cache_gib=kv_cache_gib,
                dtype=VLLM_DTYPES.get(dtype),
                kv_cache_dtype=kv_cache_dtype,
                memory_utilisation=memory_utilisation,
                measured=measurements.get(model),
                weight_format=weight_format,
                sliding_kv=sliding_kv,
            )  # fmt: skip
        )
    return rows, skipped


def check_survey_options(
    *,
    chip: str,
    max_model_len: int,
    kv_cache_gib: float | None,
    dtype: str,
    kv_cache_dtype: str,
    memory_utilisation: float | None,
) -> None:
    """The survey's options, each against its own range; ValueError naming the first that is not."""
    if chip not in CHIPS:
        raise ValueError(f"--chip {chip!r}: choose one of {', '.join(CHIPS)}")
    if kv_cache_gib is not None and kv_cache_gib <= 0:
        raise ValueError(f"--kv-cache-gib must be above 0, got {kv_cache_gib:g}")
    if CHIP_TOTAL_GIB[chip] is None and kv_cache_gib is None:
        raise ValueError(
            f"--kv-cache-gib: {chip} has no fixed memory: give the KV pool the server is started with"
        )
    if memory_utilisation is not None and not 0 < memory_utilisation <= 1:
        raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {memory_utilisation:g}")
    if dtype != "auto" and dtype not in VLLM_DTYPES:
        raise ValueError(f"--dtype {dtype!r}: choose one of auto, {', '.join(VLLM_DTYPES)}")
    if max_model_len <= 0:
        raise ValueError(f"--max-model-len must be above 0, got {max_model_len}")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"--kv-cache-dtype {kv_cache_dtype!r}: choose one of {', '.join(KV_CACHE_DTYPES)}")


def measured_capacities(
    items: Sequence[str], *, models: Sequence[str], chip: str, max_model_len: int
) -> dict[str, dict]:
    """``--measured MODEL=PATH`` items → model → ``eval.capacity.kv_log.measured_capacity``'s dict; ValueError
    naming ``--measured`` for an item that is not MODEL=PATH for a surveyed model, a file without a
    measurement, or one measured on another chip or ``--max-model-len``."""
    from eval.capacity.kv_log import measured_capacity

    measurements = {}
    for item in items:
        model, sep, path = item.partition("=")
        if not sep or model not in models:
            raise ValueError(f"--measured {item!r} is not MODEL=PATH for one of the models surveyed")
        try:
            measurements[model] = measured_capacity(Path(path))
        except (OSError, ValueError) as error:
            raise ValueError(f"--measured {item}: {error}") from None
        if why := measurement_mismatch(measurements[model], chip=chip, max_model_len=max_model_len):
            raise ValueError(f"--measured {item}: {why}")
    return measurements
