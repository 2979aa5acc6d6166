"""What an app holds for its routes (``app.state``), and the accessors that read it.

reader        the Reader over the engine, set once the engine is open (None until then)
engine_error  why the engine is not open yet, for the 503's message
store         the calibration store, or None (no calibration routes, nothing recorded)
metrics       the app's ServiceMetrics
images        the serving images (engine, service), reported in every answer's provenance
priors        the content-free option priors (service.pipeline.prior.OptionPriors), or None (no prior correction)
keyring       the live API keys (service.keys.Keyring), or None (auth off); the caller of a request is
              ``request.scope["state"]["caller"]`` (service.scopes.Caller)
"""

from __future__ import annotations

from fastapi import Request

from calibration.store import CalibrationStore
from readers.errors import EngineUnavailable
from readers.reader import Reader
from service.protocol.models import JEV_ALIASES  # noqa: F401  (where the routes have always found them)


def reader_of(request: Request) -> Reader:
    """The ready reader, or 503 with the reason the engine is not open yet."""
    reader = getattr(request.app.state, "reader", None)
    if reader is None:
        reason = getattr(request.app.state, "engine_error", None) or "the engine is starting"
        raise EngineUnavailable(f"not ready: {reason}")
    return reader


def store_of(request: Request) -> CalibrationStore:
    return request.app.state.store
