"""The suite's own shape: test modules share helpers through plain modules, never by importing each other.

A test module (``test_*.py``) or a conftest imported by another module is imported twice under two
names and ties two files' edits together; shared helpers live in plain modules (``tests/tools.py``,
``tests/calibration/stores.py``, …) and fixtures are used by name.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def is_test_module(dotted: str) -> bool:
    last = dotted.rsplit(".", 1)[-1]
    return dotted.startswith("tests.") and (last.startswith("test_") or last == "conftest")


def imports_of_test_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of a test module or conftest in ``path``, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # ``from tests.calibration import test_store`` names the module in the alias
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.ImportFrom):  # relative: ``from .conftest import ROOT``
            within = f"tests.{'.' * node.level}"
            names = [within + node.module] if node.module else [within + alias.name for alias in node.names]
        else:
            continue
        found += [(node.lineno, name) for name in names if is_test_module(name)]
    return found


def test_no_test_module_imports_another():
    problems = [
        f"{path.relative_to(TESTS.parent)}:{line}: imports {module}"
        for path in sorted(TESTS.rglob("*.py"))
        for line, module in imports_of_test_modules(path)
    ]
    assert problems == []


def test_a_planted_import_of_a_test_module_is_found(tmp_path):
    planted = tmp_path / "test_planted.py"
    planted.write_text(
        "from tests.service.test_metrics import samples\n"
        "def helper():\n    from tests.calibration import test_store\n"
        "from tests.tools import require_tool\n"
        "from tests.eval.conftest import copy_run\n"
        "from .conftest import ROOT\n"
    )
    assert sorted(imports_of_test_modules(planted)) == [
        (1, "tests.service.test_metrics"),
        (3, "tests.calibration.test_store"),
        (5, "tests.eval.conftest"),
        (6, "tests..conftest"),
    ]
