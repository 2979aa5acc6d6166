"""The numbers of a repack (deploy/repack.py): each group's 4-bit grid recovered from the QAT values,
Google's q4_0 rule on the same values for comparison, int4 packing and per-channel int8.

Google's ``*-qat-q4_0-unquantized`` checkpoints are bf16 tensors whose every group of 32 values (along
the input dimension) already lies on a symmetric 16-level grid ``step × q``, ``q`` in −8..7: training
put them there. ``grid_indices`` recovers each group's step and the grid indices as they are, where
re-quantizing (a fresh absmax step, as a q4_0 export does) would move values the training chose.

Rows are worked on in chunks of ``CHUNK_ROWS``, so one huge tensor's float32 copies stay small.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from deploy.repack_source import RepackError
from opendecide.extras import needs_extra

with needs_extra("local", "repacking a model"):
    import torch

GROUP = 32
# Rows of a weight matrix worked on at once: bounds the float32 copies of one huge tensor (a 262,144-row
# embedding) to a few hundred MB instead of 4 GB.
CHUNK_ROWS = 4096


@dataclass
class Report:
    """What a repack did, written into the manifest."""

    quantized: int = 0
    kept: int = 0
    expert_matrices: int = 0  # per-expert matrices written from split expert banks
    groups: int = 0
    groups_rounded: int = 0
    max_rounding_error: float = 0.0
    # Google's re-rounded export (llama.cpp q4_0) applied to the same values: how many it moves
    q4_0_changed: int = 0
    q4_0_values: int = 0
    q4_0_max_change: float = 0.0
    int8_max_error: float = 0.0
    kept_names: list[str] = field(default_factory=list)


def row_chunks(weight: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]]:
    """``(first row, rows)`` of ``weight``, ``CHUNK_ROWS`` rows at a time."""
    for start in range(0, weight.shape[0], CHUNK_ROWS):
        yield start, weight[start : start + CHUNK_ROWS]


def grid_indices(
    weight: torch.Tensor, *, name: str, allow_rounding: bool, report: Report
) -> tuple[torch.Tensor, torch.Tensor]:
    """The int4 indices (int8, −8..7) and per-group steps (``weight.dtype``) with
    ``step × index == weight`` exactly, for a 2-D weight whose rows split into groups of 32.

    A group's step is ``absmax / k`` for the first ``k`` in 8, 7, …, 1 that puts every value of the
    group on an integer index in range, checked by reconstructing in the weight's own dtype (so the
    step is one the dtype can hold). A group whose largest value is a positive 8 steps (−7..8) gets a
    negative step: the stored index range stays −8..7. A group on no such grid is refused, naming the
    tensor and group, unless ``allow_rounding``: then it is rounded by the q4_0 rule and the largest
    error is reported."""
    rows, cols = weight.shape
    if cols % GROUP:
        raise RepackError(f"{name}: {cols} columns do not split into groups of {GROUP}")
    indices = torch.empty((rows, cols), dtype=torch.int8)
    steps = torch.empty((rows, cols // GROUP), dtype=weight.dtype)
    for start, chunk in row_chunks(weight):
        values = chunk.float().reshape(-1, GROUP)  # one row per group
        absmax = values.abs().amax(-1)
        best_q = torch.zeros(values.shape, dtype=torch.int8)
        best_step = torch.ones(absmax.shape, dtype=torch.float32)  # an all-zero group: index 0, step 1
        left = (absmax != 0).nonzero()[:, 0]  # groups still without a grid
        for k in range(8, 0, -1):
            if not left.numel():
                break
            group = values[left]
            step = (absmax[left] / k).to(weight.dtype).float()
            q = torch.round(group / step[:, None])
            exact = ((q * step[:, None]).to(weight.dtype).float() == group).all(-1)
            low, high = q.amin(-1), q.amax(-1)
            plus = exact & (low >= -8) & (high <= 7)
            minus = exact & ~plus & (low >= -7) & (high <= 8)
            take = plus | minus
            sign = torch.where(minus, -1.0, 1.0)[take]
            best_q[left[take]] = (q[take] * sign[:, None]).to(torch.int8)
            best_step[left[take]] = step[take] * sign
            left = left[~take]
        if left.numel():
            row, group = divmod(int(left[0]), cols // GROUP)
            if not allow_rounding:
                raise RepackError(
                    f"{name}: row {row + start}, group {group} (columns {group * GROUP}..{group * GROUP + GROUP - 1}) "
                    "is not on a 16-level grid: not a QAT checkpoint (--allow-rounding rounds it)"
                )
            q, step = _q4_0(values[left])
            best_q[left] = q
            best_step[left] = step.to(weight.dtype).float()
            rebuilt = (q.float() * best_step[left][:, None]).to(weight.dtype).float()
            report.groups_rounded += left.numel()
            report.max_rounding_error = max(
                report.max_rounding_error, float((rebuilt - values[left]).abs().max())
            )
        rows_here = chunk.shape[0]
        indices[start : start + rows_here] = best_q.reshape(rows_here, cols)
        steps[start : start + rows_here] = best_step.reshape(rows_here, cols // GROUP).to(weight.dtype)
        report.groups += absmax.numel()
        _count_q4_0_changes(values, report)
    return indices, steps


def _q4_0(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.cpp's q4_0 rule (``quantize_row_q4_0_ref`` in ggml-quants.c), which Google's q4_0 GGUF
    exports apply to the QAT values: per block of 32, ``d = max / -8`` where ``max`` is the first value
    of largest magnitude (sign kept), indices ``min(15, trunc(x / d + 8.5)) − 8``; ``d`` is stored as
    float16. Returns the signed indices (int8) and ``d`` (float32, after its float16 store)."""
    first_largest = values.abs().argmax(-1, keepdim=True)  # argmax returns the first maximum
    signed_max = values.gather(-1, first_largest)[..., 0]
    d = signed_max / -8.0
    inverse = torch.where(d == 0, torch.zeros_like(d), 1.0 / d)
    q = torch.clamp(torch.trunc(values * inverse[..., None] + 8.5), max=15) - 8
    return q.to(torch.int8), d.to(torch.float16).float()


