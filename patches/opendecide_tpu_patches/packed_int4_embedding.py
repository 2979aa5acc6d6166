# Keeps a compressed-tensors int4 embedding table packed on chip in tpu-inference's JAX path ("emb4" builds).
# `CompressedTensorsConfig.get_quant_method` returns None for every layer that is not a JaxEinsum or MoE, so an
# embedding listed in a W4A16 config group is built as a full-precision JaxEmbed and its checkpoint tensors
# (`weight_packed`, `weight_scale`, `weight_shape`) have no parameter to load into. JaxEmbed itself already asks
# the config for a method and calls its `create_weights_jax` and `apply_jax`; only the config never answers.
# The config came with vllm-project/tpu-inference#3072 (commit f4ac9c2b, 2026-07-04); the W4A16 linear method it
# dispatches to (layers/jax/quantization/wna16.py) is in 0.32.0 but not yet on main at b8692ff0 (2026-08-22);
# neither has an embedding method:
# https://github.com/vllm-project/tpu-inference/blob/b8692ff01fa191343836996c27a39dc95f008b88/tpu_inference/layers/jax/quantization/compressed_tensors.py
# Delete this module once the pinned tpu-inference's JAX get_quant_method answers for JaxEmbed: the plugin then
# logs "already fixed upstream".
"""Give ``JaxEmbed`` layers in a W4A16 config group a method that stores the table packed and unpacks rows read.

The table stays in compressed-tensors' ``pack-quantized`` layout: ``weight_packed`` int32 ``[vocab, ceil(d / 8)]``
(eight int4 values a word, lowest nibble first, each biased by +8) and ``weight_scale`` ``[vocab, d / group]``,
both loaded as the checkpoint has them, so the chip holds half a byte per value plus the scales. A lookup
gathers the packed rows of the token ids, then unpacks and scales only those rows (upstream's own
``u32_unpack_i4``). Which embeddings are packed is the checkpoint's choice: a config group whose targets name the
layer (e.g. ``re:.*embed_tokens$``), with symmetric static int4 weights by group or channel and no activation
quantization, the scheme upstream's W4A16 linear method takes. Any other scheme on an
embedding is refused at load, naming the layer, instead of leaving packed tensors unread.

A table shared with the output head (tied embeddings) is read there by ``int4_lm_head``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from types import ModuleType

from ._patching import Outcome, Result, replace_method, upstream_method

MODULE = "tpu_inference.layers.jax.quantization.compressed_tensors"
CLASS = "CompressedTensorsConfig"
EMBED_MODULE = "tpu_inference.layers.jax.embed"
_MARK = "_opendecide_packed_int4_embedding"
_NEEDS = ("QuantizeMethodBase", "_is_w4a16", "should_ignore_layer")
_PACK_FACTOR = 8  # int4 values per int32 word
# The three tensors compressed-tensors writes for a pack-quantized 2-D weight.
CHECKPOINT_PARAMS = ("weight_packed", "weight_scale", "weight_shape")


def dequantize_rows(packed_rows, scale_rows, features: int, dtype):
    """Rows of a pack-quantized table as values: ``[..., ceil(d / 8)]`` words, ``[..., d / group]`` scales → ``[..., d]``.

    The product is taken in float32, where it is exact (an int4 times a bf16 or f32 scale), and rounded once to
    ``dtype``: the value a bf16 table dequantized ahead of time would hold.
    """
    import jax.numpy as jnp
    from tpu_inference.layers.common.quantization import u32_unpack_i4

    values = u32_unpack_i4(packed_rows)[..., :features].astype(jnp.float32)
    groups = scale_rows.shape[-1]
    grouped = values.reshape(*values.shape[:-1], groups, features // groups)
    scaled = grouped * scale_rows.astype(jnp.float32)[..., None]
    return scaled.reshape(values.shape).astype(dtype)


def packed_weights(module: ModuleType, config, layer, prefix: str, kind: str):
    """The W4A16 ``QuantizationArgs`` of the config group naming ``prefix``, or None when it is left dense.

    ``module`` is upstream's loaded compressed_tensors, ``config`` its ``CompressedTensorsConfig``. Matched by
    name only (upstream matches class names for JaxEinsum and MoE layers alone): a class target such as
    "Embedding" would also take Gemma's per-layer embedding table, whose model code reads its dense weight.
    A named table with another scheme is refused, naming it: its tensors would have nowhere to load.
    """
    if module.should_ignore_layer(prefix, ignore=config._ignore, fused_mapping=config._fused_mapping):
        return None
    scheme = config._match_target(layer, prefix)
    if scheme is None:
        return None
    weights, activations = scheme.get("weights"), scheme.get("input_activations")
    fmt = scheme.get("format") or getattr(config._ct, "quant_format", None)
    if not module._is_w4a16(weights, activations) or fmt not in (None, "pack-quantized"):
        raise NotImplementedError(
            f"compressed-tensors scheme for {kind} '{prefix}' is not supported in the JAX path; "
            "only symmetric int4 weights (pack-quantized, no activation quantization) are"
        )
    return weights


@functools.cache
def method_class(module: ModuleType) -> type:
    """The packed embedding method, a ``QuantizeMethodBase`` of the loaded upstream package; one class per module."""
    import jax.numpy as jnp
    from flax import nnx
    from tpu_inference.models.jax.utils.weight_utils import load_nnx_param_from_reshaped_torch

    class PackedInt4EmbeddingMethod(module.QuantizeMethodBase):
        """An int4 table kept packed; a lookup unpacks only the rows of the ids it reads."""

        packed_int4_table = True  # what int4_lm_head looks for on a tied output head

        def __init__(self, layer, prefix: str, group_size: int | None):
            self.prefix = prefix  # JaxEmbed keeps no prefix of its own; the tensors are named with it
            self.vocab, self.features, self.sharding = self.dense_table(layer)
            # Channelwise checkpoints carry group_size None or -1: one group spanning the row.
            self.group_size = self.features if not group_size or group_size <= 0 else group_size
            if self.features % self.group_size:
                raise ValueError(
                    f"{self.prefix}: table width {self.features} is not a multiple of "
                    f"group_size {self.group_size}"
                )

        @staticmethod
        def dense_table(layer) -> tuple[int, int, tuple]:
            """Vocabulary, width and sharding of the full-precision ``[vocab, d]`` table the layer made."""
            vocab, features = layer.weight.get_value().shape
            return vocab, features, layer.weight.get_metadata().get("out_sharding", ())

        def create_weights_jax(self, layer, *weight_args, **extra_weight_attrs):
            # The layer made a full-precision table; the checkpoint ships the packed tensors instead. They keep
            # the table's sharding by vocabulary row.
            self.dtype = layer.weight.get_value().dtype
            delattr(layer, "weight")
            shapes = {
                "weight_packed": ((self.vocab, -(-self.features // _PACK_FACTOR)), jnp.int32),
                "weight_scale": ((self.vocab, self.features // self.group_size), self.dtype),
            }
            for name, (shape, dtype) in shapes.items():
                loader = functools.partial(
                    load_nnx_param_from_reshaped_torch,
                    permute_dims=(0, 1),  # checkpoint layout [vocab, …], as stored
                    param_name=f"{self.prefix}.{name}",
                )
                param = nnx.Param(
                    jnp.zeros(shape, dtype),
                    out_sharding=self.sharding,
                    weight_loader=loader,
                    eager_sharding=False,
                )
                setattr(layer, name, param)
            layer.weight_shape = nnx.Param(
                jnp.zeros((2,), jnp.int32), weight_loader=self._check_weight_shape, eager_sharding=False
            )

        def _check_weight_shape(self, param, torch_tensor, shard_id: int = -1):
            shape = tuple(int(v) for v in torch_tensor.tolist())
            if shape != (self.vocab, self.features):
                raise ValueError(
                    f"{self.prefix}.weight_shape is {list(shape)}, expected {[self.vocab, self.features]}"
                )
            param.set_metadata("_is_loaded", True)

        def process_weights_after_loading(self, layer) -> bool:
            # Nothing to convert: the packed words are what the chip keeps.
            return all(getattr(layer, name).get_metadata("_is_loaded", False) for name in CHECKPOINT_PARAMS)

        def apply_jax(self, layer, ids):
            rows = jnp.take(layer.weight_packed[...], ids, axis=0)
            scales = jnp.take(layer.weight_scale[...], ids, axis=0)
            return dequantize_rows(rows, scales, self.features, self.dtype)

    return PackedInt4EmbeddingMethod


def apply(module: ModuleType) -> Result:
    """Wrap ``CompressedTensorsConfig.get_quant_method`` in ``module`` to answer for W4A16 embeddings, if it needs it."""
    if any(not hasattr(module, name) for name in _NEEDS):
        return Result(Outcome.UNRECOGNISED, f"{module.__name__} lacks one of {_NEEDS}")
    cls = getattr(module, CLASS, None)
    found = upstream_method(cls, "get_quant_method", _MARK)
    if isinstance(found, Result):
        return found
    original, source = found
    if "Embed" in source:
        return Result(
            Outcome.ALREADY_FIXED, f"{CLASS}.get_quant_method answers for embeddings; delete {__name__}"
        )
    embed_module = importlib.import_module(EMBED_MODULE)
    jax_embed = getattr(embed_module, "JaxEmbed", None)
    if jax_embed is None:
        return Result(Outcome.UNRECOGNISED, f"{EMBED_MODULE} has no JaxEmbed")
    packed = method_class(module)

    def get_quant_method(self, layer, prefix):
        method = original(self, layer, prefix)
        if method is not None or not isinstance(layer, jax_embed):
            return method
        weights = packed_weights(module, self, layer, prefix, "embedding")
        return None if weights is None else packed(layer, prefix, weights.group_size)

    replace_method(cls, "get_quant_method", get_quant_method, original, _MARK)
    source_file = inspect.getsourcefile(inspect.unwrap(original))
    return Result(
        Outcome.PATCHED,
        f"{CLASS}.get_quant_method keeps W4A16 embeddings packed, unpacking the rows read ({source_file})",
    )
