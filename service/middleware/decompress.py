"""ASGI middleware: decode ``Content-Encoding: zstd | gzip`` request bodies, with a size and a time limit.

``typesafe-sdk`` compresses bodies of 1 KiB and more with zstd whenever zstd is available, so a Jev
drop-in must accept it. The limit applies to the decoded size (no decompression bombs) and to plain
bodies alike; over it the client gets 413, an unknown encoding gets 415. The limit is per route
(``ROUTE_BODY_LIMITS``; other paths ``DEFAULT_MAX_BODY_BYTES``), and a Content-Length over it is
refused before a byte of the body is read. The whole body must arrive within ``body_timeout_s``
(408 otherwise): a client whose Content-Length promises more than it sends must not hold a
connection and a task forever.

A compressed body is decoded on the event loop only while its output stays within
``INLINE_BODY_BYTES``; a larger one is decoded in a worker thread (zlib and zstd release the GIL
there), so a 16 MiB gzip body (about 70 ms of decoding) does not hold up /healthz.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Mapping

import zstandard

from service.errors import send_error
from service.middleware.asgi import ASGIApp, Message, Receive, Scope, Send

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
"""The decoded body limit of a path not in the route limits: decision bodies (a batch of 1,024 states)."""
DEFAULT_BODY_TIMEOUT_S = 30.0

ROUTE_BODY_LIMITS: Mapping[str, int] = {
    # A decision id and a label: a few hundred bytes; 64 KiB is a hundred times that.
    "/v1/feedback": 64 * 1024,
    # A question type, a mode, an option count, a domain tag (200 characters at most).
    "/v1/calibrations/refit": 64 * 1024,
    # Examples to fit on: 5,000 at most (CalibrationRequest), a paragraph and its questions each,
    # some 800 bytes; a set that large is also near what one request may cost (--max-request-cost).
    "/v1/calibrations": 4 * 1024 * 1024,
}
"""Decoded body limits of the routes whose bodies are small by nature, so a 14 MB body sent there is
refused at its Content-Length instead of being read and parsed."""

INLINE_BODY_BYTES = 65_536
"""Bodies up to this size (decoded) are decoded and parsed on the event loop, in well under a
millisecond; larger ones in a worker thread (``service/parse.py:parse_request``)."""


class BodyTooLarge(ValueError):
    pass


class ClientGone(Exception):
    """The client disconnected before sending the whole body: there is nobody to answer."""


class DecompressMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        body_limits: Mapping[str, int] = ROUTE_BODY_LIMITS,
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    ) -> None:
        if max_body_bytes <= 0:
            raise ValueError("max_body_bytes must be positive")
        for path, limit in body_limits.items():
            if limit <= 0:
                raise ValueError(f"the body limit of {path} must be positive")
        if not body_timeout_s > 0:
            raise ValueError("body_timeout_s must be positive")
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_limits = {_route(path): limit for path, limit in body_limits.items()}
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = [(name, value) for name, value in scope["headers"]]
        encodings = [
            value.decode("latin-1").strip().lower() for name, value in headers if name == b"content-encoding"
        ]
        encoding = ",".join(encodings) or "identity"
        if encoding not in ("identity", "zstd", "gzip"):
            message = f"unsupported Content-Encoding {encoding[:40]!r}; use zstd, gzip or none"
            await send_error(send, 415, "unsupported_media_type", message, param="Content-Encoding")
            return
        route = _route(scope["path"])
        limit = self.body_limits.get(route, self.max_body_bytes)
        try:
            if _declared_length(headers) > limit:
                raise BodyTooLarge  # before reading: a 14 MB body to a 64 KiB route costs no work
            async with asyncio.timeout(self.body_timeout_s):
                raw = await _read_body(receive, limit)
            body = await _decoded(raw, encoding, limit)
        except ClientGone:
            scope.setdefault("state", {})["disconnected"] = True
            return
        except TimeoutError:
            message = f"the request body did not arrive within {self.body_timeout_s:g} s"
            await send_error(send, 408, "request_timeout", message, param="body")
            return
        except BodyTooLarge:
            where = f" on {route}" if route in self.body_limits else ""
            message = f"request body exceeds {limit} bytes (decoded){where}"
            await send_error(send, 413, "body_too_large", message, param="body", limit=limit)
            return
        except (zstandard.ZstdError, OSError, EOFError, zlib.error) as error:
            await send_error(
                send,
                400,
                "bad_encoding",
                f"request body is not valid {encoding}: {error}",
                param="Content-Encoding",
            )
            return

        kept = [
            (name, value) for name, value in headers if name not in (b"content-encoding", b"content-length")
        ]
        scope = dict(scope, headers=[*kept, (b"content-length", str(len(body)).encode())])
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _route(path: str) -> str:
    """A path as the route limits name it: a trailing slash is the same route."""
    return path.rstrip("/") or "/"


def _declared_length(headers: list[tuple[bytes, bytes]]) -> int:
    """The Content-Length, 0 when absent (chunked; the bytes read are then counted as they come). The
    server (h11) has already refused a malformed or repeated one with 400."""
    for name, value in headers:
        if name == b"content-length":
            return int(value) if value.strip().isdigit() else 0
    return 0


async def _decoded(raw: bytes, encoding: str, limit: int) -> bytes:
    """``_decode`` on the event loop while the output stays within ``INLINE_BODY_BYTES`` (a small body,
    the common case, takes no thread hop); past that, again from the start in a worker thread."""
    if encoding == "identity":
        return raw
    if len(raw) <= INLINE_BODY_BYTES:
        try:
            return _decode(raw, encoding, min(limit, INLINE_BODY_BYTES))
        except BodyTooLarge:
            if limit <= INLINE_BODY_BYTES:
                raise
    return await asyncio.to_thread(_decode, raw, encoding, limit)


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _decode(raw: bytes, encoding: str, limit: int) -> bytes:
    if encoding == "identity":
        return raw
    if encoding == "gzip":
        decoder = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        out = decoder.decompress(raw, limit + 1)
        if len(out) > limit:
            raise BodyTooLarge
        if not decoder.eof:
            raise EOFError("truncated gzip stream")
        if decoder.unused_data:
            raise EOFError("data after the gzip stream (several members are not accepted)")
        return out
    # Pass 1 reads in bounded steps, so a bomb stops at the limit; pass 2, now known to stay under
    # the limit, checks that the frame is complete and nothing follows it.
    reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    size = 0
    while chunk := reader.read(1 << 16):
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
    decoder = zstandard.ZstdDecompressor().decompressobj()
    out = decoder.decompress(raw)
    if not decoder.eof:
        raise EOFError("truncated zstd frame")
    if decoder.unused_data:
        raise EOFError("data after the zstd frame")
    return out
