"""``decide repack``: the round trip through compressed-tensors' own decompressors, Google's q4_0 rule
on the same values, and every refusal (deploy/repack*.py).

The sources are small synthetic llama folders (repack_support.py), whose grouped weights lie on 16-level
grids by construction (both index ranges, −8..7 and −7..8, and an all-zero group), so the fast tier
checks the real format without a model download.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from deploy.repack import MANIFEST, repack
from deploy.repack_grid import Report, grid_indices, q4_0_values
from deploy.repack_source import RepackError
from opendecide.cli import app
from tests.deploy.repack_support import (
    all_tensors,
    decompressed,
    same_bits_but_zero_sign,
    write_source,
)

LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture
def source(tmp_path) -> Path:
    return write_source(tmp_path / "src", shards=2)


def test_q4_round_trip_gives_the_qat_values_back_bit_for_bit(source, tmp_path):
    manifest = repack("q4", source, tmp_path / "q4")
    original = all_tensors(source)
    weights = decompressed(tmp_path / "q4")
    assert len(weights) == 2 * len(LINEAR) == manifest["tensors"]["quantized"]
    for module, weight in weights.items():
        assert same_bits_but_zero_sign(weight, original[module + ".weight"]), module
    built = all_tensors(tmp_path / "q4")
    # k_proj's groups reach +8 steps: stored with a negative step, still −8..7 indices
    assert bool((built["model.layers.0.self_attn.k_proj.weight_scale"] < 0).any())
    # kept as they were: embedding, norms
    assert torch.equal(built["model.embed_tokens.weight"], original["model.embed_tokens.weight"])
    assert torch.equal(built["model.norm.weight"], original["model.norm.weight"])
    assert manifest["groups_rounded"] == 0 and manifest["max_rounding_error"] == 0.0


def test_build_folder_is_what_vllm_reads(source, tmp_path):
    repack("q4", source, tmp_path / "q4")
    build = tmp_path / "q4"
    config = json.loads((build / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors" and config["format"] == "pack-quantized"
    assert config["config_groups"]["group_0"]["weights"]["group_size"] == 32
    assert "lm_head" in config["ignore"]
    index = json.loads((build / "model.safetensors.index.json").read_text())["weight_map"]
    for name, shard in index.items():
        assert name in load_file(build / shard)
    manifest = json.loads((build / MANIFEST).read_text())
    assert set(manifest["sha256"]) >= {"config.json", "tokenizer.json", *index.values()}
    assert set(manifest["source_sha256"]) == {p.name for p in source.glob("*.safetensors")} | {"config.json"}
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_w8a8_decompresses_within_int8_error_and_emb4_is_exact(source, tmp_path):
    manifest = repack("w8a8", source, tmp_path / "w8", emb4=True)
    original = all_tensors(source)
    weights = decompressed(tmp_path / "w8", "group_0")
    assert len(weights) == 2 * len(LINEAR)
    worst = 0.0
    for module, weight in weights.items():
        reference = original[module + ".weight"].float()
        step = reference.abs().amax(-1, keepdim=True) / 127
        error = (weight.float() - reference).abs()
        assert bool((error <= step / 2 + 1e-6).all()), module  # round to nearest on the channel's step
        worst = max(worst, float(error.max()))
    assert manifest["int8_max_error"] == pytest.approx(worst, rel=1e-2)
    embedding = decompressed(tmp_path / "w8", "group_1")
    assert same_bits_but_zero_sign(embedding["model.embed_tokens"], original["model.embed_tokens.weight"])
    assert (
        json.loads((tmp_path / "w8" / "config.json").read_text())["quantization_config"]["format"]
        == "mixed-precision"
    )


def test_q4_0_rule_matches_llama_cpp_by_hand():
    # A block whose largest magnitude is negative and lies at −8 steps: q4_0 keeps it exactly.
    on_its_grid = torch.tensor([-8.0, 7.0, 3.0, -1.0] + [0.0] * 28) * 0.5
    assert torch.equal(q4_0_values(on_its_grid), on_its_grid)
    # Largest magnitude +7 steps (as a QAT group may be): d = 3.5 / −8 = −0.4375; by hand,
    # trunc(x / d + 8.5) capped at 15, minus 8: 3.5 → −8, −3.5 → 16.5 → 15 → 7, 1.5 → 5 → −3, 0.5 → 7 → −1.
    qat = torch.tensor([3.5, -3.5, 1.5, 0.5] + [0.0] * 28)
    by_hand = torch.tensor([-8.0, 7.0, -3.0, -1.0] + [0.0] * 28) * -0.4375
    assert torch.equal(q4_0_values(qat), by_hand)
    assert int((q4_0_values(qat) != qat).sum()) == 3  # the largest stays, the other three move


def test_off_grid_group_is_refused_naming_tensor_and_group(tmp_path):
    source = write_source(tmp_path / "src")
    tensors = load_file(source / "model.safetensors")
    name = "model.layers.1.mlp.up_proj.weight"
    tensors[name][3, 40] = tensors[name][3, 40] * 1.01 + 1e-4  # row 3, group 1 leaves its grid
    save_file(tensors, source / "model.safetensors")
    with pytest.raises(
        RepackError, match=r"model\.safetensors: model\.layers\.1\.mlp\.up_proj\.weight: row 3, group 1 "
    ):
        repack("q4", source, tmp_path / "q4")
    assert not (tmp_path / "q4").exists()
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]
    manifest = repack("q4", source, tmp_path / "q4", allow_rounding=True)
    assert manifest["groups_rounded"] == 1
    assert 0 < manifest["max_rounding_error"] < 0.01


def test_grid_recovery_prefers_eight_steps_and_counts_groups():
    values = (torch.arange(-8, 24).float() % 16 - 8).reshape(1, 32).to(torch.bfloat16) * 0.25
    report = Report()
    q, steps = grid_indices(values, name="t", allow_rounding=False, report=report)
    assert steps.float().item() == 0.25 and q.min() == -8 and q.max() == 7
    assert report.groups == 1 and report.q4_0_changed == 0


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda f: (f / "config.json").write_text(
                json.dumps({"architectures": ["BertModel"], "model_type": "bert"})
            ),
            r"config\.json: architectures \['BertModel'\] is not a causal language model",
        ),
        (lambda f: [p.unlink() for p in f.glob("*.safetensors")], r"src: no \*\.safetensors files"),
        (
            lambda f: _edit_config(f, quantization_config={"quant_method": "gptq"}),
            r"config\.json: already quantized \(gptq\)",
        ),
        (
            lambda f: _edit_config(f, model_type="mamba"),
            r"config\.json: model_type 'mamba' has no tensor rule",
        ),
        (
            lambda f: save_file(
                {"x.weight": torch.zeros(2, 2, dtype=torch.float32)}, f / "extra.safetensors"
            ),
            r"mixed dtypes: .*extra\.safetensors: x\.weight is F32, .*model\.safetensors: .* is BF16",
        ),
        (
            lambda f: save_file(
                {"x.weight_packed": torch.zeros(2, 2, dtype=torch.int32)}, f / "extra.safetensors"
            ),
            r"extra\.safetensors: x\.weight_packed is already quantized \(I32\)",
        ),
    ],
    ids=[
        "not-causal-lm",
        "no-safetensors",
        "quantized-config",
        "no-rule",
        "mixed-dtypes",
        "quantized-tensor",
    ],
)
def test_refusals_name_the_file(tmp_path, damage, message):
    source = write_source(tmp_path / "src")
    damage(source)
    with pytest.raises(RepackError, match=message):
        repack("q4", source, tmp_path / "q4")
    assert not (tmp_path / "q4").exists()


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def test_existing_destination_needs_force(source, tmp_path):
    (tmp_path / "q4").mkdir()
    (tmp_path / "q4" / "keep.txt").write_text("mine")
    with pytest.raises(RepackError, match=r"q4: exists \(--force replaces it\)"):
        repack("q4", source, tmp_path / "q4")
    assert (tmp_path / "q4" / "keep.txt").read_text() == "mine"
    repack("q4", source, tmp_path / "q4", force=True)
    assert not (tmp_path / "q4" / "keep.txt").exists() and (tmp_path / "q4" / MANIFEST).is_file()


def test_lm_head_only_when_asked_and_untied(tmp_path):
    tied = write_source(tmp_path / "tied")
    with pytest.raises(RepackError, match="lm_head is tied"):
        repack("q4", tied, tmp_path / "x", lm_head=True)
    untied = write_source(tmp_path / "untied", tied=False)
    repack("q4", untied, tmp_path / "plain")
    assert "lm_head.weight" in all_tensors(tmp_path / "plain")
    repack("q4", untied, tmp_path / "head", lm_head=True)
    weights = decompressed(tmp_path / "head")
    assert same_bits_but_zero_sign(weights["lm_head"], all_tensors(untied)["lm_head.weight"])


def test_cli_reports_and_refuses_with_exit_2(source, tmp_path):
    runner = CliRunner()
    done = runner.invoke(app, ["repack", "q4", str(source), str(tmp_path / "q4")])
    assert done.exit_code == 0, done.output
    assert "28 tensors quantized" not in done.output and "14 tensors quantized" in done.output
    again = runner.invoke(app, ["repack", "q4", str(source), str(tmp_path / "q4")])
    assert again.exit_code == 2 and "exists (--force replaces it)" in again.output
    emb4 = runner.invoke(app, ["repack", "w8a8", str(source), str(tmp_path / "w8"), "--emb4"])
    assert emb4.exit_code == 0 and "int8 per-channel: largest error" in emb4.output


@pytest.mark.parametrize(
    ("model_type", "name", "expected"),
    [
        ("llama", "model.layers.0.self_attn.q_proj.weight", "linear"),
        ("llama", "model.layers.0.input_layernorm.weight", "kept"),
        ("llama", "lm_head.weight", "kept"),
        ("gemma3", "model.language_model.layers.3.mlp.down_proj.weight", "linear"),
        ("gemma3", "model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight", "kept"),
        ("gemma3", "model.multi_modal_projector.mm_input_projection_weight", "kept"),
        ("gemma4", "model.language_model.layers.5.self_attn.k_proj.weight", "linear"),
        ("gemma4", "model.language_model.layers.5.router.proj.weight", "kept"),
        ("gemma4", "model.audio_tower.layers.0.self_attn.q_proj.weight", "kept"),
        ("gemma4_unified", "model.vision_embedder.patch_dense.weight", "kept"),
        ("gemma4_unified", "model.language_model.layers.0.mlp.up_proj.weight", "linear"),
    ],
)
def test_the_tensor_rule_per_architecture(model_type, name, expected):
    from deploy.repack_source import RULES, role

    assert role(name, (64, 64), RULES[model_type], emb4=False, lm_head=False) == expected


def test_emb4_and_lm_head_only_when_asked():
    from deploy.repack_source import RULES, role

    rule = RULES["gemma4"]
    embed = "model.language_model.embed_tokens.weight"
    assert role(embed, (64, 64), rule, emb4=False, lm_head=False) == "kept"
    assert role(embed, (64, 64), rule, emb4=True, lm_head=False) == "embedding"
    assert role("lm_head.weight", (64, 64), rule, emb4=False, lm_head=True) == "linear"
    # 3-D expert banks (no ".weight") are split per expert (tests/deploy/test_repack_experts.py)
    assert (
        role("model.language_model.layers.0.experts.gate_up_proj", (8, 64, 64), rule, emb4=True, lm_head=True)
        == "experts"
    )
    assert (
        role("model.language_model.layers.0.router.proj.weight", (8, 64), rule, emb4=True, lm_head=True)
        == "kept"
    )
    # an architecture without expert banks keeps a 3-D tensor as it is
    assert (
        role("model.layers.0.experts.gate_up_proj", (8, 64, 64), RULES["llama"], emb4=False, lm_head=False)
        == "kept"
    )
