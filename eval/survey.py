"""Which models fit which chip, before renting it (``decide survey``).

From a model's metadata (licence, config, parameter count): weight bytes, KV-cache bytes per token,
the chip's usable memory minus a stated activation reserve, and so the KV tokens left and the
concurrency they allow at ``--max-model-len``. Verdict: ``fits``; ``tight`` (less than 2 GiB left
for KV); ``no``.

- Weights: ``safetensors`` parameter total when the metadata has it, else counted from the config
  (decoder-only llama/qwen/granite/smollm shapes: embeddings, attention, MLP, norms), × dtype bytes.
- KV bytes per token: 2 (K and V) × KV heads × head dim × dtype bytes, summed over layers that keep
  their own KV. A sliding-window layer holds at most ``window`` tokens per sequence, so it counts
  for window / max_model_len of a token's KV; KV-shared layers (``num_kv_shared_layers``) count zero.
- Usable memory: the vLLM TPU caps seen in start-up logs (v5e 14.49 GiB of 15.75, v6e 28.74 GiB of
  31.24); NVIDIA L4: 22.4 GiB × ``--gpu-memory-utilization`` 0.9. The activation reserve
  (0.25 GiB by default) is the gap left between cap, weights and KV in the reference study's v5e
  start-ups; with it, predictions land within 5% of the KV tokens measured there (see the tests).
- A fixed KV pool (vLLM's ``--kv-cache-memory-bytes``, ``kv_cache_gib`` here) replaces
  "usable − weights − reserve"; on ``cpu`` (vLLM-CPU) it is required, host memory being the user's.
- KV tokens are whole blocks, as vLLM allocates them: 128 tokens per block on TPU (tpu-inference's
  usage report) and on vLLM-CPU (its default), 16 on CUDA.
- Measured capacity (a start-up log's "KV cache size" and TPU "Memory statistics" lines, via
  ``eval.kv_log``) is set beside the prediction: KV tokens, and on TPU the cap and the memory in use
  before the KV cache (weights plus what the reserve stands for).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

GIB = 1024**3
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1, "float8_e4m3fn": 1, "int8": 1}
CHIP_USABLE_GIB: dict[str, float | None] = {"v5e": 14.49, "v6e": 28.74, "l4": 22.4 * 0.9, "cpu": None}
CHIP_TOTAL_GIB: dict[str, float | None] = {"v5e": 15.75, "v6e": 31.24, "l4": 22.4, "cpu": None}
BLOCK_TOKENS = {"v5e": 128, "v6e": 128, "l4": 16, "cpu": 128}
DEFAULT_RESERVE_GIB = 0.25
TIGHT_GIB = 2.0


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


def kv_bytes_per_token(config: dict, *, max_model_len: int, dtype_bytes: int) -> float:
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    per_layer = 2 * kv_heads * head_dim * dtype_bytes
    layers = config["num_hidden_layers"]
    types = config.get("layer_types") or ["full_attention"] * layers
    shared = config.get("num_kv_shared_layers", 0) or 0
    window = config.get("sliding_window") or max_model_len
    total = 0.0
    for kind in types[: layers - shared]:
        total += per_layer * (min(1.0, window / max_model_len) if kind == "sliding_attention" else 1.0)
    return total


@dataclass(frozen=True)
class SurveyRow:
    model: str
    license: str
    architecture: str
    chip: str
    weights_gib: float
    kv_bytes_per_token: float
    usable_gib: float | None
    reserve_gib: float
    kv_gib: float
    kv_tokens: int
    max_concurrency: float
    verdict: str
    measured_kv_tokens: int | None = None
    measured_usable_gib: float | None = None
    measured_in_use_gib: float | None = None
    kv_pool_fixed: bool = False

    def as_json(self) -> dict:
        return asdict(self)


def survey_model(
    model: str,
    meta: dict,
    *,
    chip: str,
    max_model_len: int,
    reserve_gib: float = DEFAULT_RESERVE_GIB,
    kv_cache_gib: float | None = None,
    dtype: str | None = None,
    measured: dict | None = None,
) -> SurveyRow:
    """One model on one chip. ``measured`` is ``eval.kv_log.measured_capacity``'s dict; without it the
    metadata's ``measured_kv_tokens[chip]`` (if any) is shown."""
    config = meta["config"]
    dtype = dtype or meta.get("dtype") or config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    dtype_bytes = DTYPE_BYTES[dtype]
    params = meta.get("safetensors_total") or parameter_count(config)
    weights = params * dtype_bytes / GIB
    kv_per_token = kv_bytes_per_token(config, max_model_len=max_model_len, dtype_bytes=dtype_bytes)
    usable = CHIP_USABLE_GIB[chip]
    if kv_cache_gib is not None:
        kv_gib = kv_cache_gib if usable is None or weights + reserve_gib + kv_cache_gib <= usable else 0.0
    elif usable is None:
        raise ValueError(f"chip {chip!r} has no fixed memory: give the KV pool (vLLM --kv-cache-memory-bytes) as kv_cache_gib")
    else:
        kv_gib = usable - weights - reserve_gib
    block = BLOCK_TOKENS[chip]
    kv_tokens = max(0, int(kv_gib * GIB // (kv_per_token * block)) * block) if kv_per_token else 0
    verdict = "no" if kv_gib <= 0 or kv_tokens < max_model_len else "tight" if kv_gib < TIGHT_GIB else "fits"
    kv_measured = (measured or {}).get("kv_capacity") or {}
    memory = (measured or {}).get("memory_statistics") or {}
    return SurveyRow(
        model=model, license=meta.get("license", "unknown"), architecture=(config.get("architectures") or ["?"])[0], chip=chip,
        weights_gib=weights, kv_bytes_per_token=kv_per_token, usable_gib=usable,
        reserve_gib=reserve_gib, kv_gib=max(kv_gib, 0.0), kv_tokens=kv_tokens, max_concurrency=kv_tokens / max_model_len, verdict=verdict,
        measured_kv_tokens=kv_measured.get("kv_cache_tokens") if measured else (meta.get("measured_kv_tokens") or {}).get(chip),
        measured_usable_gib=memory.get("total_hbm_limit_cap_gib"), measured_in_use_gib=memory.get("total_hbm_used_gib"),
        kv_pool_fixed=kv_cache_gib is not None,
    )  # fmt: skip


def load_metadata(path: Path) -> dict[str, dict]:
    """Saved metadata: one JSON file {model_id: {license, config, safetensors_total?, measured_kv_tokens?}}."""
    return {key: value for key, value in json.loads(path.read_text()).items() if not key.startswith("_")}


def fetch_metadata(model: str) -> dict:
    """Metadata from the Hugging Face Hub (network): licence, parameter total, config.json."""
    from huggingface_hub import HfApi, hf_hub_download

    info = HfApi().model_info(model)
    config = json.loads(Path(hf_hub_download(model, "config.json")).read_text())
    safetensors = getattr(info, "safetensors", None)
    return {
        "license": (info.card_data or {}).get("license", "unknown") if info.card_data else "unknown",
        "config": config,
        "safetensors_total": getattr(safetensors, "total", None),
    }


def survey_table(rows: list[SurveyRow]) -> str:
    lines = [
        "| model | licence | chip | weights GiB | KV bytes/token | KV GiB (usable − weights − reserve) | KV tokens | max concurrency | measured KV tokens | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        measured = f"{r.measured_kv_tokens:,} ({(r.kv_tokens - r.measured_kv_tokens) / r.measured_kv_tokens:+.1%})" if r.measured_kv_tokens else "—"
        pool = "fixed pool" if r.kv_pool_fixed else f"{r.usable_gib:.2f} − {r.weights_gib:.2f} − {r.reserve_gib:.2f}"
        lines.append(
            f"| {r.model} | {r.license} | {r.chip} | {r.weights_gib:.2f} | {r.kv_bytes_per_token:,.0f} | "
            f"{r.kv_gib:.2f} ({pool}) | {r.kv_tokens:,} | {r.max_concurrency:.1f}x | {measured} | {r.verdict} |"
        )
    return "\n".join(lines) + "\n"


def measured_table(rows: list[SurveyRow]) -> str:
    """Predicted beside measured, for the rows that have a measurement."""
    lines = [
        "| model | chip | KV tokens predicted | measured | Δ | usable GiB predicted | measured cap | weights + reserve GiB | measured in use before KV |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    shown = [r for r in rows if r.measured_kv_tokens or r.measured_usable_gib is not None]
    for r in shown:
        tokens = f"{r.measured_kv_tokens:,} | {(r.kv_tokens - r.measured_kv_tokens) / r.measured_kv_tokens:+.1%}" if r.measured_kv_tokens else "— | —"
        cap, in_use = _gib(r.measured_usable_gib), _gib(r.measured_in_use_gib)
        lines.append(
            f"| {r.model} | {r.chip} | {r.kv_tokens:,} | {tokens} | {_gib(r.usable_gib)} | {cap} | {r.weights_gib + r.reserve_gib:.2f} | {in_use} |"
        )
    return "\n".join(lines) + "\n" if shown else ""


def _gib(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"
