"""Request bytes → a validated wire model, every failure a 422 whose ``loc`` names the field.

A body over ``INLINE_BODY_BYTES`` is parsed in a worker thread (``parse_request``), so the event loop
(and /healthz beside it) does not wait the second a 14 MB body takes; at most
``LARGE_PARSES_PER_ROUTE`` such parses run at once per route, at most ``LARGE_PARSES_PER_TENANT`` of
them one tenant's, and one more is refused with 529 rather than queued, since parses share one GIL and
a queue of them would only add memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import json.scanner
import math
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from calibration.store import DEFAULT_TENANT
from readers.reader import Reader
from service.errors import NotUtf8, Overloaded, UnsupportedFeature, validation_error
from service.middleware.decompress import INLINE_BODY_BYTES
from service.protocol import SystemOneRequest
from service.protocol.multipart import MultipartRefused, is_multipart, split_multipart
from service.protocol.questions import ImageReferenceRefused
from service.scopes import ANONYMOUS
from service.state import JEV_ALIASES, reader_of

ModelT = TypeVar("ModelT", bound=BaseModel)


class DuplicateKey(ValueError):
    pass


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of duplicate keys silently; two options with one name are a client bug.
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise DuplicateKey(f"duplicate key {key!r} in a JSON object")
        result[key] = value
    return result


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_values(payload: Any) -> None:
    """Refuse what JSON text can spell but no reader can use, naming where it is: NaN and ±Infinity
    (and numbers too large for a float), and lone UTF-16 surrogates (``"\\ud800"``) in any string or
    key, which no tokenizer can encode and no JSON answer can carry back."""
    stack: list[tuple[tuple, Any]] = [(("body",), payload)]
    while stack:
        loc, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise validation_error(loc, "NaN and Infinity are not valid JSON numbers here", "finite_number")
        if isinstance(value, str) and _LONE_SURROGATE.search(value):
            raise validation_error(
                loc, "text holds a lone UTF-16 surrogate (not valid Unicode)", "unicode_invalid"
            )
        if isinstance(value, dict):
            for key, item in value.items():
                if _LONE_SURROGATE.search(key):
                    raise validation_error(
                        loc, "a key holds a lone UTF-16 surrogate (not valid Unicode)", "unicode_invalid"
                    )
                stack.append(((*loc, key), item))
        elif isinstance(value, list):
            stack.extend(((*loc, index), item) for index, item in enumerate(value))


def _decoder(*, yielding: bool) -> json.JSONDecoder:
    decoder = json.JSONDecoder(object_pairs_hook=_reject_duplicate_keys)
    if yielding:
        # The pure-Python scanner parses arrays and objects in Python, so the GIL changes hands between
        # values (every few ms); the C scanner holds it through a whole array: 79 ms for 1.75M short
        # strings, which the event loop's thread waited out. ~6x slower, so only for large bodies.
        decoder.scan_once = json.scanner.py_make_scanner(decoder)
    return decoder


def parse_body(
    body: bytes, model: type[ModelT], *, yielding: bool = False, content_type: str | None = None
) -> ModelT:
    """Bytes → validated ``model``, every failure a 422 whose ``loc`` names the field (415 for a body
    that is not UTF-8). ``yielding``: parse with the scanner that lets other threads run between
    values (``parse_large_body``). A ``multipart/form-data`` body (Jev 1.14's image mode, on
    ``/v1/systemone`` only) is its JSON part, whose assets take the file parts by name."""
    if content_type is not None and is_multipart(content_type):
        return _parse_multipart(body, content_type, model, yielding=yielding)
    return _parse_json(body, model, yielding=yielding)


def _parse_multipart(body: bytes, content_type: str, model: type[ModelT], *, yielding: bool) -> ModelT:
    try:
        request, files = split_multipart(body, content_type)
    except MultipartRefused as refused:
        loc = ("body",) if refused.part is None else ("body", refused.part)
        raise validation_error(loc, str(refused), "multipart_invalid") from None
    parsed = _parse_json(request, model, yielding=yielding, context={"file_parts": files})
    unused = files.unused()
    if unused:
        raise validation_error(
            ("body", unused[0]),
            f"file part {unused[0]!r} is no asset's part: every image is named by an asset "
            '({"type": "image", "format": …, "part": "<part name>"})',
            "multipart_invalid",
        )
    return parsed


def _parse_json(
    body: bytes, model: type[ModelT], *, yielding: bool, context: dict[str, Any] | None = None
) -> ModelT:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise NotUtf8(
            f"the body is not UTF-8 (byte {error.start}); send JSON encoded as UTF-8", param="body"
        ) from None
    # ASCII-only UTF-16 and UTF-32 are valid UTF-8 (ASCII bytes and NULs); a NUL is never JSON text
    # (escaped as \u0000 inside strings), so one is another encoding. The text, not the bytes, goes to
    # json.loads, which would otherwise detect UTF-16/32 from the first bytes and read it anyway.
    nul = text.find("\x00")
    if nul >= 0:
        raise NotUtf8(
            f"the body holds a NUL byte (byte {len(text[:nul].encode())}): UTF-16 or UTF-32, not UTF-8; "
            "send JSON encoded as UTF-8",
            param="body",
        )
    try:
        # A leading UTF-8 byte-order mark is allowed (RFC 8259 lets a parser ignore it), as before.
        payload = _decoder(yielding=yielding).decode(text.removeprefix("\ufeff"))
    except DuplicateKey as error:
        raise validation_error(("body",), str(error), "duplicate_key") from None
    except ValueError as error:
        raise validation_error(("body",), f"body is not valid JSON: {error}", "json_invalid") from None
    except RecursionError:
        raise validation_error(("body",), "body nests JSON too deeply", "json_invalid") from None
    _check_values(payload)
    try:
        parsed = model.model_validate(payload, context=context)
    except ValidationError as error:
        # Jev keeps the question type in the path, as pydantic does: body.questions.q.score.criteria.
        raise RequestValidationError(
            [{**item, "loc": ("body", *item["loc"])} for item in error.errors(include_url=False)]
        ) from None
    if isinstance(parsed, SystemOneRequest):
        # Searching a large state for every image's name is parsing work: done here, in the parse's
        # thread for a large body; a refusal waits for the image-mode header's check
        # (``refuse_unplaced_images``).
        try:
            parsed.place_images()
        except ImageReferenceRefused as refused:
            parsed._image_refusal = refused
    return parsed


LARGE_PARSES_PER_ROUTE = 2
"""Bodies over ``INLINE_BODY_BYTES`` being parsed at once, per route. Parsing holds the GIL for most
of its time, so more threads parse no faster; each parse holds several times its body in Python
objects (ten 14 MB bodies at once took 1.2 GiB more), so the bound is what keeps that memory small."""
LARGE_PARSES_PER_TENANT = 1
"""Of those, one tenant's at most: a tenant sending large bodies in a loop holds one slot, and
another tenant's large body still finds the other."""