def q4_0_values(values: torch.Tensor) -> torch.Tensor:
    """The float32 values a q4_0 export gives back for groups of 32 (``values``: [..., 32])."""
    q, d = _q4_0(values.float())
    return q.float() * d[..., None]


def _count_q4_0_changes(values: torch.Tensor, report: Report) -> None:
    change = (q4_0_values(values) - values).abs()
    report.q4_0_changed += int((change != 0).sum())
    report.q4_0_values += values.numel()
    report.q4_0_max_change = max(report.q4_0_max_change, float(change.max()))


def pack_int4(indices: torch.Tensor) -> torch.Tensor:
    """Eight signed 4-bit indices per int32 along each row, as compressed-tensors' ``pack_to_int32``
    lays them out (index + 8, the i-th of eight in bits 4i..4i+3)."""
    rows, cols = indices.shape
    if cols % 8:
        raise RepackError(f"{cols} columns do not pack eight to an int32")
    nibbles = (indices.to(torch.int32) + 8).reshape(rows, cols // 8, 8)
    packed = torch.zeros((rows, cols // 8), dtype=torch.int32)
    for i in range(8):
        packed |= nibbles[:, :, i] << (4 * i)
    return packed


def int8_channels(weight: torch.Tensor, report: Report) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8 (absmax / 127, round to nearest) and float32 scales [rows, 1]."""
    q = torch.empty(weight.shape, dtype=torch.int8)
    scales = torch.empty((weight.shape[0], 1), dtype=torch.float32)
    for start, chunk in row_chunks(weight):
        values = chunk.float()
        scale = values.abs().amax(-1, keepdim=True) / 127.0
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        qc = torch.clamp(torch.round(values / scale), -127, 127)
        error = (qc * scale - values).abs().max()
        report.int8_max_error = max(report.int8_max_error, float(error))
        q[start : start + chunk.shape[0]] = qc.to(torch.int8)
        scales[start : start + chunk.shape[0]] = scale
    return q, scales
