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

from readers.embedded import prepare_embedded_model
from readers.engines.base import Engine
from readers.engines.local import LocalEngine
from service.app import create_app
from tests.tiers import TierGuard

pytest_plugins = ("pytester",)  # tests/test_tiers.py runs the guard on planted tests

ROOT = Path(__file__).resolve().parents[1]
INTEGRATION_DIR = ROOT / "tests" / "integration"


def pytest_configure(config):
    config.pluginmanager.register(TierGuard(), "tier-guard")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.is_relative_to(INTEGRATION_DIR):
            item.add_marker(pytest.mark.integration)


def head_commit(root: Path) -> str | None:
    """HEAD's commit, read from the repository's files in this process (what ``git rev-parse HEAD`` prints)."""
    git = root / ".git"
    if git.is_file():  # a linked worktree: "gitdir: <its folder under the main .git>"
        git = root / git.read_text().removeprefix("gitdir:").strip()
    common = (git / (git / "commondir").read_text().strip()) if (git / "commondir").exists() else git
    head = (git / "HEAD").read_text().strip()
    if not head.startswith("ref: "):
        return head  # detached
    ref = head.removeprefix("ref: ")
    for folder in (git, common):
        if (folder / ref).is_file():
            return (folder / ref).read_text().strip()
    packed = common / "packed-refs"
    lines = packed.read_text().splitlines() if packed.exists() else []
    return next((line.split()[0] for line in lines if line.endswith(f" {ref}")), None)


@pytest.fixture(scope="session", autouse=True)
def git_revision_in_process():
    """Every eval run's manifest records the commit; ``git rev-parse`` and ``git status`` would start two
    processes per run in the fast tier. The session reads HEAD from .git instead and leaves ``dirty``
    unknown; tests/test_tiers.py checks the reading against the real git (integration), and runs of the
    ``decide eval`` process in the integration tier call git as always."""
    revision = {"commit": head_commit(ROOT), "dirty": None}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("eval.manifest.git_revision", lambda: dict(revision))
        yield


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


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
