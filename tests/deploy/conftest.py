"""The deploy tests' fixtures; what they share besides fixtures is in run_files.py."""

from __future__ import annotations

import pytest

from tests.deploy.run_files import EXAMPLES


@pytest.fixture(params=[p.stem for p in EXAMPLES])
def example_name(request) -> str:
    return request.param
