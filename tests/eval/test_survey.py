"""The survey, offline from recorded metadata, against KV tokens measured on one TPU v5e chip."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from eval.survey import kv_bytes_per_token, load_metadata, parameter_count, survey_model
from service.cli import app

METADATA = Path(__file__).resolve().parents[1] / "fixtures" / "survey-metadata.json"
META = load_metadata(METADATA)


@pytest.mark.parametrize(
    "model, published_parameters",
    [("Qwen/Qwen3-4B", 4_022_468_096), ("ibm-granite/granite-3.3-2b-instruct", 2_533_539_840), ("google/gemma-3-270m", 268_098_176)],
)
def test_parameter_count_from_the_config(model, published_parameters):
    assert parameter_count(META[model]["config"]) == published_parameters


def test_kv_bytes_per_token():
    # Qwen3-4B: 2 × 36 layers × 8 KV heads × 128 × 2 bytes
    assert kv_bytes_per_token(META["Qwen/Qwen3-4B"]["config"], max_model_len=4096, dtype_bytes=2) == 147_456
    # Gemma 3 270M: 3 full layers + 15 sliding (window 512 of 4096 tokens) × 2 × 1 × 256 × 2
    assert kv_bytes_per_token(META["google/gemma-3-270m"]["config"], max_model_len=4096, dtype_bytes=2) == pytest.approx(1024 * (3 + 15 * 512 / 4096))
    shared = dict(META["Qwen/Qwen3-4B"]["config"], num_kv_shared_layers=6)
    assert kv_bytes_per_token(shared, max_model_len=4096, dtype_bytes=2) == 147_456 * 30 / 36


@pytest.mark.parametrize("model", ["Qwen/Qwen3-4B", "ibm-granite/granite-3.3-2b-instruct", "HuggingFaceTB/SmolLM3-3B", "Qwen/Qwen3-1.7B"])
def test_kv_tokens_within_5_percent_of_v5e_measurements(model):
    row = survey_model(model, META[model], chip="v5e", max_model_len=4096)
    assert row.measured_kv_tokens
    assert row.kv_tokens == pytest.approx(row.measured_kv_tokens, rel=0.05)
    assert row.verdict == "fits"


def test_verdicts():
    assert survey_model("Qwen/Qwen3-4B", META["Qwen/Qwen3-4B"], chip="v5e", max_model_len=4096, reserve_gib=5.5).verdict == "tight"
    big = dict(META["Qwen/Qwen3-4B"], safetensors_total=8_000_000_000)
    assert survey_model("16GB", big, chip="v5e", max_model_len=4096).verdict == "no"
    assert survey_model("16GB", big, chip="v6e", max_model_len=4096).verdict == "fits"


def test_survey_command_offline_with_a_licence_filter():
    result = CliRunner().invoke(
        app, ["survey", "Qwen/Qwen3-4B", "google/gemma-3-270m", "--chip", "v5e", "--metadata", str(METADATA), "--license", "apache-2.0,mit"]
    )
    assert result.exit_code == 0, result.output
    assert "Qwen/Qwen3-4B" in result.stdout and "50,688" in result.stdout
    assert not any(line.startswith("| google/gemma-3-270m") for line in result.stdout.splitlines())
    assert "left out by --license: google/gemma-3-270m (licence gemma)" in result.stdout
