"""``decide repack`` streams: peak memory bounded by one shard of a sharded source.

The source is a synthetic QAT-like llama checkpoint (every group of 32 on a 16-level grid, as in
repack_support.py) in three shards, written here; the repack runs as the real command in its own
process, whose peak anonymous memory (``RssAnon``, sampled by repack_support.peak_memory: the source's
memory-mapped file pages are left out) is compared with the same interpreter importing the same modules
and nothing else.

Known to fail (strict xfail): the bound was met before only as an artifact. ``wait4``'s ``ru_maxrss``
carried the test process's own high-water mark (~1.2 GB) into every child, baseline and repack alike;
measured in the child itself, a repack holds 2.7 shards of anonymous memory above the baseline on this
source (docs/quantization.md). The test passes again once the repack holds at most two. Reading the source whole would cost three shards, so the bound of two
shards separates streaming from not at any size: the test runs on three ~100 MB shards (minutes less on
two cores), and ``python -m tests.deploy.test_repack_memory`` measures the documented 1.2 GB source of
three ~436 MB shards and prints its figures (evidence/quantization/memory/).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.deploy.repack_support import grid_tensor, peak_memory

pytestmark = pytest.mark.integration

LAYERS, SHARDS = 9, 3
FULL = (2048, 8192, 8192)  # hidden, intermediate, vocab: three ~436 MB shards, 1.24 GB (the evidence)
SMALL = (1024, 4096, 4096)  # a quarter of each matrix: three ~110 MB shards, what the test repacks


def write_big_source(folder: Path, size: tuple[int, int, int] = FULL) -> list[Path]:
    HIDDEN, INTERMEDIATE, VOCAB = size  # upper case: the config fields they fill
    generator = torch.Generator().manual_seed(1)
    folder.mkdir(parents=True)
    shards = []
    per_shard = LAYERS // SHARDS
    for shard in range(SHARDS):
        tensors = {}
        if shard == 0:
            tensors["model.embed_tokens.weight"] = grid_tensor(VOCAB, HIDDEN, generator)
            tensors["model.norm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
        for layer in range(shard * per_shard, (shard + 1) * per_shard):
            prefix = f"model.layers.{layer}"
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                tensors[f"{prefix}.self_attn.{name}.weight"] = grid_tensor(HIDDEN, HIDDEN, generator)
            tensors[f"{prefix}.mlp.gate_proj.weight"] = grid_tensor(INTERMEDIATE, HIDDEN, generator)
            tensors[f"{prefix}.mlp.up_proj.weight"] = grid_tensor(INTERMEDIATE, HIDDEN, generator)
            tensors[f"{prefix}.mlp.down_proj.weight"] = grid_tensor(HIDDEN, INTERMEDIATE, generator)
            for norm in ("input_layernorm", "post_attention_layernorm"):
                tensors[f"{prefix}.{norm}.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
        path = folder / f"model-{shard + 1:05d}-of-{SHARDS:05d}.safetensors"
        save_file(tensors, path, metadata={"format": "pt"})
        shards.append(path)
        del tensors
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS, "num_attention_heads": 16,
        "num_key_value_heads": 16, "vocab_size": VOCAB, "tie_word_embeddings": True,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    return shards


@pytest.mark.xfail(
    strict=True, reason="decide repack holds 2.7 shards above the baseline, not < 2 (see the docstring)"
)
def test_peak_memory_is_bounded_by_one_shard(tmp_path):
    results = measure(tmp_path, SMALL)
    assert results["source_bytes"] > 300_000_000, results
    for fmt in ("q4", "w8a8"):
        # One shard's output plus one tensor's float32 chunks: well under the shard read whole twice.
        assert (
            results[f"{fmt}_peak_rss"] - results["import_baseline_rss"] < 2 * results["largest_shard_bytes"]
        ), results


def measure(tmp_path: Path, size: tuple[int, int, int]) -> dict:
    """Peak RSS of ``decide repack q4`` and ``w8a8`` on a three-shard source of ``size``, and the baseline."""
    shards = write_big_source(tmp_path / "src", size)
    total = sum(p.stat().st_size for p in shards)
    largest = max(p.stat().st_size for p in shards)
    baseline = peak_memory(
        [sys.executable, "-c", "import torch, safetensors.torch, deploy.repack, opendecide.cli"], "RssAnon"
    )
    results = {"source_bytes": total, "largest_shard_bytes": largest, "import_baseline_rss": baseline}
    for fmt in ("q4", "w8a8"):
        peak = peak_memory(
            [sys.executable, "-m", "opendecide", "repack", fmt, str(tmp_path / "src"), str(tmp_path / fmt)],
            "RssAnon",
        )
        results[f"{fmt}_peak_rss"] = peak
        results[f"{fmt}_above_baseline_over_largest_shard"] = round((peak - baseline) / largest, 3)
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":  # the documented figures: the 1.2 GB source
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        measure(Path(folder), FULL)
