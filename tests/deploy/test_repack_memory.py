"""``decide repack`` streams: peak memory bounded by one shard, measured on a 1 GB+ sharded source.

The source is a synthetic QAT-like llama checkpoint (every group of 32 on a 16-level grid, as in
repack_support.py) of three ~400 MB shards, written here; the repack runs as the real command in its own
process, whose peak RSS (``wait4``'s ``ru_maxrss``) is compared with the same interpreter importing
the same modules and nothing else. Run with ``-s`` to see the figures (evidence/quantization/memory.txt).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.deploy.repack_support import grid_tensor

pytestmark = pytest.mark.integration

HIDDEN, INTERMEDIATE, LAYERS, SHARDS, VOCAB = 2048, 8192, 9, 3, 8192


def write_big_source(folder: Path) -> list[Path]:
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


def peak_rss(command: list[str]) -> int:
    """Peak resident bytes of one child process (Linux reports ru_maxrss in KiB)."""
    root = Path(__file__).resolve().parents[2]
    process = subprocess.Popen(command, cwd=root, env=dict(os.environ, PYTHONPATH=str(root)))
    _, status, usage = os.wait4(process.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, command
    return usage.ru_maxrss * 1024


def test_peak_memory_is_bounded_by_one_shard(tmp_path):
    shards = write_big_source(tmp_path / "src")
    total = sum(p.stat().st_size for p in shards)
    largest = max(p.stat().st_size for p in shards)
    assert total > 1_000_000_000
    baseline = peak_rss(
        [sys.executable, "-c", "import torch, safetensors.torch, deploy.repack, opendecide.cli"]
    )
    results = {"source_bytes": total, "largest_shard_bytes": largest, "import_baseline_rss": baseline}
    for fmt in ("q4", "w8a8"):
        peak = peak_rss(
            [sys.executable, "-m", "opendecide", "repack", fmt, str(tmp_path / "src"), str(tmp_path / fmt)]
        )
        results[f"{fmt}_peak_rss"] = peak
        results[f"{fmt}_above_baseline_over_largest_shard"] = round((peak - baseline) / largest, 3)
        # One shard's output plus one tensor's float32 chunks: well under the shard read whole twice.
        assert peak - baseline < 2 * largest, results
    print(json.dumps(results, indent=2))
