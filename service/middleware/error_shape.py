"""ASGI middleware: errors leave in the shape of the wire format their path speaks, whoever answered them.

Auth, rate limits, body limits, validation, admission and engine faults each answer in this service's
one error shape (``service/errors.py``); on a path of ``shapes`` (``errors.ERROR_SHAPES``: OpenAI's
``/v1/decisions``, Google's ``/v1beta/…``) this middleware rewrites such an answer with that format's shape (status and body;
headers such as Retry-After kept), so no component needs to know which API a path speaks. It sits
inside the metrics middleware, which then counts the status the client got. Successful answers pass
through untouched and unbuffered.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from service.errors import ERROR_SHAPES, ErrorShape, error_shape
from service.middleware.asgi import ASGIApp, Message, Receive, Scope, Send


class ErrorShapeMiddleware:
    def __init__(self, app: ASGIApp, *, shapes: Mapping[str, ErrorShape] = ERROR_SHAPES) -> None:
        self.app = app
        self.shapes = dict(shapes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        shape = error_shape(self.shapes, scope["path"]) if scope["type"] == "http" else None
        if shape is None:
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def reshape(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message  # held until the body is complete
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            await _send_reshaped(send, shape, start, b"".join(chunks))

        await self.app(scope, receive, reshape)


async def _send_reshaped(send: Send, shape: ErrorShape, start: Message, body: bytes) -> None:
    try:
        original = json.loads(body) if body else None
    except ValueError:
        original = None
    sent = {name.decode("latin-1"): value.decode("latin-1") for name, value in start.get("headers", [])}
    status, reshaped = shape(
        start["status"],
        original if original is not None else {"detail": body.decode("utf-8", "replace")},
        sent,
    )
    encoded = json.dumps(reshaped, allow_nan=False).encode()
    headers = [
        (name, value)
        for name, value in start.get("headers", [])
        if name.lower() not in (b"content-length", b"content-type")
    ]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(encoded)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": encoded})