class ParseSlots:
    """The large-body parses running per route (``app.state.parse_slots``), in threads of their own:
    ``per_route`` at once on a route, ``per_tenant`` of them one tenant's, so one tenant sending
    large bodies cannot take every slot of a route from the others.

    A slot is given back when its parse ends, not when its request does: a client that leaves
    mid-parse cannot start another parse while the first one still runs."""

    def __init__(
        self, per_route: int = LARGE_PARSES_PER_ROUTE, per_tenant: int = LARGE_PARSES_PER_TENANT
    ) -> None:
        if not 1 <= per_tenant <= per_route:
            raise ValueError("need 1 <= per_tenant <= per_route")
        self.per_route = per_route
        self.per_tenant = per_tenant
        self.running: dict[str, int] = {}  # route → parses running
        self.tenants: dict[tuple[str, str], int] = {}  # (route, tenant) → parses running
        self._threads: ThreadPoolExecutor | None = None

    async def run(self, route: str, parse: Callable[[], ModelT], tenant: str = DEFAULT_TENANT) -> ModelT:
        """``parse()`` in a worker thread, or 529 ``overloaded_error`` (Retry-After 1) when the route's
        slots, or the tenant's share of them, are all taken: a parse takes about a second at most
        (16 MiB), so a retry then finds one."""
        if self.tenants.get((route, tenant), 0) >= self.per_tenant:
            raise Overloaded(
                f"{self.per_tenant} of this tenant's large bodies are being parsed on {route} already; "
                "retry shortly",
                retry_after_s=1,
            )
        if self.running.get(route, 0) >= self.per_route:
            raise Overloaded(
                f"{self.per_route} large bodies are being parsed on {route} already; retry shortly",
                retry_after_s=1,
            )
        if self._threads is None:
            self._threads = ThreadPoolExecutor(thread_name_prefix="opendecide-parse")
        loop = asyncio.get_running_loop()
        self.running[route] = self.running.get(route, 0) + 1
        self.tenants[(route, tenant)] = self.tenants.get((route, tenant), 0) + 1
        done = self._threads.submit(parse)
        # Called when the parse ends, or at once if it is cancelled before it started.
        done.add_done_callback(lambda _: _call_soon(loop, self._release, route, tenant))
        return await asyncio.wrap_future(done)

    def _release(self, route: str, tenant: str) -> None:
        self.running[route] -= 1
        self.tenants[(route, tenant)] -= 1
        if not self.tenants[(route, tenant)]:
            del self.tenants[(route, tenant)]  # no entry kept per tenant that ever sent a large body


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop has closed: the app is gone, its counts with it
        loop.call_soon_threadsafe(fn, *args)


