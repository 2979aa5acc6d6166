"""The QAT source checkpoint a repack reads (deploy/repack.py): the folder's checks, and the rule per
architecture that says which of its tensors are quantized.

Which tensors are quantized is a rule per architecture (``RULES``), not a guess from shapes: the
decoder layers' attention and MLP projections, and a mixture-of-experts layer's expert banks. Norms,
biases, the MoE router, the vision/audio towers and their projectors stay in the source dtype; the
token embedding only with ``--emb4``; an untied ``lm_head`` only with ``--lm-head``.

Expert banks (Gemma 4 26B): the checkpoint stores each MoE layer's experts as two 3-D parameters
without ``.weight``, ``experts.gate_up_proj`` ``[E, 2I, H]`` (per expert the first ``I`` rows are the
gate, the rest the up projection) and ``experts.down_proj`` ``[E, H, I]``. vLLM's fused-MoE loader
takes per-expert 2-D matrices named ``experts.{e}.gate_proj`` / ``up_proj`` / ``down_proj`` (the
layout the reference study served), so ``expert_matrices`` splits each bank one expert at a time;
groups of 32 still run along the input dimension, which the split does not touch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from opendecide.extras import needs_extra

with needs_extra("local", "repacking a model"):
    import torch

# The source folder's model manifest (written by the embedded model's preparation), when it has one
SOURCE_MANIFEST = "opendecide-model.json"


class RepackError(ValueError):
    """A source the repack refuses; the message names the file (and tensor, group) at fault."""


@dataclass(frozen=True)
class Rule:
    """Which tensors of an architecture are quantized. A tensor is a *linear* weight when it is a 2-D
    ``<module>.weight`` whose module's last name is in ``linear`` and no part of its path is in
    ``kept``; the token embedding is ``<...>.embed_tokens.weight`` outside ``kept``."""

    linear: tuple[str, ...]
    kept: tuple[str, ...]
    why: str
    embedding: str = "embed_tokens"
    # Fused 3-D expert banks ``<...>.experts.<bank>`` ([experts, out, in]): each bank's name → the
    # per-expert projections its rows split into, in row order (equal parts).
    experts: tuple[tuple[str, tuple[str, ...]], ...] = ()


_DECODER = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
RULES = {
    "llama": Rule(_DECODER, (), "decoder projections; norms, embedding and lm_head stay"),
    # Gemma 3: the multimodal build (Gemma3ForConditionalGeneration) has a SigLIP vision tower whose
    # attention is also named q/k/v/out_proj: kept by path, as is the projector into the text model.
    "gemma3": Rule(
        _DECODER,
        ("vision_tower", "multi_modal_projector"),
        "text decoder projections; vision tower, projector, norms, embedding and lm_head stay",
    ),
    # Gemma 4: vision and audio towers and their embedders stay; an MoE layer's router stays (its
    # logits choose experts: an error there changes which weights run, not how precisely).
    # The 26B's expert banks (transformers' Gemma4TextExperts: gate, up = linear(x,
    # gate_up_proj[e]).chunk(2)) split into the per-expert names vLLM's fused-MoE loader maps.
    "gemma4": Rule(
        _DECODER,
        ("vision_tower", "audio_tower", "embed_vision", "embed_audio", "multi_modal_projector", "router"),
        "text decoder projections and expert banks (split per expert); router, vision/audio towers, "
        "norms, embedding and lm_head stay",
        experts=(("gate_up_proj", ("gate_proj", "up_proj")), ("down_proj", ("down_proj",))),
    ),
}
# Gemma 4 12B (``gemma4_unified``): the same decoder; its vision input is ``vision_embedder`` and
# ``embed_vision``, its audio ``embed_audio`` (no SigLIP tower), all kept.
RULES["gemma4_unified"] = Rule(
    _DECODER,
    (*RULES["gemma4"].kept, "vision_embedder"),
    "text decoder projections; vision embedder, audio/vision projections, norms, embedding and lm_head stay",
)
RULES["gemma3_text"] = RULES["gemma3"]
RULES["gemma4_text"] = RULES["gemma4"]


@dataclass(frozen=True)
class Source:
    """A source folder ``read_source`` accepted: its config, rule, shards and floating-point dtype."""

    folder: Path
    config: dict
    rule: Rule
    shards: tuple[Path, ...]
    dtype: torch.dtype


def read_source(folder: Path) -> Source:
    """Check the source folder, refusing (naming the file) what the repack cannot take."""
    folder = Path(folder)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise RepackError(f"{config_path}: missing (not a Hugging Face model folder)")
    config = json.loads(config_path.read_text())
    architectures = config.get("architectures") or []
    if not any(a.endswith(("ForCausalLM", "ForConditionalGeneration")) for a in architectures):
        raise RepackError(f"{config_path}: architectures {architectures} is not a causal language model")
    if "quantization_config" in config or "compression_config" in config:
        method = (config.get("quantization_config") or {}).get("quant_method", "compressed")
        raise RepackError(f"{config_path}: already quantized ({method})")
    model_type = config.get("model_type", "")
    if model_type not in RULES:
        raise RepackError(
            f"{config_path}: model_type {model_type!r} has no tensor rule (known: {', '.join(sorted(RULES))})"
        )
    shards = tuple(sorted(folder.glob("*.safetensors")))
    if not shards:
        raise RepackError(f"{folder}: no *.safetensors files")
    from safetensors import safe_open

    dtype = None
    for shard in shards:
        with safe_open(shard, framework="pt") as reader:
            for name in reader.keys():
                tensor_dtype = reader.get_slice(name).get_dtype()
                if tensor_dtype in ("I8", "I32", "U8", "I4", "F8_E4M3", "F8_E5M2") or name.endswith(
                    ("weight_packed", "weight_scale", "qweight")
                ):
                    raise RepackError(f"{shard}: {name} is already quantized ({tensor_dtype})")
                if tensor_dtype not in ("BF16", "F16", "F32"):
                    continue
                if dtype is None:
                    dtype = (tensor_dtype, f"{shard}: {name}")
                elif tensor_dtype != dtype[0]:
                    raise RepackError(
                        f"mixed dtypes: {dtype[1]} is {dtype[0]}, {shard}: {name} is {tensor_dtype}"
                    )
    if dtype is None:
        raise RepackError(f"{folder}: no floating-point tensors")
    torch_dtype = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}[dtype[0]]
    return Source(folder, config, RULES[model_type], shards, torch_dtype)


def role(name: str, shape: tuple[int, ...], rule: Rule, *, emb4: bool, lm_head: bool) -> str:
    """``linear``, ``embedding`` (int4 groups), ``experts`` (a 3-D bank split per expert) or ``kept``
    for one tensor, by the architecture's rule."""
    parts = name.split(".")
    if any(part in rule.kept for part in parts):
        return "kept"
    if len(shape) == 3 and len(parts) > 1 and parts[-2] == "experts" and parts[-1] in dict(rule.experts):
        return "experts"
    if len(shape) != 2 or parts[-1] != "weight":
        return "kept"
    module = parts[-2]
    if module in rule.linear or (lm_head and module == "lm_head"):
        return "linear"
    if emb4 and module == rule.embedding:
        return "embedding"
    return "kept"


def expert_matrices(name: str, bank, rule: Rule) -> Iterator[tuple[str, str, torch.Tensor]]:
    """``(module, label, matrix)`` for each per-expert 2-D matrix of a 3-D expert bank, read one expert
    at a time from ``bank`` (a safetensors slice). ``module`` is the name vLLM's fused-MoE loader maps,
    ``<...>.experts.{e}.{projection}``; ``label`` names the bank, expert and projection for a refusal."""
    prefix, bank_name = name.rsplit(".", 1)
    projections = dict(rule.experts)[bank_name]
    shape = tuple(bank.get_shape())
    rows = shape[1] // len(projections)
    if rows * len(projections) != shape[1]:
        raise RepackError(f"{name}: {shape[1]} rows do not split into {', '.join(projections)}")
    for expert in range(shape[0]):
        matrix = bank[expert : expert + 1][0]
        for i, projection in enumerate(projections):
            part = matrix[i * rows : (i + 1) * rows].contiguous()
            yield f"{prefix}.{expert}.{projection}", f"{name}: expert {expert} ({projection})", part
