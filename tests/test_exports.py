"""Every ``__all__`` in the project is sorted and lists only names its module has.

Which modules: every ``.py`` file under service/, readers/, calibration/, eval/, deploy/, opendecide/ and
patches/ (the TPU patch package, its own distribution, imported under its own name from its file here so
that this checkout's copy is the one read). Each file is parsed, and none is skipped: a module whose syntax
tree assigns ``__all__`` is imported and checked. The others are known not to define one from the tree alone;
importing all of them would load torch, transformers and the cloud SDKs for nothing (about a minute on two
cores), and ``opendecide/__main__.py`` runs the CLI when imported.

Sorted means ruff's RUF022 order (isort-style: SCREAMING_SNAKE_CASE names, then CamelCase, then the rest,
each group in natural order), so this test and ``make lint`` never disagree; ruff cannot tell whether a
listed name exists, and this test can.

Which packages define ``__all__``: a package whose ``__init__`` imports from its own modules offers names
at the package level (``readers.engines``, ``service.protocol``, the patch package), and its ``__all__`` is
the statement of which of them are its interface, as opposed to helpers it imported for its own use: it must
define one. A package whose ``__init__`` is empty or a docstring (``service``, ``eval``, ``opendecide``, …)
offers nothing by itself; ``__all__ = []`` there would say nothing, so none is required.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("service", "readers", "calibration", "eval", "deploy", "opendecide")
PATCHES = ROOT / "patches"


def sort_key(name: str) -> tuple[int, list[int | str]]:
    """RUF022's isort-style key: SCREAMING_SNAKE_CASE first, then CamelCase, then anything else; within
    each, natural order (digit runs compare as numbers)."""
    group = 0 if name.isupper() else 1 if name[:1].isupper() else 2
    return group, [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def export_problems(module: types.ModuleType) -> list[str]:
    """What is wrong with ``module.__all__`` (nothing when the module defines none)."""
    if not hasattr(module, "__all__"):
        return []
    exported = module.__all__
    if not isinstance(exported, list | tuple) or not all(isinstance(name, str) for name in exported):
        return [f"{module.__name__}.__all__ is not a list of names: {exported!r}"]
    problems = []
    if len(set(exported)) < len(exported):
        problems.append(f"{module.__name__}.__all__ lists a name twice")
    if list(exported) != sorted(exported, key=sort_key):
        problems.append(f"{module.__name__}.__all__ is not sorted; sorted: {sorted(exported, key=sort_key)}")
    missing = [name for name in exported if not hasattr(module, name)]
    if missing:
        problems.append(f"{module.__name__}.__all__ names what it does not have: {missing}")
    return problems


def package_problems(module: types.ModuleType, tree: ast.Module) -> list[str]:
    """A package ``__init__`` that imports from its own modules states what it offers in ``__all__``."""
    if own_imports(tree, module.__name__) and not hasattr(module, "__all__"):
        return [f"{module.__name__} imports from its own modules but defines no __all__"]
    return []


def own_imports(tree: ast.Module, package: str) -> bool:
    """Whether a package ``__init__`` imports from the package's own modules (relatively or by name)."""
    return any(
        isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith(f"{package}."))
        for node in tree.body
    )


def assigns_all(tree: ast.Module) -> bool:
    """Whether a module's top level assigns ``__all__`` (plainly, annotated or augmented)."""
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign | ast.AugAssign)
            else []
        )
        if any(isinstance(target, ast.Name) and target.id == "__all__" for target in targets):
            return True
    return False


def project_modules() -> list[tuple[str, Path, Path]]:
    """(import name, file, the directory the name is relative to) for every module the test covers."""
    found = []
    for root, files in [(ROOT, [p for top in PACKAGES for p in (ROOT / top).rglob("*.py")]),
                        (PATCHES, list(PATCHES.rglob("*.py")))]:  # fmt: skip
        for path in sorted(files):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found.append((name, path, root))
    return found


