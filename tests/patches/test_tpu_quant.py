"""The three quantization patches against tpu-inference 0.32.0's own JAX layers, on JAX's CPU backend.

Each case runs ``quant_harness.py`` in a fresh interpreter: the wheel's ``JaxLinear``, ``JaxMergedColumnParallelLinear``
and ``JaxEmbed`` are built with the wheel's JAX ``CompressedTensorsConfig``, loaded through their own weight
loaders with tensors packed by the ``compressed-tensors`` library, and called. The harness's docstring lists what
is real and what is a stand-in. Small shapes: a 64 → 96 linear, a 64 → 48 + 80 fused one, a 64 → 4 × 16 einsum
(attention's shape), a 1,000 × 96 table and a 96 → 1,000 untied head.

Tolerances: the int8 linear is compared with float64 arithmetic on the same int8 activations (per-token step
max|x| / 127) and the dequantized weight: its largest error is float32 rounding, under 1e-6 of the largest output.
That is 1,000 times finer than what quantizing the activation changes (about 6e-3 here), so a method that skipped
it would fail. The packed embedding, the logits read from it and an untied int4 head are compared bit for bit
with upstream's own ``JaxEmbed`` and ``JaxLmHead`` holding the dequantized bf16 table.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.patches.harness import run_harness

pytestmark = pytest.mark.integration  # pip downloads the wheel and installs the plugin; a harness process

HARNESS = Path(__file__).with_name("quant_harness.py")
CT = "tpu_inference/layers/jax/quantization/compressed_tensors.py"
EMBED = "tpu_inference/layers/jax/embed.py"
LINEAR = "tpu_inference/layers/jax/linear.py"
LOGGER = "vllm.opendecide_tpu_patches"


def harness(site: Path, tree: Path, case: str, *flags: str) -> dict:
    return run_harness(HARNESS, site, "--tree", tree, *flags, case)


def patch_lines(result: dict, level: str = "INFO") -> list[str]:
    return [message for name, lvl, message in result["log"] if name == LOGGER and lvl == level]


@pytest.fixture(scope="session")
def fixed_tree(upstream_tree, tmp_path_factory) -> Path:
    """0.32.0 with the features upstream would add, written the way the patches recognise them.

    ``get_quant_method`` gains an int8 branch (vLLM's ``_is_dynamic_token_w8a8``) and an embedding branch, and
    ``JaxEmbed.decode`` and ``JaxLmHead.__call__`` ask their quant method. The branches do nothing useful here (an embedding stays dense);
    they only have to be there for the patches to leave the code alone.
    """
    tree = tmp_path_factory.mktemp("tpu-inference-fixed")
    shutil.copytree(upstream_tree / "tpu_inference", tree / "tpu_inference")
    ct = (tree / CT).read_text()
    anchor = "        if not isinstance(layer, JaxEinsum):\n            return None\n"
    assert ct.count(anchor) == 1
    (tree / CT).write_text(
        ct.replace(
            anchor,
            "        from tpu_inference.layers.jax.embed import JaxEmbed\n"
            "        if isinstance(layer, JaxEmbed):\n"
            "            return None  # upstream's embedding branch\n"
            "        scheme = self._match_target(layer, prefix) or {}\n"
            "        if scheme and self._ct._is_dynamic_token_w8a8(scheme['weights'], scheme['input_activations']):\n"
            "            return None  # upstream's int8 branch\n" + anchor,
        )
    )
    embed = (tree / EMBED).read_text()
    decode = "        return jax.numpy.dot(x, self.weight.value.T)\n"
    assert embed.count(decode) == 1
    (tree / EMBED).write_text(
        embed.replace(
            decode,
            "        if self.quant_method is not None:\n            raise NotImplementedError\n" + decode,
        )
    )
    head = (tree / LINEAR).read_text()
    call = "        return jax.numpy.einsum(self.einsum_str, inputs, self.weight.value)\n"
    assert head.count(call) == 1
    (tree / LINEAR).write_text(
        head.replace(
            call, "        if self.quant_method is not None:\n            raise NotImplementedError\n" + call
        )
    )
    return tree


def test_unpatched_upstream_refuses_int8_w8a8(plugin_site, upstream_tree):
    result = harness(plugin_site, upstream_tree, "w8a8")

    assert result["error"] == {
        "type": "NotImplementedError",
        "message": "compressed-tensors scheme for layer 'mlp.down_proj' is not yet supported in the JAX path.",
    }


def test_int8_w8a8_linear_matches_dequantized_reference(plugin_site, upstream_tree):
    result = harness(plugin_site, upstream_tree, "w8a8", "--plugin")

    assert result["error"] is None
    assert (result["method"], result["merged_method"]) == (
        "Int8W8A8LinearMethod",
        "Int8W8A8MergedLinearMethod",
    )
    assert result["weight_dtype"] == "int8"  # one byte a weight on chip, as the checkpoint stores it
    assert result["shapes"] == [[5, 96], [5, 128], [5, 4, 16]]
    assert result["max_rel_error"] < 1e-6
    assert result["merged_max_rel_error"] < 1e-6
    assert result["heads_max_rel_error"] < 1e-6
    assert result["activation_rounding_rel"] > 1e-3  # the reference's activation quantization is visible
    assert any(
        "int8_w8a8_linear: patched: CompressedTensorsConfig.get_quant_method serves int8 W8A8" in m
        for m in patch_lines(result)
    )


def test_unpatched_upstream_builds_a_dense_embedding(plugin_site, upstream_tree):
    """Without the patch the W4A16 embedding group is not answered: a bf16 table with no place for packed tensors."""
    result = harness(plugin_site, upstream_tree, "embedding")

    assert result["method"] is None
    assert result["params"] == {"weight": [1000, 96]}


def test_packed_embedding_and_tied_logits_equal_the_dequantized_table(plugin_site, upstream_tree):
    result = harness(plugin_site, upstream_tree, "embedding", "--plugin")

    assert result["method"] == "PackedInt4EmbeddingMethod"
    assert result["loaded"] is True
    assert result["params"] == {
        "weight_packed": [[1000, 12], "int32"],
        "weight_scale": [[1000, 3], "bfloat16"],
        "weight_shape": [[2], "int32"],
    }
    assert result["table_bytes"] * 2 == result["values"]  # half a byte per value
    assert result["scale_bytes"] * 16 == result["values"]  # plus one bf16 step per 32 values
    assert result["rows_equal"] and result["rows_dtype"] == "bfloat16" and result["rows_shape"] == [2, 4, 96]
    assert result["dense_lookup_holds_table"] and not result["lookup_holds_table"]
    assert result["logits_scale"] > 1.0
    assert result["logits_max_abs_error"] == 0.0
    assert result["blocked_logits_max_abs_error"] == 0.0  # 8 blocks of 128 rows, the last one overlapping
    lines = patch_lines(result)
    assert any("packed_int4_embedding: patched:" in m for m in lines)
    assert any(
        "int4_lm_head: patched: JaxEmbed.decode computes logits from a packed int4 table" in m for m in lines
    )


def test_tied_logits_fail_without_the_lm_head_patch(plugin_site, upstream_tree):
    """Upstream's decode reads ``self.weight``, which a packed table does not have."""
    result = harness(plugin_site, upstream_tree, "embedding", "--patches", "packed_int4_embedding")

    assert result["rows_equal"]
    assert result["decode_error"] == {
        "type": "AttributeError",
        "message": "'NoneType' object has no attribute 'value'",
    }


def test_unpatched_upstream_untied_head_stays_dense(plugin_site, upstream_tree):
    """``JaxLmHead`` asks no config: a group naming ``lm_head`` leaves it a bf16 [hidden, vocab] kernel."""
    result = harness(plugin_site, upstream_tree, "untied_head")

    assert result["method"] is None
    assert result["params"] == {"weight": [96, 1000]}


def test_untied_int4_head_equals_the_dequantized_head(plugin_site, upstream_tree):
    result = harness(plugin_site, upstream_tree, "untied_head", "--plugin")

    assert result["method"] == "PackedInt4LmHeadMethod"
    assert result["loaded"] is True
    assert result["params"] == {"weight_packed": [1000, 12], "weight_scale": [1000, 3], "weight_shape": [2]}
    assert result["sharding"] == [
        "model",
        None,
    ]  # by vocabulary row, as upstream shards the [hidden, vocab] kernel
    assert result["logits_scale"] > 1.0
    assert result["logits_max_abs_error"] == 0.0
    assert any("int4_untied_lm_head: patched: JaxLmHead keeps an lm_head" in m for m in patch_lines(result))


def test_patches_are_logged_noops_where_upstream_has_the_features(plugin_site, fixed_tree):
    result = harness(plugin_site, fixed_tree, "embedding", "--plugin")

    fixed = sorted(m for m in patch_lines(result) if ": already fixed upstream: " in m)
    assert fixed == [
        "opendecide_tpu_patches.int4_lm_head: already fixed upstream: JaxEmbed.decode asks the layer's quant "
        "method; delete opendecide_tpu_patches.int4_lm_head",
        "opendecide_tpu_patches.int4_untied_lm_head: already fixed upstream: JaxLmHead.__call__ asks a quant "
        "method; delete opendecide_tpu_patches.int4_untied_lm_head",
        "opendecide_tpu_patches.int8_w8a8_linear: already fixed upstream: CompressedTensorsConfig.get_quant_method "
        "handles int8 itself; delete opendecide_tpu_patches.int8_w8a8_linear",
        "opendecide_tpu_patches.packed_int4_embedding: already fixed upstream: CompressedTensorsConfig."
        "get_quant_method answers for embeddings; delete opendecide_tpu_patches.packed_int4_embedding",
    ]
    assert not [m for m in patch_lines(result) if ": patched: " in m]
    assert result["error"] is None and result["method"] is None  # upstream's own (here inert) branch answered
