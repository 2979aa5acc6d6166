"""Images a state carries, as the reader passes them to an engine that reads images.

A state with images is still the state's text (``ImageState`` is a ``str``), so every layer that
builds prompts, rotates options or prices reads handles it unchanged; only the engine call looks at
``ImageState.images`` (``ReadRequest.images``). The bytes are the caller's own, decoded and checked
by the service (``service/pipeline/image_parts.py``): nothing here fetches anything.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StateImage:
    """One image of a state: its bytes, media type and size in pixels (read from its header)."""

    media_type: str
    data: bytes = field(repr=False)
    width: int
    height: int

    @property
    def sha256(self) -> str:
        """The hex digest of the bytes: what ``x_reading.images`` reports, to trace a decision to its input."""
        return hashlib.sha256(self.data).hexdigest()

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
