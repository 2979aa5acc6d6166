"""Work for a client that disconnected, or past its deadline, is cancelled, not finished for nobody.

``unless_disconnected`` races the work against the ASGI ``http.disconnect`` message and the app's
per-request deadline (``AdmissionLimits.deadline_s``, ``decide serve --deadline``). When the client
leaves first, or the deadline passes (504 ``deadline_exceeded``), the work's task is cancelled: a
request waiting for admission leaves the queue; reads not yet started are dropped (the embedded
engine drops queued reads before its compute thread takes them, and a batch whose every caller left
stops at its next chunk; a vLLM request's HTTP call is closed, which vLLM aborts); a forward pass
already running on the embedded engine finishes (torch cannot stop one mid-way), bounded by the
admission limits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request

from service.errors import ClientDisconnected, DeadlineExceeded

T = TypeVar("T")


async def _disconnected(request: Request) -> None:
    # The body has been read, so the next ASGI message is the disconnect (sent when the client goes,
    # or once the response is complete).
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """``await work``, or cancel it and raise ``ClientDisconnected`` if the client leaves first, or
    ``DeadlineExceeded`` (504) if the app's deadline passes first."""
    deadline_s = request.app.state.admission.limits.deadline_s
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, timeout=deadline_s, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    if not done:  # neither the work nor the client finished: the deadline passed
        raise DeadlineExceeded(
            f"the request ran past the server's {deadline_s:g} s deadline (decide serve --deadline); "
            "its reads were stopped: send fewer questions or states, or retry when the service is less busy",
            param="deadline",
        )
    request.scope.setdefault("state", {})["disconnected"] = True
    raise ClientDisconnected("the client disconnected before its answer; its reads were cancelled")
