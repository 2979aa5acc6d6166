"""Run tpu-inference's real JAX quantization layers from an unpacked wheel on JAX's CPU backend; print JSON.

Run in a fresh interpreter: ``python quant_harness.py --tree DIR [--patches a,b] CASE``.

What is real: jax and flax (CPU), ``compressed-tensors`` (its ``QuantizationArgs`` and ``pack_to_int32``, used to
write the checkpoint tensors), torch, and every ``tpu_inference`` module these layers import, loaded from the
wheel as shipped: ``layers/jax/{linear,embed,base}.py``, ``layers/jax/quantization/{compressed_tensors,fp8,
wna16,unquantized,configs}.py``, ``layers/common/{linear,utils,sharding}.py``, ``layers/common/quantization``,
``kernels/quantized_matmul/util.py``, ``models/jax/utils/weight_utils.py`` (its loaders) and the rest of their
imports. The package's own ``tpu_inference/__init__.py`` is not run (it loads the TPU runtime and vLLM's
environment overrides); its submodules are.

Stand-ins, for what cannot load here:

- ``vllm``: not in the test environment (it brings a torch of its own). Every name is an inert placeholder
  except what these layers call: ``CompressedTensorsConfig.from_config`` (builds the same ``target_scheme_map``
  as vLLM 0.32.0's ``_quantization_scheme_map_from_config``, from compressed-tensors' own ``QuantizationArgs``)
  and its ``_is_fp8_w8a8`` test, ``should_ignore_layer`` and ``is_equal_or_regex_match`` (exact name or ``re:``
  pattern, as vLLM's), ``get_current_vllm_config`` (what tpu-inference's runner sets while it builds the
  model: here a namespace holding the case's config) and ``init_logger`` (a ``logging`` logger).
- ``torchax``: 0.0.13, the version tpu-inference 0.32.0 pins, fails to import on the torch installed here
  (``aten.prod.dim_Dimname`` is gone). Only its ``t2j`` is called, by upstream's loaders: torch → numpy → jax.
- ``tokamax``: its ``gmm_v2`` is a Pallas TPU kernel, taken only for 3-D scales (``wna16`` groups narrower than
  the MXU); the W8A8 method's 1-D scale takes upstream's XLA path.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import json
import logging
import re
import sys
import types
from importlib.metadata import entry_points
from pathlib import Path

from stand_ins import StandIns  # beside this script, which runs with its own folder on sys.path

STUBBED_ROOTS = ("vllm", "torchax", "tokamax", "qwix", "pathwaysutils", "tpu_info")
ENTRY_POINT = "opendecide_tpu_patches"


def _is_equal_or_regex_match(value: str, target: str, check_contains: bool = False) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], value) is not None
    return target in value if check_contains else value == target


def _should_ignore_layer(layer_name, ignore=(), fused_mapping=None, use_fnmatch=False) -> bool:
    return layer_name is not None and any(_is_equal_or_regex_match(layer_name, t) for t in ignore)


class _CompressedTensorsConfig:
    """vLLM's config-group parsing, reduced to what tpu-inference's JAX config reads from it."""

    def __init__(self, target_scheme_map, ignore, quant_format):
        self.target_scheme_map = target_scheme_map
        self.ignore = ignore
        self.quant_format = quant_format

    @classmethod
    def from_config(cls, config: dict):
        from compressed_tensors.quantization import QuantizationArgs

        schemes = {}
        for group in config.get("config_groups", {}).values():
            for target in group["targets"]:
                activations = group.get("input_activations")
                schemes[target] = {
                    "weights": QuantizationArgs.model_validate(group["weights"]),
                    "input_activations": QuantizationArgs.model_validate(activations)
                    if activations
                    else None,
                    "format": group.get("format"),
                }
        return cls(schemes, config.get("ignore", []), config.get("format"))

    @staticmethod
    def _is_fp8_w8a8(weights, activations) -> bool:
        # vLLM's test: float weights and activations, weights symmetric and static by tensor, channel or block.
        if weights is None or activations is None:
            return False
        return (
            weights.type == "float"
            and activations.type == "float"
            and weights.symmetric
            and not weights.dynamic
            and weights.strategy in ("tensor", "channel", "block")
        )


def _t2j(tensor, use_dlpack=False):
    import jax.numpy as jnp

    return jnp.asarray(tensor.detach().cpu().numpy())


# What tpu-inference's runner sets around model construction (set_current_vllm_config); a case fills it in.
CURRENT_VLLM_CONFIG = types.SimpleNamespace(quant_config=None)

_OVERRIDES = {
    "vllm.config.get_current_vllm_config": lambda: CURRENT_VLLM_CONFIG,
    "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors.CompressedTensorsConfig": (
        _CompressedTensorsConfig
    ),
    "vllm.model_executor.layers.quantization.compressed_tensors.utils.should_ignore_layer": _should_ignore_layer,
    "vllm.model_executor.layers.quantization.utils.config_utils.is_equal_or_regex_match": (
        _is_equal_or_regex_match
    ),
    "vllm.logger.init_logger": logging.getLogger,
    "torchax.ops.mappings.t2j": _t2j,
}
STAND_INS = StandIns(_OVERRIDES)


class _EmptyPackage(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        pass


class WheelTreeFinder(importlib.abc.MetaPathFinder):
    """``tpu_inference`` from the unpacked wheel, its top ``__init__`` not run; stand-ins for ``STUBBED_ROOTS``."""

    def __init__(self, tree: Path) -> None:
        self.tree = tree

    def find_spec(self, fullname, path, target=None):
        if fullname == "tpu_inference":
            spec = importlib.machinery.ModuleSpec(fullname, _EmptyPackage(), is_package=True)
            spec.submodule_search_locations = [str(self.tree / "tpu_inference")]
            return spec
        if fullname.split(".")[0] in STUBBED_ROOTS:
            return STAND_INS.spec(fullname)
        return None


# ---- the checkpoint: compressed-tensors configs and tensors, written with the library's own packer ----

W8A8 = {
    "format": "int-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {
                "num_bits": 8,
                "type": "int",
                "symmetric": True,
                "strategy": "channel",
                "dynamic": False,
            },
            "input_activations": {
                "num_bits": 8,
                "type": "int",
                "symmetric": True,
                "strategy": "token",
                "dynamic": True,
            },
        }
    },
    "ignore": ["lm_head"],
}
W4A16_GROUP = 32


def emb4_config(targets: list[str]) -> dict:
    """A W4A16 group for the embedding table (the linear layers' own groups are left out: not under test)."""
    return {
        "format": "pack-quantized",
        "config_groups": {
            "group_0": {
                "targets": targets,
                "weights": {
                    "num_bits": 4,
                    "type": "int",
                    "symmetric": True,
                    "strategy": "group",
                    "group_size": W4A16_GROUP,
                    "dynamic": False,
                },
                "format": "pack-quantized",
            }
        },
        "ignore": [],
    }


def int4_table(vocab: int, features: int, seed: int):
    """A QAT-like table: int4 grid positions and one bf16 step per group of 32, as torch tensors."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-8, 8, (vocab, features), generator=gen, dtype=torch.int8)
    scale = (torch.rand(vocab, features // W4A16_GROUP, generator=gen) * 0.05 + 0.001).to(torch.bfloat16)
    return q, scale


def int8_weight(out: int, inp: int, seed: int):
    import torch

    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (out, inp), generator=gen, dtype=torch.int8)
    scale = (torch.rand(out, 1, generator=gen) * 0.01 + 0.001).to(torch.float32)
    return q, scale


def load(param, tensor, *shard) -> None:
    """Load one checkpoint tensor the way tpu-inference's weight loader does: through the param's ``weight_loader``."""
    param.get_metadata()["weight_loader"](param, tensor, *shard)


# ---- cases ----


def _mesh():
    import jax

    # A one-device mesh with the axis names tpu-inference shards by (its default 2-D names, data and model).
    auto = (
        jax.sharding.AxisType.Auto,
    ) * 2  # as tpu-inference's runner makes its mesh: sharding by constraint
    return jax.make_mesh((1, 1), ("data", "model"), axis_types=auto, devices=jax.devices()[:1])


def case_w8a8(out: dict) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    ct = importlib.import_module("tpu_inference.layers.jax.quantization.compressed_tensors")
    linear = importlib.import_module("tpu_inference.layers.jax.linear")
    config = ct.CompressedTensorsConfig(W8A8)
    inp, sizes = 64, [48, 80]
    with jax.set_mesh(_mesh()):
        try:
            layer = linear.JaxLinear(
                inp, 96, nnx.Rngs(0), use_bias=False, quant_config=config, prefix="mlp.down_proj"
            )
        except NotImplementedError as e:
            out["error"] = {"type": type(e).__name__, "message": str(e)}
            return
        merged = linear.JaxMergedColumnParallelLinear(
            inp, sizes, nnx.Rngs(0), use_bias=False, quant_config=config, prefix="mlp.gate_up_proj"
        )
        # An attention-style projection: one input axis, two output axes (heads, head width).
        heads = linear.JaxEinsum(
            "TD,DNH->TNH", (inp, 4, 16), nnx.Rngs(0), quant_config=config, prefix="self_attn.q_proj"
        )
        out["method"] = type(layer.quant_method).__name__
        out["merged_method"] = type(merged.quant_method).__name__
        out["weight_dtype"] = str(layer.weight.get_value().dtype)
        q, s = int8_weight(96, inp, seed=1)
        load(layer.weight, q)
        load(layer.weight_scale, s)
        shards = [int8_weight(n, inp, seed=10 + i) for i, n in enumerate(sizes)]
        for i, (qi, si) in enumerate(shards):
            load(merged.weight, qi, i)
            load(merged.weight_scale, si, i)
        qh, sh = int8_weight(64, inp, seed=20)
        load(heads.weight, qh)
        load(heads.weight_scale, sh)
        x = jax.random.normal(jax.random.key(3), (5, inp), jnp.float32) * 2.0
        got = np.asarray(layer(x), np.float64)
        got_merged = np.asarray(merged(x), np.float64)
        got_heads = np.asarray(heads(x), np.float64)

    xs = np.asarray(x, np.float64)
    # Reference: the activation quantized per token to int8 (step = max |x| / 127, round half to even) and the
    # weight dequantized, multiplied in float64.
    step = np.abs(xs).max(axis=1, keepdims=True) / 127.0
    x_deq = np.round(xs / step) * step

    def reference(qt, st):
        return x_deq @ (qt.numpy().astype(np.float64) * st.double().numpy()).T

    want = reference(q, s)
    want_merged = np.concatenate([reference(qi, si) for qi, si in shards], axis=1)
    unquantized = xs @ (q.numpy().astype(np.float64) * s.double().numpy()).T
    out["max_rel_error"] = float(np.abs(got - want).max() / np.abs(want).max())
    out["merged_max_rel_error"] = float(np.abs(got_merged - want_merged).max() / np.abs(want_merged).max())
    out["activation_rounding_rel"] = float(np.abs(unquantized - want).max() / np.abs(want).max())
    want_heads = reference(qh, sh).reshape(5, 4, 16)
    out["heads_max_rel_error"] = float(np.abs(got_heads - want_heads).max() / np.abs(want_heads).max())
    out["shapes"] = [list(got.shape), list(got_merged.shape), list(got_heads.shape)]


def case_embedding(out: dict) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from flax import nnx

    ct = importlib.import_module("tpu_inference.layers.jax.quantization.compressed_tensors")
    embed = importlib.import_module("tpu_inference.layers.jax.embed")
    vocab, features = 1000, 96
    config = ct.CompressedTensorsConfig(emb4_config(["re:.*embed_tokens$"]))
    q, s = int4_table(vocab, features, seed=7)
    # The bf16 table a dense build of the same checkpoint holds: each value times its group's step, rounded once.
    steps = s.float().repeat_interleave(W4A16_GROUP, dim=1)
    dequantized = (q.float() * steps).to(torch.bfloat16)
    init = nnx.with_partitioning(nnx.initializers.normal(), ("model", None))
    with jax.set_mesh(_mesh()):
        packed = embed.JaxEmbed(
            num_embeddings=vocab,
            features=features,
            param_dtype=jnp.bfloat16,
            embedding_init=init,
            rngs=nnx.Rngs(0),
            quant_config=config,
            prefix="model.embed_tokens",
        )
        out["method"] = type(packed.quant_method).__name__ if packed.quant_method else None
        dense = embed.JaxEmbed(
            num_embeddings=vocab,
            features=features,
            param_dtype=jnp.bfloat16,
            embedding_init=init,
            rngs=nnx.Rngs(0),
        )
        dense.weight.set_value(jnp.asarray(dequantized.float().numpy(), jnp.bfloat16))
        ids = jnp.array([[0, 5, 999, 5], [17, 3, 0, 512]], jnp.int32)
        hidden = jax.random.normal(jax.random.key(4), (6, features), jnp.bfloat16)
        want_rows = np.asarray(dense(ids).astype(jnp.float32))
        want_logits = np.asarray(dense.decode(hidden).astype(jnp.float32))
        if packed.quant_method is None:
            out["params"] = {name: list(p.get_value().shape) for name, p in packed.named_parameters()}
            return
        load(packed.weight_packed, pack_to_int32(q, 4))
        load(packed.weight_scale, s)
        load(packed.weight_shape, torch.tensor([vocab, features], dtype=torch.int32))
        out["loaded"] = packed.quant_method.process_weights_after_loading(packed)
        params = {name: p.get_value() for name, p in packed.named_parameters()}
        out["params"] = {name: [list(v.shape), str(v.dtype)] for name, v in params.items()}
        out["table_bytes"] = int(params["weight_packed"].nbytes)
        out["scale_bytes"] = int(params["weight_scale"].nbytes)
        out["values"] = vocab * features
        got_rows = np.asarray(packed(ids).astype(jnp.float32))
        out["rows_dtype"] = str(packed(ids).dtype)
        out["rows_equal"] = bool(np.array_equal(got_rows, want_rows))
        out["rows_shape"] = list(got_rows.shape)
        # Only the rows read are unpacked: no value in the lookup's program is shaped like the whole table.
        # The dense layer's program, which reads its table, shows what such a value looks like.
        table_shape = f"[{vocab},{features}]"
        out["lookup_holds_table"] = table_shape in str(jax.make_jaxpr(packed)(ids))
        out["dense_lookup_holds_table"] = table_shape in str(jax.make_jaxpr(dense)(ids))
        try:
            got_logits = np.asarray(packed.decode(hidden).astype(jnp.float32))
        except Exception as e:
            out["decode_error"] = {"type": type(e).__name__, "message": str(e)}
            return
        out["logits_max_abs_error"] = float(np.abs(got_logits - want_logits).max())
        out["logits_scale"] = float(np.abs(want_logits).max())
        from opendecide_tpu_patches import int4_lm_head

        blocked = int4_lm_head.packed_logits(
            hidden, params["weight_packed"], params["weight_scale"], features, jnp.bfloat16, block_rows=128
        )
        out["blocked_logits_max_abs_error"] = float(
            np.abs(np.asarray(blocked.astype(jnp.float32)) - want_logits).max()
        )


def case_untied_head(out: dict) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from flax import nnx

    ct = importlib.import_module("tpu_inference.layers.jax.quantization.compressed_tensors")
    linear = importlib.import_module("tpu_inference.layers.jax.linear")
    vocab, hidden = 1000, 96
    q, s = int4_table(vocab, hidden, seed=9)  # lm_head.weight is [vocab, hidden], packed like a table
    steps = s.float().repeat_interleave(W4A16_GROUP, dim=1)
    dequantized = (q.float() * steps).to(torch.bfloat16)
    init = nnx.with_partitioning(nnx.initializers.normal(), (None, "model"))
    with jax.set_mesh(_mesh()):
        dense = linear.JaxLmHead(hidden, vocab, nnx.Rngs(0), dtype=jnp.bfloat16, kernel_init=init)
        dense.weight.set_value(jnp.asarray(dequantized.float().numpy().T, jnp.bfloat16))
        CURRENT_VLLM_CONFIG.quant_config = ct.CompressedTensorsConfig(emb4_config(["lm_head"]))
        packed = linear.JaxLmHead(hidden, vocab, nnx.Rngs(0), dtype=jnp.bfloat16, kernel_init=init)
        out["method"] = type(packed.quant_method).__name__ if packed.quant_method else None
        out["params"] = {name: list(p.get_value().shape) for name, p in packed.named_parameters()}
        if packed.quant_method is None:
            return
        load(packed.weight_packed, pack_to_int32(q, 4))
        load(packed.weight_scale, s)
        load(packed.weight_shape, torch.tensor([vocab, hidden], dtype=torch.int32))
        out["loaded"] = packed.quant_method.process_weights_after_loading(packed)
        out["sharding"] = list(packed.weight_packed.get_metadata()["out_sharding"])
        x = jax.random.normal(jax.random.key(5), (6, hidden), jnp.bfloat16)
        want = np.asarray(dense(x).astype(jnp.float32))
        got = np.asarray(packed(x).astype(jnp.float32))
    out["logits_max_abs_error"] = float(np.abs(got - want).max())
    out["logits_scale"] = float(np.abs(want).max())


CASES = {"w8a8": case_w8a8, "embedding": case_embedding, "untied_head": case_untied_head}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", type=Path, required=True, help="unpacked tpu-inference wheel")
    parser.add_argument("--plugin", action="store_true", help="call the plugin's entry point, as vLLM does")
    parser.add_argument("--patches", default="", help="apply only these patch modules (comma-separated)")
    parser.add_argument("case", choices=sorted(CASES))
    args = parser.parse_args()

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    logging.getLogger("vllm").addHandler(handler)
    logging.getLogger("vllm").setLevel(logging.DEBUG)

    sys.meta_path.insert(0, WheelTreeFinder(args.tree))
    if args.plugin:
        (ep,) = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == ENTRY_POINT]
        ep.load()()
    for name in filter(None, args.patches.split(",")):
        from opendecide_tpu_patches._patching import when_imported

        patch = importlib.import_module(f"opendecide_tpu_patches.{name}")
        when_imported(patch.MODULE, patch.apply)

    out: dict = {"error": None}
    CASES[args.case](out)
    out["log"] = [
        (r.name, r.levelname, r.getMessage())
        for r in records
        if r.name.startswith("vllm.opendecide_tpu_patches")
    ]
    print(json.dumps(out, default=repr))


if __name__ == "__main__":
    main()