MAX_COLLECTION_PAUSE_S = 5.0
"""How long parses may keep the collector paused without a collection between them."""


class _CollectionPause:
    """The cyclic garbage collector paused while large bodies are parsed (``paused()``, nestable across
    threads). Parsing a 14 MB body allocates millions of objects, and the collector's passes over them
    run inside the parse holding the GIL: the event loop stalled ~270 ms at a time, /healthz with it.
    None of the parsed objects form cycles (JSON builds trees; they are freed by reference count once
    validated), so nothing is lost by deferring collection for the parse's second.

    The pause is the whole process's, and parses that overlap keep it: one tenant sending large bodies
    back to back would leave every tenant's cyclic garbage uncollected for as long as it kept on. So
    a parse that ends more than ``MAX_COLLECTION_PAUSE_S`` after the pause began (or after the last
    such collection) while others go on collects once, in its own thread: at most one ~270 ms
    collection per interval, against memory that would grow without bound."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._parsing = 0
        self._clock = clock
        self._collected = 0.0  # when the pause began, or a parse last collected during it

    @contextlib.contextmanager
    def paused(self):
        with self._lock:
            self._parsing += 1
            if self._parsing == 1:
                self._was_enabled = gc.isenabled()
                gc.disable()
                self._collected = self._clock()
        try:
            yield
        finally:
            collect = False
            with self._lock:
                self._parsing -= 1
                if self._parsing == 0:
                    if self._was_enabled:
                        gc.enable()
                elif self._was_enabled and self._clock() - self._collected > MAX_COLLECTION_PAUSE_S:
                    collect, self._collected = True, self._clock()
            if collect:
                gc.collect()


COLLECTION_PAUSE = _CollectionPause()


def parse_large_body(body: bytes, model: type[ModelT], content_type: str | None = None) -> ModelT:
    """``parse_body`` for a large body, in a worker thread: the garbage collector paused, and the
    scanner that lets the GIL go between values."""
    with COLLECTION_PAUSE.paused():
        return parse_body(body, model, yielding=True, content_type=content_type)


async def parse_request(request: Request, model: type[ModelT]) -> ModelT:
    """The request's body as a validated ``model`` (``parse_body``): on the event loop for a small body,
    in a worker thread, within the route's parse slots, for one over ``INLINE_BODY_BYTES``."""
    body = await request.body()
    content_type = request.headers.get("content-type")
    if len(body) <= INLINE_BODY_BYTES:
        return parse_body(body, model, content_type=content_type)
    slots: ParseSlots = request.app.state.parse_slots
    tenant = request.scope.get("state", {}).get("caller", ANONYMOUS).tenant
    parse = functools.partial(parse_large_body, body, model, content_type)
    return await slots.run(request.url.path, parse, tenant)


