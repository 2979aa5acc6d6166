"""bench/matmul_precision.py on this CPU: every shape and method measured, errors against float64.

No timing is checked. The errors are: float32 is what the engine's exactness tests rely on, and the
bfloat16 paths must show the error that rules them out (if a PyTorch release made the split product
accumulate in float32, the second assertion fails and the bench's conclusion must be revisited).
"""

from __future__ import annotations

import json

import pytest

from bench import matmul_precision


@pytest.mark.anyio
async def test_every_shape_and_method_is_measured_against_float64():
    result = await matmul_precision.main(
        matmul_precision.parser().parse_args(["--repeats", "1", "--inner", "1"])
    )
    json.dumps(result)  # the file --out writes
    manifest = result["manifest"]
    assert manifest["run"] == "bench:matmul_precision" and manifest["git"]["commit"]
    assert manifest["args"]["repeats"] == 1 and isinstance(result["machine"]["bf16_units"], list)
    assert [(r["rows"], r["in"], r["out"]) for r in result["rows"]] == matmul_precision.SHAPES
    for row in result["rows"]:
        errors = {name: m["rel_error"] for name, m in row["methods"].items()}
        assert errors["float32"] < 1e-5
        assert errors["bfloat16"] > 1e-4 and errors["bf16 split"] > 1e-4
        assert all(len(m["samples_ms"]) == 1 and m["median_ms"] > 0 for m in row["methods"].values())
    assert "| 16 × 576 → 576 |" in matmul_precision.report(result)
