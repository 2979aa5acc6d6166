"""ASGI middleware: give every request an id, returned in ``x-request-id``.

The id is also sent as ``x-typesafe-request-id``, the header the TypeSafe SDK exposes as
``response.request_id``. A caller-supplied ``x-request-id`` (up to 128 printable characters) is kept.
"""

from __future__ import annotations

import uuid

from service.middleware.asgi import ASGIApp, Message, Receive, Scope, Send

HEADER = "x-request-id"
SDK_HEADER = "x-typesafe-request-id"


def _incoming_id(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == HEADER.encode():
            text = value.decode("latin-1").strip()
            if 0 < len(text) <= 128 and text.isprintable():
                return text
    return None


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _incoming_id(scope) or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        encoded = request_id.encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = [
                    *message.get("headers", []),
                    (HEADER.encode(), encoded),
                    (SDK_HEADER.encode(), encoded),
                ]
            await send(message)

        await self.app(scope, receive, send_with_id)
