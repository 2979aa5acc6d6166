"""The qwen2 text_config patch against tpu-inference 0.32.0's own source, downloaded from PyPI.

Each case runs ``qwen2_harness.py`` in a fresh interpreter: the wheel's ``qwen2.py`` builds ``Qwen2ForCausalLM``
on a real ``transformers`` config, with the plugin installed from ``patches/`` and called through its entry
point, as vLLM calls it. The wheel and the plugin's install come from ``conftest.py``.
"""

from __future__ import annotations

import textwrap
from importlib.metadata import distributions
from pathlib import Path

import pytest

from tests.patches.harness import run_harness

pytestmark = pytest.mark.integration  # pip downloads the wheel and installs the plugin; a harness process

HARNESS = Path(__file__).with_name("qwen2_harness.py")
QWEN2 = "tpu_inference/models/jax/qwen2.py"
EAGER_DEFAULT = """\
            hidden_size = getattr(
                model_config.hf_config, 'hidden_size',
                model_config.hf_config.text_config.hidden_size)
"""
HIDDEN_SIZE = 96  # the harness's Qwen2Config


@pytest.fixture(scope="session")
def fixed_tree(upstream_tree, tmp_path_factory) -> Path:
    """0.32.0 with the eager default replaced the way upstream's proposed fix does it."""
    tree = tmp_path_factory.mktemp("tpu-inference-fixed")
    source = (upstream_tree / QWEN2).read_text()
    assert source.count(EAGER_DEFAULT) == 1
    fixed = source.replace(
        EAGER_DEFAULT,
        textwrap.indent(
            "lang_config = getattr(model_config.hf_config, 'text_config', model_config.hf_config)\n"
            "hidden_size = lang_config.hidden_size\n",
            " " * 12,
        ),
    )
    (tree / QWEN2).parent.mkdir(parents=True)
    (tree / QWEN2).write_text(fixed)
    return tree


def harness(site: Path, *args: str | Path) -> dict:
    return run_harness(HARNESS, site, *args)


def messages(result: dict, logger: str = "vllm.opendecide_tpu_patches") -> list[tuple[str, str]]:
    return [(level, message) for name, level, message in result["log"] if name == logger]


def test_unpatched_upstream_fails_on_untied_qwen2_config(plugin_site, upstream_tree):
    result = harness(plugin_site, "--tree", upstream_tree, "--config", "untied")

    error = result["error"]
    assert error["type"] == "AttributeError"
    assert error["message"] == "'Qwen2Config' object has no attribute 'text_config'"
    assert Path(error["file"]) == upstream_tree / QWEN2
    assert (error["function"], error["line"]) == ("__init__", 401) and "text_config.hidden_size" in error[
        "code"
    ]
    assert result["lm_head"] is None
    assert result["log"] == []


def test_unpatched_upstream_loads_tied_qwen2_config(plugin_site, upstream_tree):
    """Tied embeddings skip the lm_head branch: the bug only hits checkpoints with their own lm_head."""
    result = harness(plugin_site, "--tree", upstream_tree, "--config", "tied")

    assert result["error"] is None
    assert result["lm_head"] is None
    assert result["embed"]["features"] == HIDDEN_SIZE


@pytest.mark.parametrize("order", ["plugin-first", "import-first"])
def test_plugin_fixes_untied_qwen2_config(plugin_site, upstream_tree, order):
    flags = ["--import-first"] if order == "import-first" else []
    result = harness(
        plugin_site, "--tree", upstream_tree, "--config", "untied", "--plugin-calls", "2", *flags
    )

    assert result["error"] is None
    assert result["lm_head"]["hidden_size"] == HIDDEN_SIZE
    assert result["lm_head"]["vocab_size"] == 151936
    patched = [m for level, m in messages(result) if level == "INFO" and ": patched: " in m]
    assert len(patched) == 1, result["log"]  # two plugin calls, one patch
    assert f"{upstream_tree / QWEN2}:399" in patched[0]
    assert "tpu_inference.models.jax.qwen2" not in result["pending"]  # its import ran the patch once


def test_patched_code_still_reads_nested_text_config(plugin_site, upstream_tree):
    """A config with language attributes only under ``text_config`` takes the fallback, as upstream meant."""
    result = harness(plugin_site, "--tree", upstream_tree, "--config", "vl", "--plugin-calls", "1")

    assert any(": patched: " in m for _, m in messages(result))
    assert result["error"] is None
    assert result["lm_head"]["hidden_size"] == HIDDEN_SIZE


def test_plugin_is_a_logged_noop_when_upstream_is_fixed(plugin_site, fixed_tree):
    result = harness(plugin_site, "--tree", fixed_tree, "--config", "untied", "--plugin-calls", "1")

    assert result["error"] is None
    assert result["lm_head"]["hidden_size"] == HIDDEN_SIZE
    expected = (
        "opendecide_tpu_patches.qwen2_text_config: already fixed upstream: Qwen2ForCausalLM.__init__ "
        "has no eager text_config default; delete opendecide_tpu_patches.qwen2_text_config"
    )
    assert [m for level, m in messages(result) if level == "INFO"] == [expected]


def test_plugin_is_a_logged_noop_without_tpu_inference(plugin_site):
    result = harness(plugin_site, "--plugin-calls", "1")

    assert messages(result) == [("INFO", "tpu_inference is not installed: no patch applies in this process")]
    assert "_RunAfterImport" not in result["meta_path"]


def test_entry_point_metadata(plugin_site):
    (dist,) = [
        d for d in distributions(path=[str(plugin_site)]) if d.metadata["Name"] == "opendecide-tpu-patches"
    ]
    (ep,) = [ep for ep in dist.entry_points if ep.group == "vllm.general_plugins"]

    assert (ep.name, ep.value) == ("opendecide_tpu_patches", "opendecide_tpu_patches:apply_all")
    assert dist.requires is None  # nothing to install beside it in the TPU image
