"""Bounds on connections that uvicorn does not set: a header timeout, connections per client address and
in all, and an open-file limit that can hold them.

uvicorn's keep-alive timer starts only after a response, so a connection that sends its request
headers a byte at a time (or nothing at all) was held for ever: 1,100 of them exhausted the open-file
limit and /healthz got connection resets. ``connection_protocol(limits)`` is uvicorn's h11 protocol
(``uvicorn.Config(http=...)``) with:

- a header timeout: a connection waiting for a request's headers (from when it opened, or from the
  previous response) gets ``header_timeout_s`` to complete them; past it, 408 if part of a request
  came (nothing if none did), and the connection is closed;
- at most ``per_client`` connections from one client address and ``total`` in all: one past either
  is answered 503 with Retry-After at once, before its request is read, and closed (a client that had
  already sent its request may see the connection reset instead of the 503).

The body's own timeout is ``service/middleware/decompress.py``'s (408), the idle time between
requests uvicorn's keep-alive (``KEEP_ALIVE_S``). ``raise_open_file_limit`` lifts the process's soft
open-file limit to its hard one at start-up; ``total`` is capped below it (``connection_cap``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from service.errors import error_body

if TYPE_CHECKING:
    from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("opendecide")

DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 64
DEFAULT_MAX_CONNECTIONS = 4096
KEEP_ALIVE_S = 5
"""uvicorn's own default: an idle connection is closed this long after its last response."""
BACKLOG = 2048
"""Connections the kernel queues before the service accepts them (uvicorn's default; the kernel caps
it at ``net.core.somaxconn``). They hold no file of the process until accepted."""
FILES_KEPT = 256
"""Open files kept for everything but client connections (the model's files, the store, logs, the
threads' and engines' pipes): ``connection_cap`` keeps ``total`` this far below the open-file limit."""
RETRY_AFTER_S = 1


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    per_client: int = DEFAULT_MAX_CONNECTIONS_PER_CLIENT
    """Open connections from one client address; 0: no bound (behind a proxy all come from one)."""
    total: int = DEFAULT_MAX_CONNECTIONS

    def __post_init__(self) -> None:
        if not self.header_timeout_s > 0:
            raise ValueError("header_timeout_s must be positive")
        if self.per_client < 0:
            raise ValueError("per_client must be 0 (no bound) or positive")
        if self.total < 1:
            raise ValueError("total must be positive")


def raise_open_file_limit() -> int:
    """Lift the soft open-file limit to the hard one (often 1,024 and 1,048,576 by default); the
    resulting soft limit, logged."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as error:  # an infinite hard limit some systems refuse as a soft one
            logger.warning("could not raise the open-file limit from %d to %s: %s", soft, hard, error)
    logger.info("open-file limit %d", soft)
    return soft


def connection_cap(limits: ConnectionLimits, open_files: int) -> ConnectionLimits:
    """``limits`` with ``total`` at most ``open_files − FILES_KEPT`` (and at least 1), noted when lowered."""
    room = max(1, open_files - FILES_KEPT)
    if limits.total <= room:
        return limits
    logger.warning(
        "--max-connections %d lowered to %d: the open-file limit is %d", limits.total, room, open_files
    )
    return ConnectionLimits(limits.header_timeout_s, limits.per_client, room)


def _raw_response(status: int, reason: str, error_type: str, message: str, **headers: str) -> bytes:
    """A whole HTTP/1.1 error response that closes its connection, written past h11 (which sends no
    response before a request)."""
    body = json.dumps(error_body(status, error_type, message)).encode()
    lines = [
        f"HTTP/1.1 {status} {reason}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
        *(f"{name.replace('_', '-')}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def connection_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol within ``limits``; each call counts its own connections (one per server)."""
    import h11  # here, not above: ``decide`` imports this module for its options, not for a server
    from uvicorn.protocols.http.h11_impl import H11Protocol

    by_client: Counter[str] = Counter()
    timeout_reply = _raw_response(
        408, "Request Timeout", "request_timeout",
        f"the request headers did not arrive within {limits.header_timeout_s:g} s",
    )  # fmt: skip

    class BoundedH11Protocol(H11Protocol):
        counted: str | None = None
        header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            host = self.client[0] if self.client else None
            if len(self.connections) > limits.total:
                self.refuse(f"the server holds {limits.total} connections, its most")
            elif limits.per_client and host is not None and by_client[host] >= limits.per_client:
                self.refuse(f"{limits.per_client} connections from one address at most; reuse one")
            else:
                if host is not None:
                    by_client[host] += 1
                    self.counted = host
                self.await_headers()

        def refuse(self, message: str) -> None:
            logger.warning("connection refused: %s", message)
            self.transport.write(
                _raw_response(
                    503, "Service Unavailable", "overloaded_error", f"{message}; retry after {RETRY_AFTER_S} s",
                    retry_after=str(RETRY_AFTER_S),
                )
            )  # fmt: skip
            self.transport.close()

        def await_headers(self) -> None:
            self.stop_header_timer()
            self.header_timer = self.loop.call_later(limits.header_timeout_s, self.headers_timed_out)

        def stop_header_timer(self) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None

        def headers_timed_out(self) -> None:
            self.header_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if self.conn.trailing_data[0]:  # part of a request came: say why it is closed
                self.transport.write(timeout_reply)
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the headers are complete (or refused with 400)
                self.stop_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # Waiting for the next request's headers (unless a pipelined one was already parsed).
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self.await_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            self.stop_header_timer()
            if self.counted is not None:
                by_client[self.counted] -= 1
                if not by_client[self.counted]:
                    del by_client[self.counted]
                self.counted = None
            super().connection_lost(exc)

    return BoundedH11Protocol


def uvicorn_options(limits: ConnectionLimits) -> dict[str, Any]:
    """The ``uvicorn.Config`` options that serve within ``limits``. ``limit_concurrency`` stays unset:
    it answers 503 to every request, /healthz included, once connections reach it, where ``total``
    refuses only the connections past it; work in flight is bounded by admission (529)."""
    return {"http": connection_protocol(limits), "timeout_keep_alive": KEEP_ALIVE_S, "backlog": BACKLOG}
