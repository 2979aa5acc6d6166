"""Run files: the shipped examples load; each kind of mistake is refused with its field named."""

from __future__ import annotations

import tomllib

import pytest

from deploy.runfile import TARGETS, TPU_ENGINE_IMAGE, RunFileError, duration_seconds, load_run, parse_run
from tests.deploy.run_files import EXAMPLES, ROOT


def test_one_example_per_target():
    targets = {load_run(path).target for path in EXAMPLES}
    assert targets == set(TARGETS)


def test_example_loads_with_the_study_defaults(example_name):
    run = load_run(ROOT / "deploy" / "runs" / f"{example_name}.toml")
    assert run.max_num_seqs == 16 and run.max_logprobs == 32
    assert run.max_run_duration == "4h" and run.max_run_seconds == 4 * 3600
    # Generation arms need room for a 2,048-token answer after the prompt, image arms for the images'
    # tokens (Gemma: 256 each) before it.
    assert run.models and all(
        m.max_model_len == (4096 if run.generate or m.images else 2048) for m in run.models
    )
    if run.accelerator == "tpu":
        assert run.engine_image == TPU_ENGINE_IMAGE


def good() -> dict:
    return tomllib.loads((ROOT / "deploy" / "runs" / "v6e.toml").read_text())


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (lambda d: d.pop("target"), "target", "required"),
        (lambda d: d.update(target="v7"), "target", "one of v6e, v5e, l4-gcp, l4-aws"),
        (lambda d: d.update(name="Bad_Name"), "name", "lowercase"),
        (lambda d: d.update(provisioning="spot"), "provisioning", "one of on-demand, flex-start"),
        (lambda d: d.update(bucket="s3://b"), "bucket", "gs://BUCKET"),
        (lambda d: d.update(engine_image="vllm/vllm-tpu:nightly"), "engine_image", "pinned by digest"),
        (lambda d: d.update(service_image="ghcr.io/x/y:latest"), "service_image", "pinned by digest"),
        (lambda d: d.pop("service_image"), "service_image", "required"),
        (lambda d: d.pop("project"), "project", "required"),
        (lambda d: d.update(max_run_duration="four hours"), "max_run_duration", "not a duration"),
        (lambda d: d.update(zones="x"), "zones", "unknown field"),
        (lambda d: d["engine"].update(max_model_len=0), "engine.max_model_len", "positive integer"),
        (lambda d: d["engine"].update(max_num_seqs=True), "engine.max_num_seqs", "positive integer"),
        (
            lambda d: d["engine"].update(extra_flags="--enforce-eager"),
            "engine.extra_flags",
            "list of strings",
        ),
        (lambda d: d.update(model=[]), "model", "at least one"),
        (lambda d: d["model"][0].pop("id"), "model[0].id", "required"),
        (lambda d: d["model"][0].update(modalities=["smell"]), "model[0].modalities", "image, audio, video"),
        (lambda d: d["model"].append(dict(d["model"][0])), "model", "once per run"),
        (lambda d: d["model"][0].update(images=129), "model[0].images", "at most 128"),
        (lambda d: d["model"][0].update(images=0), "model[0].images", "positive integer"),
        (
            lambda d: d["model"][0].update(
                images=4, extra_flags=["--hf-overrides", '{"architectures": ["Gemma4ForCausalLM"]}']
            ),
            "model[0].images",
            "multimodal architecture",
        ),
        (lambda d: d["eval"].update(run="bench"), "eval.run", "one of tasks, suite, load"),
        (lambda d: d["eval"].update(run="suite"), "eval.data", "gs:// URL"),
        (lambda d: d.update(aws={"region": "us-east-1"}), "aws", "unknown field"),
        (lambda d: d.update(valid_until_duration="2h"), "valid_until_duration", "only for target v5e"),
    ],
)
def test_mistakes_name_their_field(change, field, words):
    data = good()
    change(data)
    with pytest.raises(RunFileError) as caught:
        parse_run(data)
    assert caught.value.field == field
    assert words in str(caught.value)


def test_l4_needs_an_engine_digest_and_aws_its_table():
    data = tomllib.loads((ROOT / "deploy" / "runs" / "l4-gcp.toml").read_text())
    data.pop("engine_image")
    with pytest.raises(RunFileError, match="^engine_image: required"):
        parse_run(data)
    data = tomllib.loads((ROOT / "deploy" / "runs" / "l4-aws.toml").read_text())
    data["aws"].pop("instance_profile")
    with pytest.raises(RunFileError, match=r"^aws\.instance_profile: required"):
        parse_run(data)


def test_bad_toml_names_the_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("target = \n")
    with pytest.raises(RunFileError, match="not valid TOML"):
        load_run(path)


def test_durations():
    assert duration_seconds("1d2h3m4s") == 93784 and duration_seconds("90m") == 5400
    for bad in ("", "4", "h4", "4 h"):
        with pytest.raises(ValueError):
            duration_seconds(bad)


def test_generation_arms_reach_the_engine_and_the_script():
    from deploy.startup import serve_flags, settings

    run = load_run(ROOT / "deploy" / "runs" / "v6e-gen.toml")
    assert run.generate.gen == ("gsm8k", "bfcl_simple") and run.generate.throughput
    assert serve_flags(run, run.models[0])[-3:] == [
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "gemma4",
    ]
    values = settings(run)
    assert values["GEN_TASKS"] == ["gsm8k", "bfcl_simple"] and values["GEN_ARGS"] == ["--max-tokens", "2048"]
    assert values["GEN_THROUGHPUT"] == "1"
    assert "--enable-auto-tool-choice" not in serve_flags(
        load_run(ROOT / "deploy" / "runs" / "v6e.toml"), run.models[0]
    )


@pytest.mark.parametrize(
    ("generate", "field", "words"),
    [
        ({"gen": ["mmlu"]}, "generate.gen", "each one of gsm8k, bfcl_simple"),
        ({"gen": []}, "generate.gen", "at least one"),
        ({"gen": ["bfcl_simple"]}, "generate.tool_call_parser", "needs vLLM's tool-call parser"),
        ({"gen": ["gsm8k"], "limit": 0}, "generate.limit", "positive"),
        ({"gen": ["gsm8k"], "throughput": "yes"}, "generate.throughput", "true or false"),
        ({"gen": ["gsm8k"], "temperature": 0.7}, "generate.temperature", ""),
    ],
)
def test_generation_arm_mistakes_are_named(generate, field, words):
    data = good() | {"generate": generate}
    with pytest.raises(RunFileError) as error:
        parse_run(data)
    assert error.value.field == field and words in str(error.value)
