"""ASGI middleware: request bodies must be JSON (``application/json`` or ``application/…+json``).

A ``text/plain`` or form body is a client mistake (``curl -d`` without a header) or a cross-site form
post; refusing it with 415 says which, where parsing it anyway would hide the mistake. A charset, if
given, must be UTF-8, the only encoding JSON allows between systems (RFC 8259).
"""

from __future__ import annotations

from service.errors import send_error
from service.middleware.asgi import ASGIApp, Receive, Scope, Send
from service.protocol.multipart import is_multipart

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
MULTIPART_PATHS = frozenset({"/v1/systemone", "/decide"})
"""The routes that also read ``multipart/form-data``: Jev's, for its image mode."""


def is_json(content_type: str) -> bool:
    media, _, params = content_type.partition(";")
    media = media.strip().lower()
    kind, _, subtype = media.partition("/")
    if kind != "application" or not (subtype == "json" or subtype.endswith("+json")):
        return False
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return False
    return True


class JsonBodyMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in BODY_METHODS:
            content_type = next(
                (value.decode("latin-1") for name, value in scope["headers"] if name == b"content-type"), ""
            )
            # Jev 1.14's image mode sends its images as file parts beside the JSON request
            # (service/protocol/multipart.py); no other route reads a form.
            multipart = scope["path"] in MULTIPART_PATHS and is_multipart(content_type)
            if not is_json(content_type) and not multipart:
                shown = content_type[:60] or "none"
                message = f"Content-Type {shown!r} is not accepted; send application/json (UTF-8)"
                await send_error(send, 415, "unsupported_media_type", message, param="Content-Type")
                return
        await self.app(scope, receive, send)
