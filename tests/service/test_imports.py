"""Import rules inside service/ and its tests that the layering test does not cover.

A route module imports no other route module: what routes share is a module of its own
(``service/decision_route.py``, ``service/state.py``), so a third wire format can use it without
reaching into another format's route. A test module here imports no other test module: shared helpers
are plain functions in ``tests/service/support.py``, fixtures are in ``conftest.py``, used by injection.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, those inside functions included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def test_no_route_module_imports_another():
    routes = {
        f"service.routes.{p.stem}" for p in (ROOT / "service/routes").glob("*.py") if p.stem != "__init__"
    }
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted((ROOT / "service/routes").glob("*.py"))
        for line, module in imported(path)
        if module in routes
    ]
    assert wrong == []


def test_no_service_test_module_imports_another():
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted((ROOT / "tests/service").glob("*.py"))
        for line, module in imported(path)
        if module.startswith("tests.service.") and module.split(".")[2].startswith(("test_", "conftest"))
    ]
    assert wrong == []
