"""ASGI middleware: give every request an id, returned in ``x-request-id``.

The id is also sent as ``x-typesafe-request-id``, the header the TypeSafe SDK exposes as
``response.request_id``. A caller's own ``x-request-id`` (1-128 printable ASCII characters without
spaces; anything else is replaced by a server id) is kept in its caller's namespace: once the auth
middleware knows the key, the id becomes ``<key_id>:<caller's id>`` (``namespace_request_id``), so a
tenant cannot give its requests another tenant's ids in the access log, ``x_provenance`` or the
response. A request refused for its key gets a server id. With auth off (one operator) the caller's
id is kept as sent.
"""

from __future__ import annotations

import re
import uuid

from service.middleware.asgi import ASGIApp, Message, Receive, Scope, Send

HEADER = "x-request-id"
SDK_HEADER = "x-typesafe-request-id"
MAX_REQUEST_ID_CHARS = 128
_GIVEN_ID = re.compile(rf"[\x21-\x7e]{{1,{MAX_REQUEST_ID_CHARS}}}")


def _incoming_id(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == HEADER.encode():
            text = value.decode("latin-1").strip()
            if _GIVEN_ID.fullmatch(text):
                return text
    return None


def namespace_request_id(state: dict, key_id: str | None) -> None:
    """Put the caller's own request id in its key's namespace, once auth knows the caller; without a
    key (refused, or a probe on an open path) a caller's id is replaced by a server id."""
    given = state.pop("given_request_id", None)
    if given is not None:
        state["request_id"] = f"{key_id}:{given}" if key_id else uuid.uuid4().hex


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        given = _incoming_id(scope)
        state["request_id"] = given or uuid.uuid4().hex
        if given is not None:
            state["given_request_id"] = given

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                encoded = state["request_id"].encode()  # read now: auth may have namespaced it
                message = dict(message)
                message["headers"] = [
                    *message.get("headers", []),
                    (HEADER.encode(), encoded),
                    (SDK_HEADER.encode(), encoded),
                ]
            await send(message)

        await self.app(scope, receive, send_with_id)
