"""``open_store`` picks the backend a location names, and the store contract knows no backend.

The contract (``calibration/store.py``) once chose the backend in ``__new__`` by importing the
backends, which import the contract: a cycle, hidden inside a function. The import graph of the
package is read from the source (every import statement at any depth, as ``tests/test_layers.py``
reads layers), so an import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from calibration.open import open_store
from calibration.sqlite_store import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = {"calibration.sqlite_store", "calibration.postgres_store", "calibration.open"}


def calibration_imports(package: Path) -> dict[str, set[str]]:
    """Module → the package's own modules it imports, at any depth in its source."""
    graph = {}
    for path in sorted(package.glob("*.py")):
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            targets |= {name for name in names if name.startswith(f"{package.name}.")}
        graph[f"{package.name}.{path.stem}"] = targets
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as the modules along it (first repeated at the end), or [] where none."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str]:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return []
        for target in sorted(graph.get(module, ())):
            if found := visit(target, [*path, module]):
                return found
        done.add(module)
        return []

    for module in sorted(graph):
        if found := visit(module, []):
            return found
    return []


def test_the_contract_imports_no_backend_and_the_package_has_no_cycle():
    graph = calibration_imports(ROOT / "calibration")
    assert graph["calibration.store"] & BACKENDS == set()
    assert cycle(graph) == []


def test_a_backend_chosen_inside_the_contract_is_found_as_a_cycle(tmp_path):
    """The shape the contract had: a backend imported inside a method, importing the contract back."""
    package = tmp_path / "calibration"
    package.mkdir()
    (package / "store.py").write_text(
        "class CalibrationStore:\n    def __new__(cls, location):\n"
        "        from calibration.sqlite_store import SQLiteStore\n        return object.__new__(SQLiteStore)\n"
    )
    (package / "sqlite_store.py").write_text(
        "from calibration.store import CalibrationStore\n\n\nclass SQLiteStore(CalibrationStore): ...\n"
    )
    graph = calibration_imports(package)
    assert graph["calibration.store"] & BACKENDS == {"calibration.sqlite_store"}
    assert cycle(graph) == ["calibration.sqlite_store", "calibration.store", "calibration.sqlite_store"]


def test_a_path_opens_sqlite(tmp_path):
    for location in (tmp_path / "a.sqlite3", str(tmp_path / "b.sqlite3")):
        store = open_store(location)
        try:
            assert type(store) is SQLiteStore and store.path == Path(location)
        finally:
            store.close()
    with pytest.raises(TypeError):  # Postgres's options mean nothing to a file
        open_store(tmp_path / "c.sqlite3", pool_size=2)


@pytest.mark.integration
def test_a_postgres_url_opens_postgres(postgres_url):
    from calibration.postgres_store import PostgresStore

    for url in (postgres_url, postgres_url.replace("postgresql://", "postgres://", 1)):
        store = open_store(url, pool_size=2)
        try:
            assert type(store) is PostgresStore and store.url == url
        finally:
            store.close()
    with pytest.raises(ConnectionError, match=r"postgresql://u:\*\*\*@127.0.0.1:9/none"):
        open_store("postgresql://u:secret@127.0.0.1:9/none")  # nothing listens on port 9
