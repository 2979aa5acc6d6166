"""Stand-in modules for the harnesses: modules whose every attribute is an inert placeholder class.

A placeholder class accepts any arguments, records the keyword arguments of each construction in ``calls``
(so a harness can read back the layer sizes a model asked for), can be subscripted (``Float[Array, "…"]``) and,
given one callable and nothing else, returns it: module bodies use such names as decorators
(``@register_model_loader("…")``, ``@jax.jit``). ``overrides`` replaces a dotted name with a real value.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import types


class _PartMeta(type):
    """One metaclass for every placeholder, so a class may derive from several (``class X(nnx.Module, Base)``)."""

    def __getattr__(cls, attr):
        if attr.startswith("__"):  # typing and copy probe dunders; those must stay missing
            raise AttributeError(attr)
        return cls._stand_ins.part(f"{cls._stub_name}.{attr}")

    def __getitem__(cls, item):
        return cls

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return super().__call__(*args, **kwargs)


class StandIns:
    def __init__(self, overrides: dict[str, object]) -> None:
        self.overrides = overrides
        self.calls: list[tuple[str, dict]] = []  # (placeholder name, keyword arguments), in call order
        self._parts: dict[str, type] = {}

    def part(self, name: str) -> type:
        if name not in self._parts:
            stand_ins = self

            def __init__(self, *args, **kwargs):
                stand_ins.calls.append((name, kwargs))

            def __call__(self, *args, **kwargs):  # an instance used as a decorator
                return args[0] if len(args) == 1 and callable(args[0]) else None

            namespace = {"_stub_name": name, "_stand_ins": self, "__init__": __init__, "__call__": __call__}
            self._parts[name] = _PartMeta(name.rsplit(".", 1)[-1], (), namespace)
        return self._parts[name]

    def spec(self, fullname: str) -> importlib.machinery.ModuleSpec:
        """A spec whose module is a stand-in package (its submodules resolve through the finder too)."""
        return importlib.machinery.ModuleSpec(fullname, _Loader(self), is_package=True)


class _Module(types.ModuleType):
    def __init__(self, name: str, stand_ins: StandIns) -> None:
        super().__init__(name)
        self._stand_ins = stand_ins
        self.__path__ = []

    def __getattr__(self, attr):
        if attr.startswith("__") or attr == "_stand_ins":
            raise AttributeError(attr)
        name = f"{self.__name__}.{attr}"
        value = self._stand_ins.overrides.get(name) or self._stand_ins.part(name)
        setattr(self, attr, value)
        return value


class _Loader(importlib.abc.Loader):
    def __init__(self, stand_ins: StandIns) -> None:
        self.stand_ins = stand_ins

    def create_module(self, spec):
        return _Module(spec.name, self.stand_ins)

    def exec_module(self, module):
        pass
