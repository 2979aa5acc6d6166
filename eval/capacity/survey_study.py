"""The survey checked against the reference study's published v5e builds (``decide survey-study``).

Each published Gemma 4 build (its weight format, chip, utilisation and --max-model-len) is sized by
:func:`eval.capacity.survey.survey_model` and set beside the weights and KV tokens the study published,
so a change to the survey's arithmetic shows up as a changed difference here.
"""

from __future__ import annotations

import json

from eval.capacity.survey import DEFAULT_RESERVE_GIB, survey_model

STUDY = "quantization-study.json"


def study_reference() -> dict:
    """The reference study's Gemma 4 configs, parameters by class and published v5e figures (shipped
    data: eval/data/reference/quantization-study.json, with its source and dates)."""
    from importlib import resources

    data = json.loads(resources.files("eval.data.reference").joinpath(STUDY).read_text())
    for meta in data["models"].values():
        config = meta["config"]
        if config.get("layer_types_rule", "").startswith("full_attention where i % 6 == 5"):
            config["layer_types"] = [
                "full_attention" if i % 6 == 5 else "sliding_attention"
                for i in range(config["num_hidden_layers"])
            ]
    return data


def study_check(*, reserve_gib: float = DEFAULT_RESERVE_GIB) -> list[dict]:
    """Each published build sized by ``survey_model`` (its weight format, chip, utilisation and
    --max-model-len; sliding layers at full length, as tpu-inference allocated them there), beside the
    published weights and KV tokens, with the differences."""
    data = study_reference()
    rows = []
    for figure in data["published"]:
        row = survey_model(
            figure["model"], data["models"][figure["model"]], chip=figure["chip"],
            max_model_len=figure["max_model_len"], reserve_gib=reserve_gib,
            memory_utilisation=figure["gpu_memory_utilization"], weight_format=figure["weight_format"],
            sliding_kv="full",
        )  # fmt: skip
        rows.append(
            {
                **{
                    key: figure[key]
                    for key in ("model", "build", "weight_format", "chip", "max_model_len", "where")
                },
                "predicted_weights_gib": row.weights_gib,
                "published_weights_gib": figure["weights_gib"],
                "weights_difference_gib": row.weights_gib - figure["weights_gib"],
                "predicted_kv_tokens": row.kv_tokens,
                "published_kv_tokens": figure["kv_tokens"],
                "kv_tokens_difference": (row.kv_tokens - figure["kv_tokens"]) / figure["kv_tokens"],
                "kv_bytes_per_token": row.kv_bytes_per_token,
            }
        )
    return rows


def study_table(rows: list[dict]) -> str:
    lines = [
        "| model | build (format) | chip, max-model-len | weights GiB predicted | published | Δ | KV bytes/token | KV tokens predicted | published | Δ |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['build']} ({r['weight_format']}) | {r['chip']}, {r['max_model_len']:,} | "
            f"{r['predicted_weights_gib']:.2f} | {r['published_weights_gib']:.2f} | {r['weights_difference_gib']:+.2f} | "
            f"{r['kv_bytes_per_token']:,.0f} | {r['predicted_kv_tokens']:,} | {r['published_kv_tokens']:,} | "
            f"{r['kv_tokens_difference']:+.1%} |"
        )
    return "\n".join(lines) + "\n"
