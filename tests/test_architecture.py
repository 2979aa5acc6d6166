"""docs/architecture.md cannot drift: every file and name it gives resolves in the tree, it holds no line
numbers, and it shows every route and every middleware the app is built with.

A reference is a backticked span: a path (``service/app.py``, ``docs/``) must exist; ``path.py:Name`` or
``path.py:Class.member`` must be defined in that file (a function, class, or assignment at module level;
a method or field in the class). ``path.py:123`` or ``name.py:12 thing`` is a line number, which goes
stale at the next edit above it, and fails.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAP = ROOT / "docs" / "architecture.md"

SPAN = re.compile(r"`([^`\n]+)`")
# a path of the tree: at least one folder or a file suffix, no spaces
PATH = re.compile(
    r"^(?P<path>[\w.-]+(?:/[\w.-]*)+|[\w-]+\.(?:py|md|toml|jinja|yaml|json))(?::(?P<name>[\w.]+))?"
)
LINE_NUMBER = re.compile(r"\.py:\d+|^:\d+\b|\b\w+\.py:\d+")


def defined_names(path: Path) -> dict[str, set[str]]:
    """Module-level names of a Python file → the names defined in each class (methods, fields)."""
    tree = ast.parse(path.read_text(), str(path))
    names: dict[str, set[str]] = {}

    def members(node: ast.ClassDef) -> set[str]:
        found = set()
        for child in node.body:
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found.add(child.name)
            elif isinstance(child, ast.AnnAssign) and isinstance(child.target, ast.Name):
                found.add(child.target.id)
            elif isinstance(child, ast.Assign):
                found |= {target.id for target in child.targets if isinstance(target, ast.Name)}
        return found

    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = members(node)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names[node.name] = set()
        elif isinstance(node, ast.Assign):
            names |= {target.id: set() for target in node.targets if isinstance(target, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = set()
        elif isinstance(node, ast.ImportFrom):  # a package's __init__ re-exporting a name counts
            names |= {(alias.asname or alias.name): set() for alias in node.names}
    return names


def stale_references(text: str, root: Path) -> list[str]:
    """Every backticked reference in ``text`` that does not resolve under ``root``, or is a line number."""
    problems = []
    for span in SPAN.findall(text):
        if LINE_NUMBER.search(span):
            problems.append(f"{span}: a line number (name the function instead)")
            continue
        match = PATH.match(span)
        if not match:
            continue
        path, name = root / match["path"], match["name"]
        if not path.exists():
            problems.append(f"{span}: no such file or folder")
        elif name:
            if path.suffix != ".py":
                problems.append(f"{span}: only a Python file has names")
                continue
            top, *rest = name.split(".")
            names = defined_names(path)
            if top not in names:
                problems.append(f"{span}: {match['path']} defines no {top}")
            elif rest and rest[0] not in names[top]:
                problems.append(f"{span}: {top} in {match['path']} has no {rest[0]}")
    return problems


def test_every_name_in_the_map_resolves():
    assert stale_references(MAP.read_text(), ROOT) == []


@pytest.mark.parametrize(
    "planted, problem",
    [
        ("`service/app.py:create_apps`", "defines no create_apps"),
        ("`service/no_such_module.py`", "no such file"),
        ("`readers/reader.py:Reader.reads_many`", "has no reads_many"),
        ("`service/app.py:86 create_app`", "a line number"),
        ("`decide.py:152 calibration_key`", "a line number"),
    ],
)
def test_a_planted_stale_name_fails_the_map(planted, problem):
    text = MAP.read_text() + f"\nPlanted: {planted}.\n"
    found = stale_references(text, ROOT)
    assert len(found) == 1 and problem in found[0]


def served_routes(routes) -> list:
    """Every endpoint, routers included (FastAPI wraps an included router's routes; ``original_router``
    holds them), those left out of the OpenAPI document too."""
    found = []
    for route in routes:
        if hasattr(route, "original_router"):
            found += served_routes(route.original_router.routes)
        elif getattr(route, "methods", None):
            found.append(route)
    return found


def test_the_map_shows_every_route_and_middleware_the_app_is_built_with(tmp_path):
    from calibration.open import open_store
    from service.app import create_app

    async def never_opened():  # the app is only built here, never started
        raise AssertionError

    store = open_store(str(tmp_path / "cal.sqlite3"))
    try:
        # with a store (the calibration routes) and a rate limit (its middleware): everything it can have
        app = create_app(open_engine=never_opened, store=store, rate_limit=(1.0, 1))
    finally:
        store.close()
    text = MAP.read_text()
    routes = {(method, route.path) for route in served_routes(app.routes) for method in route.methods}
    missing_routes = sorted(
        f"{method} {path}"
        for method, path in routes
        if method != "HEAD" and f"`{path}`" not in text and f"`{method} {path}`" not in text
    )
    middlewares = [middleware.cls.__name__ for middleware in app.user_middleware]
    missing_middlewares = [name for name in middlewares if f":{name}`" not in text]
    assert (missing_routes, missing_middlewares) == ([], []), "docs/architecture.md does not show these"
    assert len(middlewares) >= 7 and len(routes) >= 13  # the app really was built with all of them
