"""The qwen2 patch on small modules of its own: what it rewrites, and what it refuses to touch."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def patch(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "patches"))
    from opendecide_tpu_patches import Outcome, qwen2_text_config

    return SimpleNamespace(apply=qwen2_text_config.apply, Outcome=Outcome)


@pytest.fixture
def load(tmp_path):
    """Import a module from source written to a file, so the patch can read it back."""

    def load(source: str):
        path = tmp_path / f"m{len(list(tmp_path.iterdir()))}.py"
        path.write_text(textwrap.dedent(source))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


def config(**attrs):
    return SimpleNamespace(**attrs)


def test_rewrites_each_eager_default_on_the_same_object(patch, load):
    module = load("""
        class Qwen2ForCausalLM:
            def __init__(self, cfg, other):
                self.a = getattr(cfg.hf, 'a', cfg.hf.text_config.a)
                self.b = getattr(cfg.hf, "b", cfg.hf.text_config.b)
                self.c = getattr(other, 'c', cfg.hf.text_config.c)  # a different object: left as written
        """)
    with pytest.raises(AttributeError, match="text_config"):
        module.Qwen2ForCausalLM(config(hf=config(a=1, b=2)), config(c=3))

    result = patch.apply(module)

    assert result.outcome is patch.Outcome.PATCHED
    assert result.detail.endswith(f"{module.__file__}:4, {module.__file__}:5)")
    nested = config(hf=config(text_config=config(a=10, b=20, c=30)))
    model = module.Qwen2ForCausalLM(nested, config())
    assert (model.a, model.b, model.c) == (10, 20, 30)
    with pytest.raises(AttributeError, match="text_config"):  # the third call still evaluates its default
        module.Qwen2ForCausalLM(config(hf=config(a=1, b=2)), config(c=3))
    assert patch.apply(module).outcome is patch.Outcome.ALREADY_PATCHED


def test_tracebacks_keep_the_original_lines(patch, load):
    module = load("""
        class Qwen2ForCausalLM:
            def __init__(self, cfg):

                self.a = getattr(cfg, 'a', cfg.text_config.a)
                self.z = cfg.missing
        """)
    patch.apply(module)

    with pytest.raises(AttributeError) as raised:
        module.Qwen2ForCausalLM(config(a=1))
    assert raised.traceback[-1].lineno + 1 == 6  # pytest counts from 0


EAGER_LINE = "        self.a = getattr(cfg, 'a', cfg.text_config.a)\n"


@pytest.mark.parametrize(
    "source, reason",
    [
        ("class Other:\n    pass\n", "has no Qwen2ForCausalLM.__init__"),
        (
            "def same(f):\n    return f\nclass Qwen2ForCausalLM:\n    @same\n    def __init__(self, cfg):\n"
            + EAGER_LINE,
            "decorated",
        ),
        (
            "class Base:\n    pass\nclass Qwen2ForCausalLM(Base):\n    def __init__(self, cfg):\n"
            + "        super().__init__()\n"
            + EAGER_LINE,
            "a closure",
        ),
    ],
)
def test_refuses_code_it_cannot_rewrite_faithfully(patch, load, source, reason):
    module = load(source)
    before = getattr(module, "Qwen2ForCausalLM", None)
    init = before and before.__init__

    result = patch.apply(module)

    assert result.outcome is patch.Outcome.UNRECOGNISED
    assert reason in result.detail
    assert before is None or before.__init__ is init


def test_refuses_without_source(patch):
    namespace: dict = {}
    exec("class Qwen2ForCausalLM:\n    def __init__(self, cfg):\n" + EAGER_LINE, namespace)
    module = SimpleNamespace(__name__="generated", **namespace)

    result = patch.apply(module)

    assert result.outcome is patch.Outcome.UNRECOGNISED and "no source" in result.detail
