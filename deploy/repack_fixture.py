"""``decide repack fixture``: a QAT-like test fixture made from any model the repack takes
(``snap_to_grid``), so the repack's round trip can be checked on a model without a QAT checkpoint."""

from __future__ import annotations

import shutil
from pathlib import Path

from deploy.repack import refuse_existing, staged, write_served_manifest
from deploy.repack_grid import GROUP, row_chunks
from deploy.repack_source import read_source, role
from opendecide.extras import needs_extra

with needs_extra("local", "repacking a model"):
    import torch


def snap_to_grid(src: Path, dst: Path, *, force: bool = False) -> dict:
    """A QAT-like **test fixture**: every tensor the q4 rule quantizes (expert banks included) and the
    token embedding with each group of 32 moved to the nearest point of a symmetric 16-level grid. The
    step is absmax / 7 rounded up to 4 significant bits, so ``step × q`` (q ≤ 8) is exact in bf16 and
    the largest value lands on ±7 (or less), as trained QAT groups may: this is not Google's training,
    only a source on the grid for the repack to recover. Other files are copied."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    dst = Path(dst)
    refuse_existing(dst, force)
    source = read_source(Path(src))
    snapped = 0
    with staged(dst) as staging:
        for shard in source.shards:
            tensors = {}
            with safe_open(shard, framework="pt") as reader:
                for name in reader.keys():
                    tensor = reader.get_tensor(name)
                    kind = role(name, tuple(tensor.shape), source.rule, emb4=True, lm_head=False)
                    if kind != "kept" and tensor.shape[-1] % GROUP == 0:
                        # an expert bank's groups run along its last (input) dimension too
                        tensor = _snap(tensor.reshape(-1, tensor.shape[-1])).reshape(tensor.shape)
                        snapped += 1
                    tensors[name] = tensor
            save_file(tensors, staging / shard.name, metadata={"format": "pt"})
        for path in sorted(source.folder.iterdir()):
            if path.is_file() and not path.name.endswith(".safetensors"):
                shutil.copy2(path, staging / path.name)
        # the copied model manifest, renamed: the fixture is not the model it was made from
        fixture = snap_to_grid.__doc__.split("\n\n")[0].strip()
        write_served_manifest(source, staging, "qat-fixture", "qat-fixture", fixture=fixture)
    return {"snapped_tensors": snapped, "folder": str(dst)}


def _snap(weight: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(weight)
    for start, chunk in row_chunks(weight):
        values = chunk.float().reshape(chunk.shape[0], -1, GROUP)
        target = values.abs().amax(-1) / 7.0
        exponent = torch.floor(torch.log2(torch.where(target > 0, target, torch.ones_like(target))))
        scale = torch.exp2(exponent - 3)
        step = torch.ceil(target / scale) * scale  # 4 significant bits, ≥ absmax / 7
        step = torch.where(target > 0, step, torch.ones_like(step))
        q = torch.clamp(torch.round(values / step[..., None]), -8, 7)
        out[start : start + chunk.shape[0]] = (q * step[..., None]).reshape(chunk.shape).to(weight.dtype)
    return out