def load(name: str, path: Path, root: Path) -> types.ModuleType:
    """Import ``name``; the patch package from its file here, whatever else is installed under its name."""
    if root == PATCHES:
        package = name.split(".")[0]
        if package not in sys.modules or not Path(sys.modules[package].__file__).is_relative_to(PATCHES):
            init = PATCHES / package / "__init__.py"
            spec = importlib.util.spec_from_file_location(
                package, init, submodule_search_locations=[str(init.parent)]
            )
            sys.modules[package] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(sys.modules[package])
    module = importlib.import_module(name)
    assert Path(module.__file__).resolve() == path.resolve(), (
        f"{name} imported from {module.__file__}, not {path}"
    )
    return module


MODULES = project_modules()
TREES = {name: ast.parse(path.read_text()) for name, path, _ in MODULES}


def test_the_walk_covers_every_layer_and_the_patch_package():
    names = {name for name, _, _ in MODULES}
    assert {*PACKAGES, "opendecide_tpu_patches", "readers.engines.routing", "eval.suite.score"} <= names
    assert len(names) == len(MODULES)  # one import name per file
    # A module that mentions __all__ assigns it where the syntax tree sees it, so none is passed over.
    assert [
        name for name, path, _ in MODULES if "__all__" in path.read_text() and not assigns_all(TREES[name])
    ] == []


@pytest.mark.parametrize(
    "name, path, root", [pytest.param(*m, id=m[0]) for m in MODULES if assigns_all(TREES[m[0]])]
)
def test_every_all_is_sorted_and_names_what_its_module_has(name, path, root):
    assert export_problems(load(name, path, root)) == []


@pytest.mark.parametrize(
    "name, path, root",
    [
        pytest.param(*m, id=m[0])
        for m in MODULES
        if m[1].name == "__init__.py" and own_imports(TREES[m[0]], m[0])
    ],
)
def test_a_package_that_re_exports_names_defines_all(name, path, root):
    assert package_problems(load(name, path, root), TREES[name]) == []


# -- the checker itself, on synthetic modules ------------------------------------------------


def synthetic(exported: list[str], **names: object) -> types.ModuleType:
    module = types.ModuleType("synthetic")
    module.__dict__.update(names, __all__=exported)
    return module


def test_the_checker_passes_a_good_all_in_ruffs_order():
    module = synthetic(["LIMIT_2", "LIMIT_10", "Engine", "open_engine"], LIMIT_2=2, LIMIT_10=10, Engine=object,
                       open_engine=len)  # fmt: skip
    assert export_problems(module) == []
    assert export_problems(types.ModuleType("no_all")) == []


def test_the_checker_catches_an_unsorted_all_a_missing_name_and_a_repeat():
    unsorted = synthetic(["open_engine", "Engine"], Engine=object, open_engine=len)
    (problem,) = export_problems(unsorted)
    assert "not sorted" in problem and "['Engine', 'open_engine']" in problem
    (problem,) = export_problems(synthetic(["Engine", "gone"], Engine=object))
    assert "does not have: ['gone']" in problem
    (problem,) = export_problems(synthetic(["Engine", "Engine"], Engine=object))
    assert "twice" in problem
    (problem,) = export_problems(synthetic("Engine", Engine=object))  # a string, not a list of names
    assert "not a list of names" in problem


def test_the_package_rule_catches_a_re_exporting_init_without_all():
    tree = ast.parse("from pkg.base import Engine\n")
    bare = types.ModuleType("pkg")
    (problem,) = package_problems(bare, tree)
    assert "pkg imports from its own modules but defines no __all__" == problem
    assert package_problems(synthetic(["Engine"], Engine=object), ast.parse("from . import base\n")) == []
    assert package_problems(bare, ast.parse("from os import path\n")) == []  # nothing of its own
    assert assigns_all(ast.parse("__all__ = []")) and assigns_all(ast.parse("__all__ += ['x']"))
    assert not assigns_all(ast.parse("def f():\n    __all__ = []\n"))
