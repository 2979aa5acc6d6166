"""ASGI middleware: decode ``Content-Encoding: zstd | gzip`` request bodies, with a size and a time limit.

``typesafe-sdk`` compresses bodies of 1 KiB and more with zstd whenever zstd is available, so a Jev
drop-in must accept it. The limit applies to the decoded size (no decompression bombs) and to plain
bodies alike; over it the client gets 413, an unknown encoding gets 415. The whole body must arrive
within ``body_timeout_s`` (408 otherwise): a client whose Content-Length promises more than it sends
must not hold a connection and a task forever.
"""

from __future__ import annotations

import asyncio
import zlib

import zstandard

from service.errors import send_error
from service.middleware.asgi import ASGIApp, Message, Receive, Scope, Send

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_BODY_TIMEOUT_S = 30.0


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
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    ) -> None:
        if max_body_bytes <= 0:
            raise ValueError("max_body_bytes must be positive")
        if not body_timeout_s > 0:
            raise ValueError("body_timeout_s must be positive")
        self.app = app
        self.max_body_bytes = max_body_bytes
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
        try:
            async with asyncio.timeout(self.body_timeout_s):
                raw = await _read_body(receive, self.max_body_bytes)
            body = _decode(raw, encoding, self.max_body_bytes)
        except ClientGone:
            scope.setdefault("state", {})["disconnected"] = True
            return
        except TimeoutError:
            message = f"the request body did not arrive within {self.body_timeout_s:g} s"
            await send_error(send, 408, "request_timeout", message, param="body")
            return
        except BodyTooLarge:
            message = f"request body exceeds {self.max_body_bytes} bytes (decoded)"
            await send_error(send, 413, "body_too_large", message, param="body", limit=self.max_body_bytes)
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
