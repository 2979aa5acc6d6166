"""ASGI middleware: ``Authorization: Bearer <key>`` (what Jev's SDKs send), or ``x-goog-api-key: <key>``
(what Google's send) → the request's ``Caller``.

The keys, their file format and live reload are ``service/keys.py``; the scopes a caller holds and
``require_scope`` are ``service/scopes.py``. A request without a key of the live set gets 401 before
its body is read; ``OPEN_PATHS`` need none. A query string naming a key-like parameter
(``service.keys.KEY_PARAMS``: ``api_key=``, ``key=``, …) gets 400 naming it, on every path and with auth
on or off: a key in a URL ends up in proxies' and browsers' logs, and is taken only from the header.
Once the key is known, a caller's own request id is put in its key's namespace
(``service/middleware/request_id.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

from calibration.store import DEFAULT_TENANT
from service.errors import send_error
from service.keys import Keyring, key_id, key_params_in
from service.middleware.asgi import ASGIApp, Receive, Scope, Send
from service.middleware.request_id import namespace_request_id
from service.scopes import ANONYMOUS, Caller

# Liveness and readiness answer orchestrators' probes, which carry no key; neither says anything a
# caller could use (readiness names the model, as /v1/models would). The OpenAPI document is the
# public contract, fetched by generators before they hold a key.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json"})


class AuthMiddleware:
    """401 unless the request carries a key of ``keys`` (a ``Keyring``, or bare keys); ``keys=None``
    turns auth off (the header is then accepted and ignored, every caller is ``ANONYMOUS``).
    ``open_paths`` need no key. Puts the ``Caller`` (tenant, key id, scopes) in the request's state."""

    def __init__(
        self, app: ASGIApp, *, keys: Keyring | Iterable[str] | None, open_paths: Iterable[str] = OPEN_PATHS
    ) -> None:
        self.app = app
        if keys is None or isinstance(keys, Keyring):
            self.keyring = keys
        else:
            self.keyring = Keyring.of(keys)
        if self.keyring is not None and not self.keyring.current.keys:
            raise ValueError("auth is on but no API keys were given (pass keys=None to turn auth off)")
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        in_query = key_params_in(scope.get("query_string", b"").decode("latin-1"))
        if in_query:
            if self.keyring is not None:
                namespace_request_id(state, None)
            await send_error(
                send, 400, "invalid_request_error",
                f"API keys are not taken from the query string ('{in_query[0]}'): send 'Authorization: Bearer <key>'",
                param=in_query[0],
            )  # fmt: skip
            return
        if self.keyring is None:
            state["caller"] = ANONYMOUS
            await self.app(scope, receive, send)
            return
        if scope["path"] in self.open_paths:
            state["caller"] = Caller(DEFAULT_TENANT, None, frozenset())
            namespace_request_id(state, None)
            await self.app(scope, receive, send)
            return
        presented = _bearer(scope) or _goog_api_key(scope)
        matched = (
            None if presented is None else self.keyring.current.match(presented)
        )  # one read of the live set
        namespace_request_id(state, None if matched is None else key_id(matched.digest))
        if presented is None:
            await _refuse(send, "missing API key: send 'Authorization: Bearer <key>'")
            return
        if matched is None:
            await _refuse(send, "invalid API key")
            return
        state["caller"] = matched.caller
        state["key_id"] = key_id(matched.digest)
        await self.app(scope, receive, send)


def _bearer(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, credentials = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and credentials.strip():
                return credentials.strip()
            return None
    return None


def _goog_api_key(scope: Scope) -> str | None:
    """The key as Google's SDKs send it (``x-goog-api-key``), checked like a bearer key."""
    for name, value in scope["headers"]:
        if name == b"x-goog-api-key":
            return value.decode("latin-1").strip() or None
    return None


async def _refuse(send: Send, message: str) -> None:
    await send_error(
        send,
        401,
        "authentication_error",
        message,
        param="Authorization",
        headers={"WWW-Authenticate": "Bearer"},
    )
