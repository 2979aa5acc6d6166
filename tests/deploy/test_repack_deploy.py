"""A run file's list of builds (``[[model]]`` arms: repacked on the machine or copied from the bucket,
what each measures, its flags) and the TPU patches plugin, as the dry run and the startup script show
them; docs/deploy.md section 5a carries the dry run's head and settings as printed. (The rendered
script is shellcheck-clean: tests/deploy/test_startup.py checks every example run file.)

Regenerate the doc block after changing the run file or the renderer:
    PYTHONPATH=$PWD python -m tests.deploy.test_repack_deploy
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deploy.launch import format_plan, plan
from deploy.runfile import RunFileError, load_run, parse_run
from deploy.startup import settings
from tests.deploy.run_files import ROOT

DOC = ROOT / "docs" / "deploy.md"
SHOWN = "deploy/runs/v5e-repack.toml"
BLOCK = re.compile(
    r"(<!-- arms-dry-run: (?P<path>\S+) -->\n```sh\n)(?P<body>.*?)(```\n<!-- end arms-dry-run -->)", re.DOTALL
)


def arms_excerpt(path: str) -> str:
    """The dry run's head (up to the first command) and the startup script's settings block."""
    text = format_plan(plan(load_run(ROOT / path), directory=Path("/tmp/opendecide-deploy")))
    head = text.split("\n# 1. ", 1)[0]
    start = text.index("# --- settings (rendered by deploy/startup.py from the run file) ---")
    end = text.index("# --- end settings ---") + len("# --- end settings ---")
    return head.rstrip("\n") + "\n# …\n" + text[start:end] + "\n"


def test_the_docs_arms_dry_run_is_as_printed():
    blocks = {m["path"]: m["body"] for m in BLOCK.finditer(DOC.read_text())}
    assert list(blocks) == [SHOWN]
    assert blocks[SHOWN] == arms_excerpt(SHOWN), (
        "regenerate: PYTHONPATH=$PWD python -m tests.deploy.test_repack_deploy"
    )


def test_arms_render_their_builds_measures_and_flags():
    run = load_run(ROOT / SHOWN)
    values = settings(run)
    assert values["MODELS"] == ["g4-12b-q4", "g4-12b-w8a8-emb4", "g4-12b-w8a8"]
    assert values["MODEL_LOAD"] == ["/builds/g4-12b-q4", "/builds/g4-12b-w8a8-emb4", "/builds/g4-12b-w8a8"]
    assert values["MODEL_PREP"] == [
        "repack q4",
        "repack w8a8 --emb4",
        "pull gs://your-bucket/opendecide-builds/g4-12b-w8a8",
    ]
    assert values["MODEL_MEASURE"] == ["read load", "read load generation", "read"]
    assert values["MODEL_SOURCES"] == ["google/gemma-4-12B-it-qat-q4_0-unquantized"] * 3
    assert values["SERVE_FLAGS_0"][values["SERVE_FLAGS_0"].index("--gpu-memory-utilization") + 1] == "0.72"
    assert "--gpu-memory-utilization" not in values["SERVE_FLAGS_2"]
    assert (
        values["ENGINE_COMMAND"][:2] == ["bash", "-c"]
        and "opendecide_tpu_patches-*.whl" in values["ENGINE_COMMAND"][2]
    )
    assert values["PATCHES"] == "gs://your-bucket/opendecide-wheels"


def test_a_plain_run_file_renders_as_before():
    values = settings(load_run(ROOT / "deploy" / "runs" / "v5e.toml"))
    assert values["MODELS"] == values["MODEL_SOURCES"] == values["MODEL_LOAD"] == ["google/gemma-4-E2B-it"]
    assert values["MODEL_PREP"] == [""] and values["MODEL_MEASURE"] == ["read"]
    assert values["ENGINE_COMMAND"] == ["vllm", "serve"] and values["PATCHES"] == ""


def _run(**model) -> dict:
    return {
        "name": "x", "target": "v5e", "project": "p", "bucket": "gs://b/r",
        "service_image": "r/s@sha256:" + "0" * 64, "model": [{"id": "google/gemma-4-E2B-it", **model}],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("model", "field", "message"),
    [
        ({"repack": "q4"}, "model[0].name", "a repacked arm needs a name"),
        ({"name": "a", "repack": "int3"}, "model[0].repack", "one of q4, w8a8, w8a8-emb4"),
        ({"name": "a", "build": "s3://b/x"}, "model[0].build", "a gs:// folder"),
        ({"name": "a", "repack": "q4", "build": "gs://b/x"}, "model[0].build", "not both"),
        ({"measure": ["speed"]}, "model[0].measure", "each one of read, load, generation"),
        ({"measure": ["read"]}, "model[0].measure", r"read needs an \[eval\] table"),
        ({"gpu_memory_utilization": 1.5}, "model[0].gpu_memory_utilization", r"in \(0, 1\]"),
    ],
)
def test_bad_arms_are_refused_naming_the_field(model, field, message):
    with pytest.raises(RunFileError, match=message) as error:
        parse_run(_run(**model))
    assert error.value.field == field


def test_patches_need_a_bucket_folder_on_tpu():
    with pytest.raises(RunFileError, match="patches: a gs:// folder"):
        parse_run({**_run(), "patches": "/local/wheels"})


if __name__ == "__main__":
    text = DOC.read_text()
    DOC.write_text(BLOCK.sub(lambda m: m.group(1) + arms_excerpt(m["path"]) + m.group(4), text))
