"""Synthetic llama folders for the repack tests, and the readers that check a build against them.

Not a test module: test_repack.py, test_repack_experts.py, test_repack_memory.py and
tests/eval/test_survey_formats.py share these. The source folders' grouped weights lie on 16-level grids by
construction, so a repack of them can be checked bit for bit without a model download.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import torch
from compressed_tensors.compressors import BaseCompressor
from compressed_tensors.quantization import QuantizationScheme
from safetensors.torch import load_file, save_file


def grid_tensor(
    rows: int, cols: int, generator: torch.Generator, *, high_range: bool = False
) -> torch.Tensor:
    """A bf16 tensor whose groups of 32 are ``step × q``: steps of 4 significant bits (exact in bf16),
    q in −8..7 (or −7..8 with ``high_range``), every group using both ends, row 0's first group zero."""
    groups = rows * cols // 32
    low, high = (-7, 8) if high_range else (-8, 7)
    q = torch.randint(low, high + 1, (groups, 32), generator=generator).float()
    q[:, 0], q[:, 1] = low, high
    mantissa = torch.randint(8, 16, (groups, 1), generator=generator).float()
    exponent = torch.randint(-14, -8, (groups, 1), generator=generator).float()
    values = q * mantissa * torch.exp2(exponent)
    values[0] = 0.0
    return values.reshape(rows, cols).to(torch.bfloat16)


def write_source(
    folder: Path,
    *,
    shards: int = 1,
    hidden: int = 64,
    intermediate: int = 128,
    vocab: int = 96,
    layers: int = 2,
    seed: int = 0,
    tied: bool = True,
) -> Path:
    """A llama folder (config, tokenizer file, sharded bf16 weights) with grouped weights on grids."""
    generator = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True)
    tensors = {"model.embed_tokens.weight": grid_tensor(vocab, hidden, generator)}
    tensors["model.norm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    if not tied:
        tensors["lm_head.weight"] = grid_tensor(vocab, hidden, generator)
    shapes = {
        "q_proj": (hidden, hidden), "k_proj": (hidden // 2, hidden), "v_proj": (hidden // 2, hidden),
        "o_proj": (hidden, hidden), "gate_proj": (intermediate, hidden), "up_proj": (intermediate, hidden),
        "down_proj": (hidden, intermediate),
    }  # fmt: skip
    for layer in range(layers):
        for name, shape in shapes.items():
            part = "self_attn" if name.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            tensors[f"model.layers.{layer}.{part}.{name}.weight"] = grid_tensor(
                *shape, generator, high_range=name == "k_proj"
            )
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"model.layers.{layer}.{norm}.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    names = sorted(tensors)
    for i in range(shards):
        part = {n: tensors[n] for n in names[i::shards]}
        filename = "model.safetensors" if shards == 1 else f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, folder / filename, metadata={"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "dtype": "bfloat16",
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text("{}")
    return folder


def all_tensors(folder: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for shard in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(shard))
    return tensors


def decompressed(build: Path, group: str = "group_0") -> dict[str, torch.Tensor]:
    """Every module of ``group`` decompressed by compressed-tensors' own compressor for its format."""
    config = json.loads((build / "config.json").read_text())["quantization_config"]["config_groups"][group]
    scheme = QuantizationScheme(targets=config["targets"], weights=config["weights"],
                                input_activations=config["input_activations"])  # fmt: skip
    compressor = BaseCompressor.get_value_from_registry(config["format"])
    tensors = all_tensors(build)
    key = "weight_packed" if config["format"] == "pack-quantized" else "weight"
    modules = sorted(
        n[: -len(key) - 1]
        for n in tensors
        if n.endswith("." + key) and n[: -len(key) - 1] + ".weight_scale" in tensors
    )
    return {
        m: compressor.decompress({k.rsplit(".", 1)[1]: v for k, v in tensors.items() if k.rsplit(".", 1)[0] == m}, scheme)["weight"]
        for m in modules
    }  # fmt: skip


def same_bits_but_zero_sign(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, except −0.0 against +0.0 (an integer index has no signed zero)."""
    differ = a.view(torch.int16) != b.view(torch.int16)
    return a.dtype == b.dtype and not bool((differ & ~((a == 0) & (b == 0))).any())


def peak_memory(command: list[str], field: str) -> int:
    """The peak of one /proc/PID/status memory field (``VmHWM``: resident; ``RssAnon``: anonymous
    resident) of a child process, in bytes, sampled every 5 ms until it exits.

    Sampled, not ``wait4``'s ``ru_maxrss``: Linux carries the parent's high-water mark into a child
    across fork and exec, so a child smaller than the test process would report the test's own peak.
    ``VmHWM`` is the exec'd image's own mark, so its last sample bounds every earlier moment."""
    root = Path(__file__).resolve().parents[2]
    process = subprocess.Popen(command, cwd=root, env=dict(os.environ, PYTHONPATH=str(root)))
    peak = 0
    while process.poll() is None:
        try:
            status = Path(f"/proc/{process.pid}/status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            break
        for line in status.splitlines():
            if line.startswith(f"{field}:"):
                peak = max(peak, int(line.split()[1]) * 1024)
        time.sleep(0.005)
    assert process.wait() == 0, command
    return peak
