"""Optional dependencies: which extra installs each, and the error that names it when it is missing.

``pip install opendecide`` is the service against a vLLM engine; what only some commands use comes
with an extra (pyproject.toml). An import of an extra's package is deferred to where it is used and
wrapped in ``needs_extra``, so a missing one fails with the install command, not a bare module name:

    with needs_extra("local", "the local engine"):
        import torch

Every layer may import this module (it imports nothing of the project; tests/test_layers.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

EXTRAS = {
    "local": ("torch", "gguf", "accelerate", "safetensors"),
    "plots": ("matplotlib",),
    "postgres": ("psycopg", "psycopg_pool"),
    "gcs": ("google", "google_crc32c"),
}
"""Extra → the top-level modules it installs (the ones imported under ``needs_extra``)."""


class MissingExtra(ModuleNotFoundError):
    """An optional package is not installed; the message names the extra that installs it."""


@contextmanager
def needs_extra(extra: str, what: str) -> Iterator[None]:
    """Imports inside this block that fail for a module of ``extra`` raise ``MissingExtra``
    ("``what`` needs torch: pip install 'opendecide[local]'"); any other import error passes as it is."""
    modules = EXTRAS[extra]
    try:
        yield
    except ModuleNotFoundError as error:
        if isinstance(error, MissingExtra) or (error.name or "").split(".")[0] not in modules:
            raise
        raise MissingExtra(
            f"{what} needs {error.name}: pip install 'opendecide[{extra}]'", name=error.name
        ) from error
