"""Jev 1.14's image mode over ``multipart/form-data``: the JSON request in one part, each image's bytes
in a file part of its own, which the request's ``assets`` name (``{"type": "image", "format": "png",
"part": "<part name>"}``, docs/images.md).

The body comes here already read within the route's body limit (``service/middleware/decompress.py``:
16 MiB decoded, whatever its content type), so splitting it holds no more than that; a body of more
parts than one request and ``MAX_IMAGES`` images is refused before any part is used. Each part is one
of two things, told apart by its ``Content-Type``: the request (``application/json``, exactly one),
or an image (``image/png``, ``image/jpeg``); anything else is refused naming the part, as is a file
part no asset uses, rather than the request being read without it.
"""

from __future__ import annotations

import email.parser
import email.policy
from dataclasses import dataclass, field
from email.message import EmailMessage

from service.protocol.image_parts import MAX_IMAGES

MAX_PARTS = MAX_IMAGES + 1
"""Parts one multipart request may have: its JSON request and one file part per image."""
FILE_PART_TYPES = ("image/png", "image/jpeg")
"""The media types a file part may declare: Jev 1.14 reads PNG and JPEG images only."""


class MultipartRefused(ValueError):
    """A multipart body that is not one JSON request and its images; ``part`` names the part at fault,
    where there is one."""

    def __init__(self, message: str, part: str | None = None) -> None:
        super().__init__(message)
        self.part = part


@dataclass(frozen=True)
class FilePart:
    """One image's bytes as its file part sent them, with the media type the part declared."""

    name: str
    media_type: str
    data: bytes = field(repr=False)


@dataclass
class FileParts:
    """A multipart request's file parts by name, and the names its assets used (``ImageAsset``), so
    that a part no asset names is refused instead of ignored (``unused``)."""

    parts: dict[str, FilePart]
    used: set[str] = field(default_factory=set)

    def take(self, name: str) -> FilePart:
        """The part ``name``, counted as used; KeyError when there is none."""
        part = self.parts[name]
        self.used.add(name)
        return part

    def unused(self) -> list[str]:
        return [name for name in self.parts if name not in self.used]


def is_multipart(content_type: str) -> bool:
    return content_type.partition(";")[0].strip().lower() == "multipart/form-data"


def split_multipart(body: bytes, content_type: str) -> tuple[bytes, FileParts]:
    """The JSON request's bytes and the file parts of a ``multipart/form-data`` body."""
    message = _parse(body, content_type)
    parts = list(message.iter_parts())
    if len(parts) > MAX_PARTS:
        raise MultipartRefused(
            f"a multipart request has at most {MAX_PARTS} parts (its JSON request and {MAX_IMAGES} "
            f"images), got {len(parts)}"
        )
    request: bytes | None = None
    files: dict[str, FilePart] = {}
    for index, part in enumerate(parts):
        name = part.get_param("name", header="content-disposition")
        if part.get_content_disposition() != "form-data" or not isinstance(name, str) or not name:
            raise MultipartRefused(
                f"multipart part {index} has no Content-Disposition: form-data with a name", f"#{index}"
            )
        media_type = part.get_content_type()
        data = part.get_payload(decode=True)
        assert isinstance(data, bytes), "a non-multipart part's payload decodes to bytes"
        if media_type == "application/json":
            if request is not None:
                raise MultipartRefused(
                    "a multipart request holds one application/json part (the request)", name
                )
            request = data
        elif media_type in FILE_PART_TYPES:
            if name in files:
                raise MultipartRefused(f"two file parts are named {name!r}", name)
            files[name] = FilePart(name, media_type, data)
        else:
            raise MultipartRefused(
                f"part {name!r} is {media_type}: a part is the request (application/json) or an image "
                f"({', '.join(FILE_PART_TYPES)})",
                name,
            )
    if request is None:
        raise MultipartRefused("a multipart request needs its JSON request in an application/json part")
    return request, FileParts(files)


def _parse(body: bytes, content_type: str) -> EmailMessage:
    # The stdlib MIME parser reads form-data as any multipart body; the part headers it needs are the
    # HTTP ones, so the request's own Content-Type heads the body it parses.
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1", "replace")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    assert isinstance(message, EmailMessage), "policy.HTTP builds EmailMessage objects"
    if not message.is_multipart() or not message.get_boundary():
        raise MultipartRefused("the multipart/form-data body has no boundary, or none of its parts")
    if message.defects or any(part.defects for part in message.iter_parts()):
        raise MultipartRefused("the multipart/form-data body is malformed (a boundary or header is broken)")
    return message
