"""Packaging: every imported third-party package is declared, and the wheel, installed the normal
way, carries every data file the commands read.

The wheel is built from a copy of the tree (no stale ``build/`` can leak into it), installed with
``--no-deps --no-index`` into a fresh venv that sees this venv's packages through a ``.pth`` line (so
nothing is downloaded), and ``decide cost`` runs there from a directory outside the repo.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import sys
import sysconfig
import tomllib
import zipfile
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from opendecide.extras import EXTRAS as OPTIONAL
from tests.wheels import NOT_COPIED, build_wheel, clean_env, run

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGING = PYPROJECT["tool"]["setuptools"]
PACKAGE_DIRS = sorted({name.rstrip("*") for name in PACKAGING["packages"]["find"]["include"]})
# The suffixes the package-data globs ship ("**/*.toml" → ".toml").
# "**/*.txt.gz" → ".txt.gz", "**/LICENSE" → "LICENSE": the ends of the names that ship.
DATA_SUFFIXES = tuple(pattern.rsplit("*", 1)[1].lstrip("/") for pattern in PACKAGING["package-data"]["*"])


def data_files() -> list[str]:
    """Every file under the packages with a shipped suffix, as wheel paths (eval/data/prices.toml)."""
    return sorted(
        path.relative_to(ROOT).as_posix()
        for top in PACKAGE_DIRS
        for path in (ROOT / top).rglob("*")
        if path.is_file() and path.name.endswith(DATA_SUFFIXES) and "__pycache__" not in path.parts
    )


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(requirements: list[str]) -> set[str]:
    return {canonical(re.match(r"[A-Za-z0-9._-]+", requirement).group()) for requirement in requirements}


def third_party_imports(folders: list[str]) -> dict[str, set[str]]:
    """Top-level names imported anywhere under ``folders`` that are neither stdlib nor this repo's."""
    # Anything defined in this repo is ours: the packages, patches/' own package, tests' helper modules.
    local: set[str] = set()
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [name for name in subfolders if name not in NOT_COPIED]  # never walk the venv
        local |= set(Path(folder).relative_to(ROOT).parts) | {
            name[:-3] for name in files if name.endswith(".py")
        }
    found: dict[str, set[str]] = {}
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in local:
                        found.setdefault(top, set()).add(path.relative_to(ROOT).as_posix())
    return found


def undeclared(imports: dict[str, set[str]], allowed: set[str]) -> dict[str, list[str]]:
    """Import name → the files importing it, for each name no allowed distribution provides."""
    providers = packages_distributions()
    return {
        name: sorted(files)
        for name, files in imports.items()
        if not {canonical(dist) for dist in providers.get(name, [])} & allowed
    }


EXTRAS = PYPROJECT["project"]["optional-dependencies"]


def test_every_third_party_import_is_declared():
    runtime = declared(PYPROJECT["project"]["dependencies"])
    extras = set().union(*(declared(EXTRAS[name]) for name in OPTIONAL))
    test = runtime | extras | declared(EXTRAS["test"])
    assert undeclared(third_party_imports(PACKAGE_DIRS), runtime | extras) == {}, (
        "add these to [project] dependencies, or to an extra (and opendecide/extras.py)"
    )
    assert undeclared(third_party_imports(["tests"]), test) == {}, "add these to the test extra"


def unguarded_optional_imports(path: Path) -> list[str]:
    """``file:line: module`` for each import of an extra's module (opendecide/extras.py) in ``path`` that
    runs when the module is imported and is not inside ``with needs_extra(...)``: such an import makes
    the whole module, and whatever imports it, need the extra, failing with a bare module name."""
    optional = {module for modules in OPTIONAL.values() for module in modules}
    found = []

    def visit(node: ast.AST, guarded: bool) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            return  # runs only when called: deferred to its use
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.With) and any(
            "needs_extra" in ast.unparse(item.context_expr) for item in node.items
        ):
            guarded = True
        if isinstance(node, ast.Import | ast.ImportFrom) and not guarded:
            names = (
                [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            )
            found.extend(f"{path}:{node.lineno}: {name}" for name in names if name.split(".")[0] in optional)
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def test_optional_imports_are_deferred_or_name_their_extra(tmp_path):
    found = [
        problem
        for folder in PACKAGE_DIRS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for problem in unguarded_optional_imports(path)
    ]
    assert found == []
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import json\nimport matplotlib.pyplot as plt\nfrom opendecide.extras import needs_extra\n"
        "with needs_extra('local', 'x'):\n    import torch\n"
        "def draw():\n    import matplotlib\n"
        "try:\n    import psycopg\nexcept ImportError:\n    psycopg = None\n"
    )
    assert [line.split(": ", 1)[1] for line in unguarded_optional_imports(planted)] == [
        "matplotlib.pyplot",
        "psycopg",
    ]


