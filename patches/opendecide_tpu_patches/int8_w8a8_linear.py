# Adds int8 W8A8 (per-channel int8 weights, dynamic per-token int8 activations) to tpu-inference's JAX-native
# compressed-tensors config. Its `CompressedTensorsConfig.get_quant_method` serves fp8 W8A8 and int4 W4A16 only and
# raises NotImplementedError("compressed-tensors scheme for layer '…' is not yet supported in the JAX path.") for
# any int8 layer, so a W8A8 int8 build (e.g. Gemma repacked from its QAT checkpoint) does not load on the default
# JAX path. The config came with vllm-project/tpu-inference#3072 (commit f4ac9c2b, 2026-07-04); the int8 gap is in
# tpu-inference 0.32.0 (PyPI) and on main at b8692ff0 (2026-08-22):
# https://github.com/vllm-project/tpu-inference/blob/b8692ff01fa191343836996c27a39dc95f008b88/tpu_inference/layers/jax/quantization/compressed_tensors.py
# The torchax path (MODEL_IMPL_TYPE=vllm) has the scheme: layers/vllm/quantization/compressed_tensors/schemes/
# compressed_tensors_w8a8_int8.py. Delete this module once the pinned tpu-inference's JAX get_quant_method handles
# int8 itself: the plugin then logs "already fixed upstream".
"""Serve int8 W8A8 layers on tpu-inference's JAX path with its own fp8 W8A8 method, holding int8 weights.

Upstream's ``Fp8TensorwiseLinearMethod`` already is a W8A8 method with a per-output-channel scale: its matmul
(``sharded_quantized_matmul`` → ``xla_quantized_matmul``) quantizes the activation per token to the *weight's*
dtype, multiplies in that dtype and rescales by both scales. Only its weight parameter is fixed to fp8. The
methods added here are that class (and its merged-projection twin) with an int8 weight parameter, so the
checkpoint's ``weight`` (int8 ``[out, in]``) and ``weight_scale`` (``[out, 1]``) load through upstream's own loaders
and the matmul accumulates int8 × int8 in int32.

Upstream's dispatch runs unchanged; the patch acts only where it raises ``NotImplementedError`` for a
``JaxEinsum`` layer whose scheme is int8 weights per channel, symmetric, static, with int8 activations per
token, symmetric and dynamic (what ``compressed-tensors`` writes for W8A8 int8). Any other refusal stays a
refusal: per-tensor or asymmetric int8, a static input scale, int8 MoE experts.
"""

from __future__ import annotations

import inspect
from types import ModuleType

from ._patching import Outcome, Result, replace_method, upstream_method

MODULE = "tpu_inference.layers.jax.quantization.compressed_tensors"
CLASS = "CompressedTensorsConfig"
_MARK = "_opendecide_int8_w8a8_linear"
# Names the patch uses from the target module; without them the code is not the one this patch knows.
_NEEDS = (
    "Fp8TensorwiseLinearMethod",
    "Fp8TensorwiseMergedLinearMethod",
    "JaxEinsum",
    "JaxMergedColumnParallelLinear",
    "QuantLinearConfig",
)
# What an upstream get_quant_method that serves int8 would mention (vLLM's own scheme checks, or the dtype).
_UPSTREAM_INT8 = ("_is_dynamic_token_w8a8", "_is_static_tensor_w8a8", "int8")


def is_int8_w8a8(weights, activations) -> bool:
    """Whether compressed-tensors ``QuantizationArgs`` describe the scheme served here (see the module docstring)."""
    if weights is None or activations is None:
        return False

    def value(x):
        return str(getattr(x, "value", x))

    return (
        weights.num_bits == 8
        and value(weights.type) == "int"
        and value(weights.strategy) == "channel"
        and weights.symmetric
        and not weights.dynamic
        and activations.num_bits == 8
        and value(activations.type) == "int"
        and value(activations.strategy) == "token"
        and activations.symmetric
        and bool(activations.dynamic)
    )


def _int8_weight(layer) -> None:
    """Replace the fp8 weight parameter upstream's method just made with an int8 one, keeping its loader."""
    import jax.numpy as jnp
    from flax import nnx

    fp8 = layer.weight
    layer.weight = nnx.Param(jnp.zeros(fp8.get_value().shape, jnp.int8), **fp8.get_metadata())


def method_classes(module: ModuleType) -> tuple[type, type]:
    """The int8 methods, built on the fp8 ones of ``module`` (the loaded upstream compressed_tensors)."""

    class Int8W8A8LinearMethod(module.Fp8TensorwiseLinearMethod):
        """Upstream's per-channel W8A8 method with an int8 weight: activations are quantized to int8 per token."""

        def create_weights_jax(self, layer, *weight_args, rngs, **extra_weight_attrs):
            super().create_weights_jax(layer, *weight_args, rngs=rngs, **extra_weight_attrs)
            _int8_weight(layer)

    class Int8W8A8MergedLinearMethod(module.Fp8TensorwiseMergedLinearMethod):
        """The same for fused projections (gate_up, qkv): each shard's weight and scale arrive separately."""

        def create_weights_jax(self, layer, *weight_args, rngs, **extra_weight_attrs):
            super().create_weights_jax(layer, *weight_args, rngs=rngs, **extra_weight_attrs)
            _int8_weight(layer)

    return Int8W8A8LinearMethod, Int8W8A8MergedLinearMethod


def apply(module: ModuleType) -> Result:
    """Wrap ``CompressedTensorsConfig.get_quant_method`` in ``module`` to serve int8 W8A8 layers, if it needs it."""
    if any(not hasattr(module, name) for name in _NEEDS):
        return Result(Outcome.UNRECOGNISED, f"{module.__name__} lacks one of {_NEEDS}")
    cls = getattr(module, CLASS, None)
    found = upstream_method(cls, "get_quant_method", _MARK)
    if isinstance(found, Result):
        return found
    original, source = found
    if any(word in source for word in _UPSTREAM_INT8):
        return Result(
            Outcome.ALREADY_FIXED, f"{CLASS}.get_quant_method handles int8 itself; delete {__name__}"
        )
    linear, merged = method_classes(module)

    def get_quant_method(self, layer, prefix):
        try:
            return original(self, layer, prefix)
        except NotImplementedError:
            if not isinstance(layer, module.JaxEinsum):
                raise
            scheme = self._match_target(layer, prefix) or {}
            if not is_int8_w8a8(scheme.get("weights"), scheme.get("input_activations")):
                raise
        config = module.QuantLinearConfig(layer, enable_sp=False)
        method = merged if isinstance(layer, module.JaxMergedColumnParallelLinear) else linear
        return method(layer, config)

    replace_method(cls, "get_quant_method", get_quant_method, original, _MARK)
    return Result(
        Outcome.PATCHED,
        f"{CLASS}.get_quant_method serves int8 W8A8 (channel weights, dynamic token activations) "
        f"({inspect.getsourcefile(inspect.unwrap(original))})",
    )
