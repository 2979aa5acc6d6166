"""Images a state carries, as the reader passes them to an engine that reads images.

A state with images is still the state's text (``ImageState`` is a ``str``), so every layer that
builds prompts, rotates options or prices reads handles it unchanged; only the engine call looks at
``ImageState.images`` (``ReadRequest.images``). The bytes are the caller's own, decoded and checked
by the service (``service/protocol/image_parts.py``): nothing here fetches anything.
"""

from __future__ import annotations

import base64
import collections
import functools
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StateImage:
    """One image of a state: its bytes, media type and size in pixels (read from its header)."""

    media_type: str
    data: bytes = field(repr=False)
    width: int
    height: int

    # Both computed once per image: a request's every read (pricing, each question's engine call)
    # asks for them, and a 12 MiB image's base64 text is 16 MB.
    @functools.cached_property
    def sha256(self) -> str:
        """The hex digest of the bytes: what ``x_reading.images`` reports, to trace a decision to its input."""
        return hashlib.sha256(self.data).hexdigest()

    @functools.cached_property
    def data_url(self) -> str:
        """The image as a ``data:`` URL, the only form the engine is sent (it fetches nothing either)."""
        return f"data:{self.media_type};base64,{base64.b64encode(self.data).decode('ascii')}"


class ImageState(str):
    """A state's text with the images that come before it in the prompt.

    A ``str`` so that prompt building, rotations and pricing take it as the text it is; an engine
    reads ``images`` (``state_images``). Slicing or joining it gives a plain ``str``: only the state
    object the reader is handed carries images.
    """

    images: tuple[StateImage, ...]

    def __new__(cls, text: str, images: Sequence[StateImage]) -> ImageState:
        state = super().__new__(cls, text)
        state.images = tuple(images)
        return state


def state_images(state: str) -> tuple[StateImage, ...]:
    """The images ``state`` carries: none for a plain ``str``."""
    return state.images if isinstance(state, ImageState) else ()


MAX_SIZES_KEPT = 128
"""Image sizes whose token counts one ``ImageTokens`` keeps: one entry each, so a caller sending images
of ever new sizes cannot grow it without bound. Past it, new sizes are priced from those kept."""
MAX_SALTS_KEPT = 1024
"""Cache salts ``ImageTokensBySalt`` keeps counts for, the least recently used forgotten first (its
images are then priced from the probe's count again until they are read)."""


class ImageTokens:
    """Prompt tokens an engine's model gives an image, as its engine reported them.

    The start-up probe counts one 8 × 8 image (``Capabilities.image_tokens``). LLaVA and Gemma give
    every image that count; Idefics3, Qwen2-VL and the like give a larger image more (tiles, or
    patches per pixel area). So every read of a state whose images share one size records the count
    the engine reported for them (its prompt tokens less the text's, ``observe``), and an image is
    estimated (``estimate``) at the count recorded for its size, else the largest of the probe's and
    those recorded for images of no more pixels: no processor gives a larger image fewer tokens, so
    the estimate is at most what the engine will count (but for an image under the probe's 8 × 8),
    and it is exact once an image of its size has been read. One per cache salt (``ImageTokensBySalt``):
    which sizes of image a tenant sent is its own, as its prompt cache is, so another tenant's prices
    and refusals never depend on them.
    """

    def __init__(self) -> None:
        self.by_size: dict[tuple[int, int], int] = {}

    def estimate(self, image: StateImage, probed: int) -> int:
        size = (image.width, image.height)
        if size in self.by_size:
            return self.by_size[size]
        pixels = image.width * image.height
        return max([probed, *(count for (w, h), count in self.by_size.items() if w * h <= pixels)])

    def total(self, images: Sequence[StateImage], probed: int) -> int:
        """The estimated tokens of ``images`` together."""
        return sum(self.estimate(image, probed) for image in images)

    def observe(self, images: Sequence[StateImage], image_prompt_tokens: int) -> None:
        """Record what the engine counted for ``images`` (its prompt tokens less the text's) where they
        share one size, so the count splits evenly between them; mixed sizes record nothing."""
        sizes = {(image.width, image.height) for image in images}
        if len(sizes) != 1 or image_prompt_tokens <= 0:
            return
        (size,) = sizes
        if size in self.by_size or len(self.by_size) < MAX_SIZES_KEPT:
            self.by_size[size] = image_prompt_tokens // len(images)


class ImageTokensBySalt:
    """An ``ImageTokens`` per cache salt (a tenant's, or its cache group's: ``ReadRequest.cache_salt``),
    at most ``MAX_SALTS_KEPT`` of them."""

    def __init__(self) -> None:
        self._by_salt: collections.OrderedDict[str | None, ImageTokens] = collections.OrderedDict()

    def for_salt(self, salt: str | None) -> ImageTokens:
        found = self._by_salt.get(salt)
        if found is None:
            found = self._by_salt[salt] = ImageTokens()
            if len(self._by_salt) > MAX_SALTS_KEPT:
                self._by_salt.popitem(last=False)
        self._by_salt.move_to_end(salt)
        return found


# vLLM refuses a prompt with more images than its --limit-mm-per-prompt allows with a 400 whose text
# is this (vllm/multimodal/processing/context.py, ``validate_num_items``, 0.32.0), which the engine
# passes on in its EngineBadReply; the limit itself is not in any endpoint the probe could ask.
_ENGINE_IMAGE_LIMIT = re.compile(r"At most (\d+) image\(s\) may be provided in one prompt")


def engine_image_limit(message: str) -> int | None:
    """The images per prompt an engine's refusal says it reads at most, or None if it says no such thing."""
    match = _ENGINE_IMAGE_LIMIT.search(message)
    return int(match.group(1)) if match else None
