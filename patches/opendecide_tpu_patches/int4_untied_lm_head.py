# Lets an untied output head be int4 on tpu-inference's JAX path. `JaxLmHead` (layers/jax/linear.py) never asks a
# quantization config: the JAX models build it without one, and its docstring says quant configs must not
# dispatch onto it (fp8 and int8 checkpoints keep a bf16 head; vLLM's own config does quantize a named head).
# A checkpoint whose config group names `lm_head` ships `lm_head.weight_packed`, `weight_scale` and
# `weight_shape` instead of `lm_head.weight`, and fails to load. Present in tpu-inference 0.32.0 (PyPI) and on main at b8692ff0 (2026-08-22):
# https://github.com/vllm-project/tpu-inference/blob/b8692ff01fa191343836996c27a39dc95f008b88/tpu_inference/layers/jax/linear.py
# Delete this module together with packed_int4_embedding, or once the pinned tpu-inference's JaxLmHead.__call__
# asks a quant method: the plugin then logs "already fixed upstream".
"""Keep an int4 ``lm_head`` named by a W4A16 config group packed, and compute its logits a block at a time.

The config is the one tpu-inference's model loader puts on the ``VllmConfig`` it builds the model under
(``get_current_vllm_config().quant_config``); only a group that names the head (e.g. ``lm_head``) packs it.
The head keeps the checkpoint's ``[vocab, d]`` layout, packed exactly as an embedding table
(``packed_int4_embedding``), and its logits are ``int4_lm_head.packed_logits``. Without such a group, or under
another config, the head stays upstream's.
"""

from __future__ import annotations

import functools
import inspect
import sys
from types import ModuleType

from ._patching import Outcome, Result, replace_method, upstream_method
from .int4_lm_head import packed_logits
from .packed_int4_embedding import MODULE as CT_MODULE
from .packed_int4_embedding import method_class, packed_weights

MODULE = "tpu_inference.layers.jax.linear"
CLASS = "JaxLmHead"
_MARK = "_opendecide_int4_untied_lm_head"


@functools.cache
def head_method(ct: ModuleType) -> type:
    """The packed head method, built once per loaded upstream compressed_tensors module."""

    class PackedInt4LmHeadMethod(method_class(ct)):
        """An int4 ``[vocab, d]`` head kept packed; logits unpack it a block of rows at a time."""

        @staticmethod
        def dense_table(layer) -> tuple[int, int, tuple]:
            # JaxLmHead's kernel is [d, vocab]; the packed table is [vocab, …], so its sharding is the reverse.
            features, vocab = layer.weight.get_value().shape
            sharding = tuple(layer.weight.get_metadata().get("out_sharding", ()) or ())
            return vocab, features, tuple(reversed(sharding + (None,) * (2 - len(sharding))))

        def apply_jax(self, layer, x):
            return packed_logits(
                x, layer.weight_packed[...], layer.weight_scale[...], self.features, self.dtype
            )

    return PackedInt4LmHeadMethod


def _current_quant_config():
    from vllm.config import get_current_vllm_config

    return getattr(get_current_vllm_config(), "quant_config", None)


def apply(module: ModuleType) -> Result:
    """Let ``JaxLmHead`` in ``module`` hold and read a packed int4 head, if it cannot already."""
    cls = getattr(module, CLASS, None)
    found = upstream_method(cls, "__call__", _MARK)
    if isinstance(found, Result):
        return found
    call, source = found
    init = vars(cls).get("__init__")
    if not inspect.isfunction(init):
        return Result(Outcome.UNRECOGNISED, f"{module.__name__} has no {CLASS}.__init__ of its own")
    if "quant_method" in source:
        return Result(Outcome.ALREADY_FIXED, f"{CLASS}.__call__ asks a quant method; delete {__name__}")
    if "self.weight" not in source:
        return Result(Outcome.UNRECOGNISED, f"{CLASS}.__call__ does not read self.weight")

    def __init__(self, hidden_size, vocab_size, rngs, *, prefix="lm_head", **kwargs):
        init(self, hidden_size, vocab_size, rngs, prefix=prefix, **kwargs)
        ct = sys.modules.get(CT_MODULE)
        config = _current_quant_config()
        if ct is None or not isinstance(config, ct.CompressedTensorsConfig):
            return
        weights = packed_weights(ct, config, self, prefix, "lm_head")
        if weights is not None:
            self.quant_method = head_method(ct)(self, prefix, weights.group_size)
            self.quant_method.create_weights_jax(self)

    def __call__(self, inputs):
        if self.quant_method is not None:
            return self.quant_method.apply_jax(self, inputs)
        return call(self, inputs)

    replace_method(cls, "__init__", __init__, init, _MARK)
    replace_method(cls, "__call__", __call__, call, _MARK)
    return Result(
        Outcome.PATCHED,
        f"{CLASS} keeps an lm_head named by a W4A16 group packed and reads it in blocks "
        f"({inspect.getsourcefile(call)})",
    )
