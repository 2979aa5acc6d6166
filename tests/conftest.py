"""Shared fixtures: the real embedded model, loaded once per session, and an in-process client.

Tiers: ``integration`` (a real server, engine, emulator or CLI process; everything under
tests/integration/) and ``slow`` (many records read through the model). The inner loop is
``pytest -m "not slow and not integration"``; ``make test`` runs everything."""

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

INTEGRATION_DIR = Path(__file__).resolve().parent / "integration"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.is_relative_to(INTEGRATION_DIR):
            item.add_marker(pytest.mark.integration)


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