# Jev 1.14 switches these modes on by header. Long context is never served: requests are read within
# the model's context. Image mode is served where the engine reads images (its start-up probe,
# ``Capabilities.images``); elsewhere a request that asks for either is refused by name instead of
# being read without it.
IMAGES_HEADER = "typesafe-danger-zone-images"
DANGER_ZONE_HEADERS = {
    IMAGES_HEADER: "images (Jev 1.14's Danger-Zone image mode) are not served: the served model reads text only",
    "typesafe-danger-zone-long-context": "Jev 1.14's 262k-token long-context mode is not served: requests are read within "
    "the served model's own context length (GET /v1/models)",
}


def header_on(request: Request, header: str) -> bool:
    """Whether a Danger-Zone header switches its mode on (any value but ``false``)."""
    value = request.headers.get(header)
    return value is not None and value.strip().lower() != "false"


def refuse_danger_zone(request: Request, engine: Any = None) -> None:
    """400 naming the header when a Danger-Zone mode this server does not serve is switched on; the
    image mode is served by an ``engine`` that reads images, and its refusal names the engine and model."""
    for header, message in DANGER_ZONE_HEADERS.items():
        if not header_on(request, header):
            continue
        if header == IMAGES_HEADER and engine is not None:
            if engine.capabilities.images:
                continue
            message = f"{message} (engine {engine.kind}, model {engine.info.name})"
        raise UnsupportedFeature(message, param=_header_name(header))


def refuse_assets_without_image_mode(request: Request, body: Any) -> None:
    """Jev's image assets without Jev's image-mode header: 400 naming the header, as Jev 1.14 asks
    for it before it reads an image."""
    if isinstance(body, SystemOneRequest) and body.assets and not header_on(request, IMAGES_HEADER):
        raise UnsupportedFeature(
            "image assets are Jev 1.14's image mode: send the header TypeSafe-Danger-Zone-Images: true",
            param=_header_name(IMAGES_HEADER),
        )


def refuse_unplaced_images(body: Any) -> None:
    """The refusal placing Jev's images found when the body was parsed
    (``SystemOneRequest.place_images``): 400 ``unsupported_feature`` naming a question's field that
    references one, 422 naming an image nothing references."""
    refused = getattr(body, "_image_refusal", None) if isinstance(body, SystemOneRequest) else None
    if refused is not None:
        if refused.code == "unsupported_feature":
            raise UnsupportedFeature(
                str(refused), param=".".join(str(part) for part in refused.loc[1:])
            ) from None
        raise validation_error(refused.loc, str(refused), "image_unreferenced") from None


def _header_name(header: str) -> str:
    return "-".join("TypeSafe" if part == "typesafe" else part.capitalize() for part in header.split("-"))


async def parse_for_model(
    request: Request, model: type[ModelT], *, aliases: tuple[str, ...] = JEV_ALIASES
) -> tuple[Reader, ModelT]:
    """The ready reader and the validated body, whose ``model`` (if given) must name the served model
    or one of ``aliases``."""
    reader = reader_of(request)
    refuse_danger_zone(request, reader.engine)
    body = await parse_request(request, model)
    refuse_assets_without_image_mode(request, body)
    refuse_unplaced_images(body)
    served = reader.engine.info.name
    asked = getattr(body, "model", None)
    if asked not in (None, served, *aliases):
        raise validation_error(
            ("body", "model"), f"unknown model {asked!r}; this server serves {served!r}", "unknown_model"
        )
    return reader, body
