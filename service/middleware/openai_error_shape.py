"""ASGI middleware: errors on OpenAI's route leave in OpenAI's shape, whoever answered them.

Auth, rate limits, body limits, validation, admission and engine faults each answer in this service's
one error shape (``service/errors.py``); on ``OPENAI_PATHS`` this middleware rewrites such an answer
with ``errors.openai_error`` (status and body; headers such as Retry-After kept), so no component
needs to know which API a path speaks. It sits inside the metrics middleware, which then counts the
status the client got. Successful answers pass through untouched and unbuffered.
"""

from __future__ import annotations

import json

from service.errors import OPENAI_PATHS, openai_error
from service.middleware.asgi import ASGIApp, Message, Receive, Scope, Send


class OpenAIErrorShape:
    def __init__(self, app: ASGIApp, *, paths: frozenset[str] = OPENAI_PATHS) -> None:
        self.app = app
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
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
            await _send_reshaped(send, start, b"".join(chunks))

        await self.app(scope, receive, reshape)


async def _send_reshaped(send: Send, start: Message, body: bytes) -> None:
    try:
        original = json.loads(body) if body else None
    except ValueError:
        original = None
    status, reshaped = openai_error(
        start["status"], original if original is not None else {"detail": body.decode("utf-8", "replace")}
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
