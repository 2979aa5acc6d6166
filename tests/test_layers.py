"""Layers import in one direction only: a walk over every import statement (ast, not grep).

readers/  calibration/  patches/    nothing else of the project
service/                            readers, calibration
eval/                               service and below
deploy/                             everything below
opendecide/                         the ``decide`` entry point: everything

opendecide/extras.py (which extra installs an optional package) imports nothing of the project, and every
layer may import it: an optional import fails naming its extra, with one helper.

Inside service, the decision pipeline is apart from HTTP:

service/protocol/   the wire models: from service, only service.protocol
service/pipeline/   question → reads → prior → calibration → abstention → answer: service.pipeline, service.protocol
service/ (the rest) the HTTP part (app, routes, middleware, server, command line): uses the pipeline

No module of the pipeline, the wire models, readers/, calibration/ or eval/ imports a web framework
(fastapi, starlette, uvicorn) or service's HTTP part; eval imports from service only the pipeline and the
wire models. Checked import by import, so what these modules import is itself checked: nothing reaches a
web framework through them.
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
EVERY_LAYER = {"opendecide.extras", "opendecide.tenant_cache"}
WEB_FRAMEWORKS = {"fastapi", "starlette", "uvicorn"}
# Folder → the service packages its modules may import; any other service module is HTTP.
APART_FROM_HTTP = {
    "service/protocol": ("service.protocol",),
    "service/pipeline": ("service.pipeline", "service.protocol"),
    "readers": (),
    "calibration": (),
    "eval": ("service.pipeline", "service.protocol"),
}
# The one exception: ``decide eval load`` measures the HTTP service itself, so its command builds the
# in-process app and hands it to eval/capacity/sweep.py (run_sweep(service_app=...)), which imports no HTTP.
HTTP_ALLOWED = {("eval/capacity/cli.py", "service.app")}


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted module) of every absolute import, at any depth (imports inside functions count);
    ``from service import app`` counts as ``service.app``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module in BELOW:  # a package's modules may be imported by name from it
                found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, node.module))
    return found


def upward_imports(root: Path) -> list[str]:
    """``path:line: layer imports other`` for every import a layer may not make."""
    problems = []
    for layer, allowed in BELOW.items():
        for path in sorted((root / layer).rglob("*.py")):
            for line, module in imported_modules(ast.parse(path.read_text(), str(path))):
                package = module.split(".")[0]
                if module in EVERY_LAYER:
                    continue
                if package in BELOW and package != layer and package not in allowed:
                    problems.append(f"{path.relative_to(root)}:{line}: {layer} imports {package}")
    return problems


def within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == package or module.startswith(package + ".") for package in packages)


def http_imports(root: Path) -> list[str]:
    """``path:line: folder imports module`` for every import of a web framework, or of service's HTTP
    part, by a module that must stay apart from HTTP."""
    problems = []
    for folder, allowed in APART_FROM_HTTP.items():
        for path in sorted((root / folder).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            for line, module in imported_modules(ast.parse(path.read_text(), str(path))):
                web = module.split(".")[0] in WEB_FRAMEWORKS
                http = module.split(".")[0] == "service" and not within(module, allowed)
                if (web or http) and (name, module) not in HTTP_ALLOWED:
                    problems.append(f"{name}:{line}: {folder} imports {module}")
    return problems


def test_no_layer_imports_upward():
    assert upward_imports(ROOT) == []


def test_the_module_every_layer_imports_imports_nothing_of_the_project():
    for module in EVERY_LAYER:
        path = ROOT / (module.replace(".", "/") + ".py")
        imported = [name for _, name in imported_modules(ast.parse(path.read_text(), str(path)))]
        assert [name for name in imported if name.split(".")[0] in BELOW] == []


def test_the_pipeline_wire_models_and_eval_import_no_http():
    assert http_imports(ROOT) == []


def test_a_planted_upward_import_is_named_with_file_and_line(tmp_path):
    (tmp_path / "readers").mkdir()
    (tmp_path / "readers" / "reader.py").write_text(
        "import json\n\n\ndef f():\n    from service.app import create_app\n"
    )
    (tmp_path / "service").mkdir()
    (tmp_path / "service" / "app.py").write_text(
        "from readers.reader import Reader\nimport eval.decisions.runner\n"
    )
    assert upward_imports(tmp_path) == [
        "readers/reader.py:5: readers imports service",
        "service/app.py:2: service imports eval",
    ]


def plant(root: Path, name: str, source: str) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)


def test_planted_http_imports_below_http_are_named_with_file_and_line(tmp_path):
    # The HTTP part itself may use the framework and the pipeline.
    plant(
        tmp_path,
        "service/app.py",
        "from fastapi import FastAPI\nfrom service.pipeline.decide import decide\n",
    )
    plant(tmp_path, "service/pipeline/decide.py", "from service.protocol import Answer\n\n\n"
          "def f():\n    from starlette.requests import Request\n")  # fmt: skip
    plant(tmp_path, "service/pipeline/prior.py", "from service import state\nimport service.pipeline.reads\n")
    plant(tmp_path, "service/protocol/answers.py", "import pydantic\nfrom service.pipeline import decide\n")
    plant(tmp_path, "readers/reader.py", "import uvicorn\n")
    plant(tmp_path, "calibration/fit.py", "import fastapi.responses\n")
    plant(
        tmp_path,
        "eval/decisions/runner.py",
        "from service.pipeline.prior import OptionPriors\nfrom service.cli import quiet_loaders\n",
    )
    plant(
        tmp_path,
        "eval/capacity/sweep.py",
        "from service.protocol import SystemOneRequest\nfrom service.app import create_app\n",
    )
    plant(
        tmp_path, "eval/capacity/cli.py", "def load():\n    from service.app import create_app\n"
    )  # the one exception
    assert http_imports(tmp_path) == [
        "service/protocol/answers.py:2: service/protocol imports service.pipeline",
        "service/pipeline/decide.py:5: service/pipeline imports starlette.requests",
        "service/pipeline/prior.py:1: service/pipeline imports service.state",
        "readers/reader.py:1: readers imports uvicorn",
        "calibration/fit.py:1: calibration imports fastapi.responses",
        "eval/capacity/sweep.py:2: eval imports service.app",
        "eval/decisions/runner.py:2: eval imports service.cli",
    ]


def route_to_route_imports(root: Path) -> list[str]:
    """``path:line: imports module`` for every route module importing another route module: what routes
    share lives in a module of its own (``service/decision_route.py``, ``service/state.py``), so each
    wire format's route reaches only that."""
    folder = root / "service" / "routes"
    routes = {f"service.routes.{path.stem}" for path in folder.glob("*.py") if path.stem != "__init__"}
    found = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # ``from service.routes import decisions`` names the module in the alias
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            found += [
                f"{path.relative_to(root)}:{node.lineno}: imports {name}" for name in names if name in routes
            ]
    return found


def test_no_route_module_imports_another():
    assert route_to_route_imports(ROOT) == []


def test_a_planted_route_to_route_import_is_named(tmp_path):
    plant(tmp_path, "service/routes/decisions.py", "from service.decision_route import serve_decisions\n")
    plant(tmp_path, "service/routes/openai_decisions.py", "\nfrom service.routes.decisions import answer\n")
    plant(tmp_path, "service/routes/models.py", "def f():\n    from service.routes import decisions\n")
    assert route_to_route_imports(tmp_path) == [
        "service/routes/models.py:2: imports service.routes.decisions",
        "service/routes/openai_decisions.py:2: imports service.routes.decisions",
    ]
