"""What every patch shares: its outcome, the logger, and running a patch when its target module is imported."""

from __future__ import annotations

import enum
import importlib.abc
import inspect
import logging
import sys
from collections.abc import Callable
from types import ModuleType
from typing import NamedTuple

# Under "vllm." so that vLLM's own logging configuration prints these lines in the engine log
# (tpu_inference names its loggers the same way).
logger = logging.getLogger("vllm.opendecide_tpu_patches")


class Outcome(enum.Enum):
    PATCHED = "patched"
    ALREADY_PATCHED = "already patched in this process"
    ALREADY_FIXED = "already fixed upstream"
    UNRECOGNISED = "not applied: target code not recognised"


class Result(NamedTuple):
    outcome: Outcome
    detail: str


Patch = Callable[[ModuleType], Result]


class _RunAfterImport(importlib.abc.MetaPathFinder):
    """A finder that lets the other finders locate a watched module, then runs patches once its body has run.

    Patching on import instead of importing the target at plugin load keeps the plugin cheap in processes that
    never load a model and keeps JAX uninitialised until tpu_inference itself imports it (tpu_inference's
    model loader imports model modules lazily for that reason).
    """

    def __init__(self) -> None:
        self.pending: dict[str, dict[Patch, None]] = {}  # module name -> patches, in order, without repeats

    def find_spec(self, fullname, path, target=None):
        patches = self.pending.get(fullname)
        if patches is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            logger.warning("cannot patch %s: its loader %r has no exec_module", fullname, spec.loader)
            return spec
        del self.pending[fullname]
        if not self.pending:
            sys.meta_path.remove(self)
        spec.loader = _ThenPatch(spec.loader, list(patches))
        return spec


class _ThenPatch(importlib.abc.Loader):
    def __init__(self, loader, patches: list[Patch]) -> None:
        self.loader = loader
        self.patches = patches

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # The module keeps its real loader (source lookups, reloads); only this one import runs the patches.
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        for patch in self.patches:
            run(patch, module)


_finder = _RunAfterImport()


def when_imported(module_name: str, patch: Patch) -> None:
    """Run ``patch`` on ``module_name`` now if it is imported, else right after its import; once per patch."""
    module = sys.modules.get(module_name)
    if module is not None:
        run(patch, module)
        return
    _finder.pending.setdefault(module_name, {})[patch] = None
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    logger.debug("%s will patch %s when it is imported", patch.__module__, module_name)


def run(patch: Patch, module: ModuleType) -> Result:
    """Apply one patch and log what it did; a failing patch is logged and leaves the module as it was."""
    name = patch.__module__
    try:
        result = patch(module)
    except Exception:
        logger.exception("%s failed on %s; the module is left unpatched", name, module.__name__)
        return Result(Outcome.UNRECOGNISED, "the patch raised")
    level = {
        Outcome.PATCHED: logging.INFO,
        Outcome.ALREADY_PATCHED: logging.DEBUG,
        Outcome.ALREADY_FIXED: logging.INFO,
        Outcome.UNRECOGNISED: logging.WARNING,
    }[result.outcome]
    logger.log(level, "%s: %s: %s", name, result.outcome.value, result.detail)
    return result


def is_marked(func, mark: str) -> bool:
    """Whether ``func``, or a function it wraps through ``__wrapped__``, carries ``mark``.

    Two patches wrap ``CompressedTensorsConfig.get_quant_method``; each must still see its own wrapper under
    the other's, so that a second plugin call changes nothing.
    """
    while func is not None:
        if getattr(func, mark, False):
            return True
        func = getattr(func, "__wrapped__", None)
    return False


def upstream_method(cls, name: str, mark: str) -> tuple[Callable, str] | Result:
    """``cls``'s own method ``name`` and the source of upstream's code under it, or the Result that ends the patch.

    The source is read through any other patch's wrapper (``__wrapped__``): whether upstream has a feature is
    a question about upstream's code.
    """
    original = vars(cls).get(name) if isinstance(cls, type) else None
    if not inspect.isfunction(original):
        return Result(Outcome.UNRECOGNISED, f"{getattr(cls, '__name__', cls)} has no method {name}")
    if is_marked(original, mark):
        return Result(Outcome.ALREADY_PATCHED, f"{cls.__name__}.{name}")
    try:
        return original, inspect.getsource(inspect.unwrap(original))
    except (OSError, TypeError) as e:
        return Result(Outcome.UNRECOGNISED, f"no source for {cls.__name__}.{name} ({e})")


def replace_method(cls, name: str, new: Callable, original: Callable, mark: str) -> None:
    """Set ``new`` as ``cls.name``, looking like ``original`` and marked, so a later plugin call sees the patch."""
    new.__qualname__ = original.__qualname__
    new.__doc__ = original.__doc__
    new.__wrapped__ = original
    setattr(new, mark, True)
    setattr(cls, name, new)
