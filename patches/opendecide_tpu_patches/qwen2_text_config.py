# Workaround for tpu-inference's Qwen2ForCausalLM.__init__ reading `hf_config.text_config.hidden_size` as the
# *default* of a getattr, which Python evaluates first, so every Qwen2 checkpoint with untied embeddings
# (tie_word_embeddings=false, e.g. Qwen2.5-7B and larger) fails to load with
# "'Qwen2Config' object has no attribute 'text_config'". Introduced by vllm-project/tpu-inference#2308
# (commit 180cf576, 2026-04-19); still present in tpu-inference 0.32.0 (PyPI) and on main at b8692ff0 (2026-08-22):
# https://github.com/vllm-project/tpu-inference/blob/b8692ff01fa191343836996c27a39dc95f008b88/tpu_inference/models/jax/qwen2.py#L399-L401
# Proposed fix: https://github.com/vllm-project/tpu-inference/pull/3098 (open, 2026-07-07).
# Delete this module once the pinned tpu-inference has the fix: the plugin then logs "already fixed upstream".
"""Make the eager ``text_config`` default in ``Qwen2ForCausalLM.__init__`` lazy, keeping the rest of the method.

The method's own source is rewritten in memory: every ``getattr(cfg, "a", cfg.text_config.a)`` becomes
``cfg.a if hasattr(cfg, "a") else cfg.text_config.a`` (the meaning upstream intended), compiled against the
module's globals with the original file and line numbers, and set on the class. The class itself changes, so
tpu_inference's model registry, which re-imports the class on every lookup, gets the fixed one. Without any
such call in the method the upstream code is taken as fixed and nothing changes.
"""

from __future__ import annotations

import ast
import copy
import inspect
import textwrap
from types import ModuleType

from ._patching import Outcome, Result

MODULE = "tpu_inference.models.jax.qwen2"
CLASS = "Qwen2ForCausalLM"
_MARK = "_opendecide_qwen2_text_config"


class _LazyTextConfigDefault(ast.NodeTransformer):
    """Rewrites ``getattr(X, "a", X.text_config.a)`` into ``X.a if hasattr(X, "a") else X.text_config.a``."""

    def __init__(self) -> None:
        self.lines: list[int] = []

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if not (
            isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) == 3
            and not node.keywords
        ):
            return node
        obj, name, default = node.args
        if not (
            isinstance(name, ast.Constant)
            and isinstance(name.value, str)
            and isinstance(default, ast.Attribute)
            and default.attr == name.value
            and isinstance(default.value, ast.Attribute)
            and default.value.attr == "text_config"
            and ast.dump(default.value.value) == ast.dump(obj)
        ):
            return node
        self.lines.append(node.lineno)
        lazy = ast.IfExp(
            test=ast.Call(func=ast.Name("hasattr", ast.Load()), args=[copy.deepcopy(obj), name], keywords=[]),
            body=ast.Attribute(copy.deepcopy(obj), name.value, ast.Load()),
            orelse=default,
        )
        return ast.copy_location(lazy, node)


def apply(module: ModuleType) -> Result:
    """Replace ``Qwen2ForCausalLM.__init__`` in ``module`` with its lazy-default version, if it needs it."""
    cls = getattr(module, CLASS, None)
    init = getattr(cls, "__init__", None)
    if not inspect.isfunction(init):
        return Result(Outcome.UNRECOGNISED, f"{module.__name__} has no {CLASS}.__init__ function")
    if getattr(init, _MARK, False):
        return Result(Outcome.ALREADY_PATCHED, f"{CLASS}.__init__")
    try:
        lines, first_line = inspect.getsourcelines(init)
        filename = inspect.getsourcefile(init)
    except (OSError, TypeError) as e:
        return Result(Outcome.UNRECOGNISED, f"no source for {CLASS}.__init__ ({e})")
    tree = ast.parse(textwrap.dedent("".join(lines)))
    func = tree.body[0]
    # A recompiled function gets no closure cells (zero-argument super()) and re-runs its decorators: refuse both.
    if not isinstance(func, ast.FunctionDef) or func.decorator_list or init.__code__.co_freevars:
        return Result(Outcome.UNRECOGNISED, f"{CLASS}.__init__ is decorated or a closure")
    rewrite = _LazyTextConfigDefault()
    tree = rewrite.visit(tree)
    if not rewrite.lines:
        return Result(
            Outcome.ALREADY_FIXED, f"{CLASS}.__init__ has no eager text_config default; delete {__name__}"
        )
    ast.fix_missing_locations(tree)
    ast.increment_lineno(tree, first_line - 1)
    namespace: dict = {}
    exec(compile(tree, filename or "<unknown>", "exec"), module.__dict__, namespace)
    fixed = namespace[func.name]
    fixed.__qualname__ = init.__qualname__
    fixed.__doc__ = init.__doc__
    fixed.__defaults__ = init.__defaults__
    fixed.__kwdefaults__ = init.__kwdefaults__
    setattr(fixed, _MARK, True)
    cls.__init__ = fixed
    where = ", ".join(f"{filename}:{line + first_line - 1}" for line in rewrite.lines)
    return Result(
        Outcome.PATCHED, f"{CLASS}.__init__ reads text_config only when the attribute is missing ({where})"
    )