def test_each_optional_module_is_installed_by_the_extra_that_names_it():
    """opendecide/extras.py's table agrees with pyproject.toml: the extras exist, each module it lists
    comes from a distribution of its extra, and the test extra pulls every one of them."""
    providers = packages_distributions()
    assert set(OPTIONAL) <= set(EXTRAS)
    for extra, modules in OPTIONAL.items():
        for module in modules:
            assert {canonical(dist) for dist in providers.get(module, [])} & declared(EXTRAS[extra]), module
    assert f"opendecide[{','.join(OPTIONAL)}]" in EXTRAS["test"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("venv") / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    # Installed before the .pth line exists: with this venv's packages visible, pip would see the
    # editable opendecide here and replace it.
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(wheel),
        ]
    )
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).strip())
    # A path line in a .pth only appends to sys.path; the .pth files over there (the editable install's
    # hook among them) are not run, so opendecide resolves to the wheel's copy.
    ours = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    (site / "test-venv-packages.pth").write_text("\n".join(ours) + "\n")
    return venv


@pytest.mark.integration
def test_the_wheel_lists_every_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = data_files()
    # The files named when they were missing: the price rows and the reference study's figures.
    assert {
        "eval/data/prices.toml",
        "eval/data/reference/v6e-throughput.toml",
        "eval/data/reference/published_jev_nimble.json",
    } <= set(expected)
    assert [name for name in expected if name not in names] == []


@pytest.mark.integration
def test_the_installed_modules_and_data_come_from_the_venv(venv, tmp_path):
    files = {name: hashlib.sha256((ROOT / name).read_bytes()).hexdigest() for name in data_files()}
    script = f"""
import hashlib, importlib, json
from importlib import resources
modules = [importlib.import_module(m) for m in ("opendecide.cli", "service.cli", "eval.cli", "deploy.cli", "readers", "calibration")]
read = {{}}
for name in {sorted(files)!r}:
    package, _, rest = name.partition("/")
    read[name] = hashlib.sha256(resources.files(package).joinpath(rest).read_bytes()).hexdigest()
print(json.dumps({{"modules": [m.__file__ for m in modules], "read": read}}))
"""
    found = json.loads(run([str(venv / "bin" / "python"), "-c", script], cwd=tmp_path, env=clean_env()))
    assert all(Path(path).is_relative_to(venv) for path in found["modules"]), found["modules"]
    assert found["read"] == files


@pytest.mark.integration
def test_decide_cost_prints_the_shipped_price_rows(venv, tmp_path):
    prices = tomllib.loads((ROOT / "eval" / "data" / "prices.toml").read_text())
    v6e = [row for row in prices["price"] if row["chip"] == "v6e"]
    assert v6e, "eval/data/prices.toml has no v6e rows"
    # --quoted reads eval/data/reference/v6e-throughput.toml; every price row comes from eval/data/prices.toml.
    output = run(
        [str(venv / "bin" / "decide"), "cost", "--chip", "v6e", "--quoted"], cwd=tmp_path, env=clean_env()
    )
    rows = [line.split(" | ") for line in output.splitlines() if "(quoted) | tpu-v6e" in line]
    printed = {row[1]: float(row[2]) for row in rows}
    assert printed == {
        row["name"]: pytest.approx(row["usd_per_hour"], abs=5e-5) for row in v6e
    }  # $/h to 4 places
    assert any(line.startswith("| Jev at ") for line in output.splitlines())
