"""Build tpu-inference's real ``Qwen2ForCausalLM`` from an unpacked wheel on a real ``transformers`` config.

Run as a script in a fresh interpreter (``python qwen2_harness.py --tree DIR …``); prints one JSON object.

``tpu_inference/models/jax/qwen2.py`` is loaded from ``DIR`` and its module body, ``Qwen2Model.__init__`` and
``Qwen2ForCausalLM.__init__`` run as shipped. Everything it imports from jax, flax, vllm and the rest of
tpu_inference (whose package ``__init__`` loads XLA) is a stand-in: a class that records its keyword arguments
when called, so the layer sizes the model asks for can be read back. ``make_layers`` returns no decoder layers
(they never read ``text_config``) and ``get_pp_group`` answers a single pipeline stage.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import sys
import traceback
import types
from importlib.metadata import entry_points
from pathlib import Path

from stand_ins import StandIns  # beside this script, which runs with its own folder on sys.path

REAL_MODULE = "tpu_inference.models.jax.qwen2"
STUBBED_ROOTS = ("jax", "flax", "vllm", "tpu_inference")
ENTRY_POINT = "opendecide_tpu_patches"
_OVERRIDES = {
    "tpu_inference.layers.jax.pp_utils.make_layers": lambda n, factory: (0, n, []),
    "tpu_inference.distributed.jax_parallel_state.get_pp_group": lambda: types.SimpleNamespace(
        is_first_rank=True, is_last_rank=True
    ),
    "tpu_inference.logger.init_logger": logging.getLogger,
}
STAND_INS = StandIns(_OVERRIDES)


class WheelTreeFinder(importlib.abc.MetaPathFinder):
    """``REAL_MODULE`` from the unpacked wheel; every other module under ``STUBBED_ROOTS`` a stand-in."""

    def __init__(self, tree: Path) -> None:
        self.tree = tree

    def find_spec(self, fullname, path, target=None):
        if fullname == REAL_MODULE:
            return importlib.util.spec_from_file_location(
                fullname, self.tree / (fullname.replace(".", "/") + ".py")
            )
        if fullname.split(".")[0] in STUBBED_ROOTS:
            return STAND_INS.spec(fullname)
        return None


def make_config(kind: str):
    from transformers import Qwen2_5_VLConfig, Qwen2Config

    sizes = {
        "hidden_size": 96,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    if kind == "untied":
        return Qwen2Config(tie_word_embeddings=False, **sizes)
    if kind == "tied":
        return Qwen2Config(tie_word_embeddings=True, **sizes)
    if kind == "vl":  # language attributes only under text_config (transformers 5)
        return Qwen2_5_VLConfig(text_config=sizes, tie_word_embeddings=False)
    raise SystemExit(f"--config: unknown kind {kind!r}")


def load_plugin_entry_point() -> None:
    """Call the plugin the way vLLM's ``load_general_plugins`` does: every entry point of the group, loaded and called."""
    (ep,) = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == ENTRY_POINT]
    ep.load()()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", type=Path, help="unpacked tpu-inference wheel; omit for 'not installed'")
    parser.add_argument("--plugin-calls", type=int, default=0, help="how many times to call the entry point")
    parser.add_argument("--import-first", action="store_true", help="import qwen2 before calling the plugin")
    parser.add_argument("--config", default="untied", help="untied | tied | vl")
    args = parser.parse_args()

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    logging.getLogger("vllm").addHandler(handler)
    logging.getLogger("vllm").setLevel(logging.DEBUG)

    out: dict = {"error": None, "lm_head": None, "embed": None}
    if args.tree is not None:
        sys.meta_path.insert(0, WheelTreeFinder(args.tree))
    if args.import_first:
        import importlib

        importlib.import_module(REAL_MODULE)
    for _ in range(args.plugin_calls):
        load_plugin_entry_point()
    if args.tree is not None:
        import importlib

        qwen2 = importlib.import_module(REAL_MODULE)
        out["module_file"] = qwen2.__file__
        config = make_config(args.config)
        lang = getattr(config, "text_config", config)
        model_config = types.SimpleNamespace(
            hf_config=config, dtype="bfloat16", get_vocab_size=lambda: lang.vocab_size
        )
        vllm_config = types.SimpleNamespace(
            model_config=model_config,
            quant_config=None,
            cache_config=types.SimpleNamespace(cache_dtype="auto"),
        )
        try:
            qwen2.Qwen2ForCausalLM(vllm_config, rng_key=0, mesh=None)
        except Exception as e:
            # The innermost frame in qwen2.py itself: that is where upstream's code fails (not in transformers).
            frame = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == qwen2.__file__][-1]
            out["error"] = {
                "type": type(e).__name__,
                "message": str(e),
                "file": frame.filename,
                "line": frame.lineno,
                "function": frame.name,
                "code": frame.line,
            }
        out["lm_head"] = next((kw for name, kw in STAND_INS.calls if name.endswith(".JaxLmHead")), None)
        out["embed"] = next((kw for name, kw in STAND_INS.calls if name.endswith(".JaxEmbed")), None)
    out["meta_path"] = [type(f).__name__ for f in sys.meta_path]
    # Modules the plugin still waits for (the other patches' targets, which this harness never imports).
    from opendecide_tpu_patches import _patching

    out["pending"] = sorted(_patching._finder.pending)
    out["log"] = [(r.name, r.levelname, r.getMessage()) for r in records]
    print(json.dumps(out, default=repr))


if __name__ == "__main__":
    main()
