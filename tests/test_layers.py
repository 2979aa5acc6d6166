"""Layers import in one direction only: a walk over every import statement (ast, not grep).

readers/  calibration/  patches/    nothing else of the project
service/                            readers, calibration
eval/                               service and below
deploy/                             everything below
opendecide/                         the ``decide`` entry point: everything
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BELOW = {
    "readers": set(),
    "calibration": set(),
    "patches": set(),
    "service": {"readers", "calibration"},
    "eval": {"service", "readers", "calibration"},
    "deploy": {"eval", "service", "readers", "calibration"},
    "opendecide": {"deploy", "eval", "service", "readers", "calibration"},
}


def imported_packages(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import, at any depth (imports inside functions count)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def upward_imports(root: Path) -> list[str]:
    """``path:line: layer imports other`` for every import a layer may not make."""
    problems = []
    for layer, allowed in BELOW.items():
        for path in sorted((root / layer).rglob("*.py")):
            for line, package in imported_packages(ast.parse(path.read_text(), str(path))):
                if package in BELOW and package != layer and package not in allowed:
                    problems.append(f"{path.relative_to(root)}:{line}: {layer} imports {package}")
    return problems


def test_no_layer_imports_upward():
    assert upward_imports(ROOT) == []


def test_a_planted_upward_import_is_named_with_file_and_line(tmp_path):
    (tmp_path / "readers").mkdir()
    (tmp_path / "readers" / "reader.py").write_text(
        "import json\n\n\ndef f():\n    from service.app import create_app\n"
    )
    (tmp_path / "service").mkdir()
    (tmp_path / "service" / "app.py").write_text("from readers.reader import Reader\nimport eval.runner\n")
    assert upward_imports(tmp_path) == [
        "readers/reader.py:5: readers imports service",
        "service/app.py:2: service imports eval",
    ]
