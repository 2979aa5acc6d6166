"""Images in a request: decoded from the caller's bytes only, checked against the limits, never fetched.

Every wire format's image part (Jev 1.14's image assets, OpenAI's ``input_image``, Google's image
parts) comes here as text: a ``data:`` URL, or base64 with its media type. A URL of any other scheme
(``https:``, ``gs:``, ``file:``) is refused by name: the service makes no outbound request from caller
input (docs/security.md), so it never fetches one. Each image is checked before it is kept:

- its base64 length, before decoding (``MAX_IMAGE_BYTES``);
- its format, from its own first bytes (PNG, JPEG, GIF, WebP), which must agree with the declared
  media type;
- its size in pixels, read from the header (``MAX_IMAGE_PIXELS``), without decoding the pixels: a
  small file that decompresses to a huge bitmap is refused before any decoder sees it.

A request holds at most ``MAX_IMAGES`` (OpenAI's 128). Each refusal is an ``ImageRefused`` whose
message the route puts under the part's own path (a 422 or OpenAI/Google's 400 naming it).
"""

from __future__ import annotations

import base64
import binascii
import re
import struct

from readers.images import StateImage

MAX_IMAGES = 128
"""Images one request may carry: OpenAI's limit per request."""
MAX_IMAGE_BYTES = 8 * 1024 * 1024
"""Decoded bytes one image may take: half the decision body limit (16 MiB), which base64 (4/3) and
the rest of the body must also fit in."""
MAX_IMAGE_PIXELS = 4096 * 4096
"""Pixels (width × height) one image may have: a 4096² RGBA bitmap is 64 MiB once decoded, and
vision processors resize far below this (Gemma: 896², LLaVA: 336²)."""
MEDIA_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
_DATA_URL = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)(?P<params>(;[^,;]*)*?);base64,(?P<data>.*)", re.S)


class ImageRefused(ValueError):
    """An image part that is not read: the message says which limit or rule it breaks; ``code`` is
    ``unsupported_feature`` for a URL to fetch, else ``invalid_input``."""

    def __init__(self, message: str, code: str = "invalid_input") -> None:
        super().__init__(message)
        self.code = code


def image_from_url(url: str) -> StateImage:
    """A ``data:<type>;base64,<data>`` URL as an image; any other URL is refused, never fetched."""
    match = _DATA_URL.fullmatch(url.strip())
    if match is None:
        scheme = url.split(":", 1)[0][:16].lower() if ":" in url else ""
        if scheme == "data":
            raise ImageRefused("a data URL is read as base64: data:<media type>;base64,<data>")
        what = f"a {scheme}: URL" if scheme else "this URL"
        raise ImageRefused(
            f"{what} is not fetched: send the image inline as a data URL (data:image/png;base64,…); "
            "this service makes no outbound request for caller input",
            "unsupported_feature",
        )
    return image_from_base64(match.group("data"), match.group("type"))


def image_from_base64(data: str, media_type: str) -> StateImage:
    """Base64 bytes of ``media_type`` as an image, within the limits."""
    media_type = media_type.strip().lower()
    if media_type == "image/jpg":  # a common misspelling of the registered type
        media_type = "image/jpeg"
    if media_type not in MEDIA_TYPES:
        raise ImageRefused(f"media type {media_type[:64]!r} is not read; one of {', '.join(MEDIA_TYPES)}")
    data = data.strip()
    # 4 base64 characters carry 3 bytes: refuse an oversized image before decoding a byte of it.
    if len(data) // 4 * 3 > MAX_IMAGE_BYTES + 2:
        raise ImageRefused(f"the image is over {MAX_IMAGE_BYTES} bytes (about {len(data) // 4 * 3} bytes)")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ImageRefused("the image data is not valid base64") from None
    return image_from_bytes(raw, media_type)


def image_from_bytes(raw: bytes, media_type: str) -> StateImage:
    """An image's own bytes (a multipart file part's, or decoded base64) of ``media_type``, within the
    limits."""
    if len(raw) > MAX_IMAGE_BYTES:
        raise ImageRefused(f"the image is over {MAX_IMAGE_BYTES} bytes ({len(raw)} bytes)")
    found, width, height = image_header(raw)
    if found != media_type:
        raise ImageRefused(f"the image is declared {media_type} but its bytes are {found}")
    if width < 1 or height < 1:
        raise ImageRefused(f"the image is {width} × {height} pixels: empty")
    if width * height > MAX_IMAGE_PIXELS:
        raise ImageRefused(
            f"the image is {width} × {height} pixels; at most {MAX_IMAGE_PIXELS} pixels ({width * height})"
        )
    return StateImage(media_type=media_type, data=raw, width=width, height=height)


def image_header(raw: bytes) -> tuple[str, int, int]:
    """The media type and size in pixels an image's header declares; ImageRefused when no known
    format's header is there. Reads the header only: no pixel is decoded."""
    try:
        if raw.startswith(b"\x89PNG\r\n\x1a\n") and raw[12:16] == b"IHDR":
            width, height = struct.unpack(">II", raw[16:24])
            return "image/png", width, height
        if raw[:6] in (b"GIF87a", b"GIF89a"):
            width, height = struct.unpack("<HH", raw[6:10])
            return "image/gif", width, height
        if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
            return ("image/webp", *_webp_size(raw))
        if raw[:2] == b"\xff\xd8":
            return ("image/jpeg", *_jpeg_size(raw))
    except struct.error:
        raise ImageRefused("the image header is cut short") from None
    raise ImageRefused("the image is not a PNG, JPEG, GIF or WebP file")


def _webp_size(raw: bytes) -> tuple[int, int]:
    chunk = raw[12:16]
    if chunk == b"VP8X":  # extended: 24-bit width − 1 and height − 1
        return int.from_bytes(raw[24:27], "little") + 1, int.from_bytes(raw[27:30], "little") + 1
    if chunk == b"VP8L":  # lossless: 14-bit width − 1 and height − 1 after the 0x2f signature
        bits = int.from_bytes(raw[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8 ":  # lossy: 14-bit width and height after the frame's start code
        width, height = struct.unpack("<HH", raw[26:30])
        return width & 0x3FFF, height & 0x3FFF
    raise ImageRefused("the WebP image has no VP8, VP8L or VP8X header")


# Start-of-frame markers: every 0xC0–0xCF but DHT (C4), JPG (C8) and DAC (CC).
_JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_size(raw: bytes) -> tuple[int, int]:
    at = 2
    while at + 4 <= len(raw):
        if raw[at] != 0xFF:
            break
        marker = raw[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
            at += 2
            continue
        (length,) = struct.unpack(">H", raw[at + 2 : at + 4])
        if marker in _JPEG_FRAMES:
            height, width = struct.unpack(">HH", raw[at + 5 : at + 9])
            return width, height
        at += 2 + length
    raise ImageRefused("the JPEG image has no frame header")
