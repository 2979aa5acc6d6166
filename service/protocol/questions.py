"""Requests: Jev's ``POST /v1/systemone`` body and its three question types, plus ``/decide/batch``.

Fields follow Jev's order (``typesafe-sdk`` 0.7 / the public OpenAPI schema); our extensions sit below
the ``# -- opendecide extensions`` markers.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from readers.debias import MAX_ROTATIONS, default_rotations, distinct_orders
from readers.errors import Loc
from readers.images import ImageState, StateImage
from readers.prompt import QuestionSpec, content_text
from service.protocol.base import BodyModel, Content, RequestModel, described
from service.protocol.confusables import skeleton
from service.protocol.image_parts import MAX_IMAGES, ImageRefused, image_from_base64, image_from_bytes
from service.protocol.multipart import FileParts

MIN_OPTIONS, MAX_OPTIONS = 2, 255
MIN_LEVELS, MAX_LEVELS = 2, 10
# Jev answers hundreds of questions about one state in one request, and OpenAI's Decisions API documents
# 1–400: one cap for both routes (one decision path). Admission prices what the reads compute, so the
# cap bounds the answer's size, not the work.
MAX_QUESTIONS = 400
MAX_QUESTION_NAME_CHARS = 200
MAX_OPTION_NAME_CHARS = 200
"""Option names are read token by token (one engine call per trie depth), so their tokens are bounded
too, where the tokenizer is at hand: ``service.pricing.MAX_OPTION_NAME_TOKENS``."""


def option_identity(name: str) -> str:
    """What makes two option names one option: compared after NFKC (a full-width "Ａ" is "A") with
    invisible format characters removed (a zero-width space, joiner or soft hyphen inside a name),
    since a reader sees both spellings as one name. Answers keep the name as sent."""
    folded = unicodedata.normalize("NFKC", name)
    return "".join(char for char in folded if unicodedata.category(char) != "Cf").strip()


def first_duplicate(names: Sequence[str]) -> tuple[int, int] | None:
    """The first two names (their indices) a reader would take for one: equal by
    :func:`option_identity`, or, where either has a character outside ASCII, with one confusable
    skeleton (Cyrillic "а" beside Latin "a"). Two ASCII names with one skeleton ("rn" and "m", "1" and
    "l") stay distinct: every tokenizer reads them apart, and callers write them on purpose."""
    by_identity: dict[str, int] = {}
    by_skeleton: dict[str, list[int]] = {}
    for index, name in enumerate(names):
        identity = option_identity(name)
        if identity in by_identity:
            return by_identity[identity], index
        by_identity[identity] = index
        alike = by_skeleton.setdefault(skeleton(identity), [])
        for earlier in alike:
            if not (names[earlier].isascii() and name.isascii()):
                return earlier, index
        alike.append(index)
    return None


def check_question_names(questions: dict[str, Any]) -> None:
    """Question names key the answers: each non-empty and at most ``MAX_QUESTION_NAME_CHARS``."""
    for name in questions:
        if not name.strip():
            raise ValueError("question names must not be empty")
        if len(name) > MAX_QUESTION_NAME_CHARS:
            raise ValueError(
                f"question name {name[:40]!r}… has {len(name)} characters; at most {MAX_QUESTION_NAME_CHARS}"
            )


# -- opendecide extensions: per-question read options, declared on each question type below Jev's fields
Debias = Annotated[
    Literal["rotate", "rotate_reverse"] | None,
    Field(
        alias="x_debias",
        description='"rotate": average reads over cyclic rotations of the option order; "rotate_reverse": over the rotations '
        "of the order and of its reverse (noul and choice)",
    ),
]
Rotations = Annotated[
    int | None,
    Field(
        alias="x_rotations",
        strict=True,  # the schema says integer: "3" or true is refused, not coerced
        ge=2,
        le=MAX_ROTATIONS,
        description=f"with x_debias: option orders to read (default: every distinct one, n or 2n, at most {MAX_ROTATIONS})",
    ),
]
MinConfidence = Annotated[
    float | None,
    Field(
        alias="x_min_confidence",
        strict=True,
        ge=0.0,
        le=1.0,
        description="below this confidence the answer is marked x_reading.abstained",
    ),
]


class ReadOptions(RequestModel):
    """The rules of the per-question read options (opendecide extensions, all optional; each question
    type declares the fields below Jev's, so the schema keeps Jev's field order).

    - ``x_debias: "rotate"``: read the question in ``x_rotations`` cyclic rotations of its option
      order and average (``readers/debias.py``); noul and choice only (score levels are ordered).
      ``x_rotations`` defaults to the option count (every option at every position once), capped at
      16; it may be 2 … the option count. ``"rotate_reverse"`` adds the rotations of the reversed
      order: up to 2n orders (n for 2 options), the default, capped at 16.
    - ``x_min_confidence`` in [0, 1]: an answer whose confidence (Jev's, ``service/pipeline/confidence.py``;
      for noul the choice formula over P(true), P(false)) is below it is marked
      ``x_reading.abstained: true``; its Jev fields are unchanged.
    """

    # One validator per rule, on the field itself, so the 422 names it (x_debias, x_rotations).
    @field_validator("debias", check_fields=False)
    @classmethod
    def check_debias_applies(cls, debias: str | None, info: ValidationInfo) -> str | None:
        if debias is not None and info.data.get("type") == "score":
            raise ValueError(f"{debias!r} does not apply to a score: its levels are ordered")
        return debias

    @field_validator("rotations", check_fields=False)
    @classmethod
    def check_rotations(cls, rotations: int | None, info: ValidationInfo) -> int | None:
        if rotations is None:
            return None
        method = info.data.get("debias")
        if method is None:
            raise ValueError('x_rotations needs x_debias ("rotate" or "rotate_reverse")')
        criteria = info.data.get("criteria")
        count = 2 if info.data.get("type") == "noul" else len(criteria) if criteria is not None else None
        if count is not None and rotations > distinct_orders(count, method):
            raise ValueError(
                f"{method} of {count} options reads at most {distinct_orders(count, method)} orders, got {rotations}"
            )
        return rotations

    def read_count(self) -> int:
        """Reads this question costs: its rotations, or 1."""
        if self.debias is None:
            return 1
        return self.rotations or default_rotations(len(self.to_spec().options), self.debias)


class NoulCriteria(RequestModel):
    true: Content | None = None
    false: Content | None = None


class NoulQuestion(ReadOptions):
    """A yes/no question; ``noul`` in the answer is P(true)."""

    type: Literal["noul"]
    instructions: Content | None = None
    criteria: NoulCriteria | None = None
    # -- opendecide extensions
    debias: Debias = None
    rotations: Rotations = None
    min_confidence: MinConfidence = None

    @model_validator(mode="after")
    def check_asks_something(self) -> NoulQuestion:
        criteria = self.criteria or NoulCriteria()
        if not described(self.instructions) and not (described(criteria.true) or described(criteria.false)):
            raise ValueError("a noul question needs instructions or a described outcome in criteria")
        return self

    def to_spec(self) -> QuestionSpec:
        criteria = self.criteria or NoulCriteria()
        return QuestionSpec(
            question_type="noul",
            instructions=_text_or_none(self.instructions),
            options=("true", "false"),
            descriptions=(_text_or_none(criteria.true), _text_or_none(criteria.false)),
        )


class ChoiceQuestion(ReadOptions):
    """One of 2–255 named options; descriptions may be null."""

    type: Literal["choice"]
    instructions: Content | None = None
    # Limits are checked by the validators below (their messages name the rule); the schema states them too.
    criteria: dict[str, Content | None] = Field(
        json_schema_extra={"minProperties": MIN_OPTIONS, "maxProperties": MAX_OPTIONS}
    )
    # -- opendecide extensions
    debias: Debias = None
    rotations: Rotations = None
    min_confidence: MinConfidence = None

    @field_validator("criteria")
    @classmethod
    def check_option_count(cls, criteria: dict[str, Content | None]) -> dict[str, Content | None]:
        if not MIN_OPTIONS <= len(criteria) <= MAX_OPTIONS:
            raise ValueError(f"a choice needs {MIN_OPTIONS} to {MAX_OPTIONS} options, got {len(criteria)}")
        return criteria

    @field_validator("criteria")
    @classmethod
    def check_option_names(cls, criteria: dict[str, Content | None]) -> dict[str, Content | None]:
        names = list(criteria)
        for name in names:
            if not option_identity(name):
                raise ValueError("option names must not be empty")
            if len(name) > MAX_OPTION_NAME_CHARS:
                raise ValueError(
                    f"option name {name[:40]!r}… has {len(name)} characters; at most {MAX_OPTION_NAME_CHARS}"
                )
        # Look-alike spellings ("é" composed or not, "Ａ" and "A", a zero-width space inside, Cyrillic
        # "а" and Latin "a") are one option named twice.
        if duplicate := first_duplicate(names):
            first, second = (names[index] for index in duplicate)
            raise ValueError(f"duplicate options {first!r} and {second!r}: a reader takes them for one")
        return criteria

    def to_spec(self) -> QuestionSpec:
        return QuestionSpec(
            question_type="choice",
            instructions=_text_or_none(self.instructions),
            options=tuple(self.criteria),
            descriptions=tuple(_text_or_none(value) for value in self.criteria.values()),
        )


class ScoreQuestion(ReadOptions):
    """A rubric of 2–10 ordered levels, counted from 0."""

    type: Literal["score"]
    instructions: Content | None = None
    criteria: list[Content] = Field(json_schema_extra={"minItems": MIN_LEVELS, "maxItems": MAX_LEVELS})
    # -- opendecide extensions
    debias: Debias = None
    rotations: Rotations = None
    min_confidence: MinConfidence = None

    @field_validator("criteria")
    @classmethod
    def check_level_count(cls, criteria: list[Content]) -> list[Content]:
        if not MIN_LEVELS <= len(criteria) <= MAX_LEVELS:
            raise ValueError(f"a score needs {MIN_LEVELS} to {MAX_LEVELS} levels, got {len(criteria)}")
        # Two levels with one text (or look-alike texts) could not be told apart by the reader, and
        # the expected level would average over a rubric the caller did not mean.
        if duplicate := first_duplicate([content_text(level) for level in criteria]):
            first, second = duplicate
            raise ValueError(f"criteria[{first}] and criteria[{second}] are the same level")
        return criteria

    def to_spec(self) -> QuestionSpec:
        return QuestionSpec(
            question_type="score",
            instructions=_text_or_none(self.instructions),
            options=tuple(str(level) for level in range(len(self.criteria))),
            descriptions=tuple(content_text(level) for level in self.criteria),
        )


Question = Annotated[NoulQuestion | ChoiceQuestion | ScoreQuestion, Field(discriminator="type")]


def _text_or_none(value: Content | None) -> str | None:
    return content_text(value) if described(value) else None


def refuse_box(questions: Any) -> Any:
    """Jev 1.14's ``box`` question (regions of an image) is refused by name, not as an unknown type."""
    if isinstance(questions, dict):
        for name, question in questions.items():
            if isinstance(question, dict) and question.get("type") == "box":
                raise ValueError(
                    f"question {name!r}: the box question type (Jev 1.14, regions of an image) is not served: "
                    "the served model reads text only"
                )
    return questions


JEV_IMAGE_FORMATS = {"png": "image/png", "jpeg": "image/jpeg", "jpg": "image/jpeg"}
"""Jev 1.14's image formats (PNG and JPEG only), as ``format`` names them, to their media types."""


class ImageAsset(RequestModel):
    """One image of the request (Jev 1.14's image mode, ``TypeSafe-Danger-Zone-Images``), under the
    name that stands for it in the request's text: its bytes in ``data_base64`` (standard base64, no
    ``data:`` prefix) or in the multipart file part ``part`` names (``service/protocol/multipart.py``).
    Decoded and checked here (``service/protocol/image_parts.py``); nothing is ever fetched. The other
    formats' image parts become these too (``from_image``), keeping the path of the part they came
    from for errors."""

    type: Literal["image"]
    format: Literal["png", "jpeg", "jpg"]
    data_base64: str | None = None
    part: str | None = None
    _image: StateImage | None = PrivateAttr(default=None)
    _loc: Loc | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def decode(self, info: ValidationInfo) -> ImageAsset:
        if (self.data_base64 is None) == (self.part is None):
            raise ValueError(
                "an image asset has either data_base64 (the image in base64) or part (a file part)"
            )
        media_type = JEV_IMAGE_FORMATS[self.format]
        try:
            if self.data_base64 is not None:
                self._image = image_from_base64(self.data_base64, media_type)
            else:
                self._image = image_from_bytes(_file_part(self.part or "", info), media_type)
        except ImageRefused as refused:
            raise ValueError(str(refused)) from None
        return self

    @classmethod
    def from_image(cls, image: StateImage, loc: Loc) -> ImageAsset:
        """An image another format's part carried, already decoded, refused under ``loc`` if need be."""
        # Constructed, not validated: ``format`` records the part's own type (GIF and WebP included).
        media = image.media_type.removeprefix("image/")
        asset = cls.model_construct(type="image", format=media, data_base64=None, part=None)
        asset._image, asset._loc = image, loc
        return asset

    def image(self) -> StateImage:
        assert self._image is not None, "an asset is decoded when validated or built by from_image"
        return self._image


def _file_part(name: str, info: ValidationInfo) -> bytes:
    """The bytes of the multipart file part ``name`` (``FileParts`` in the validation context)."""
    files = (info.context or {}).get("file_parts")
    if not isinstance(files, FileParts):
        raise ImageRefused(
            f"part {name!r} names a file part of a multipart/form-data request; this request is JSON: "
            "send the image in data_base64"
        )
    try:
        part = files.take(name)
    except KeyError:
        raise ImageRefused(f"the request has no file part named {name!r}") from None
    return part.data


class ImageReferenceRefused(Exception):
    """An image the request's text does not place where this server can read it: ``loc`` names the
    field, ``code`` is ``unsupported_feature`` (a reference in a question) or ``invalid_input`` (an
    image nothing references). Not a ValueError: raised by ``SystemOneRequest.place_images`` after
    validation, and turned into the route's error there (``service/parse.py``)."""

    def __init__(self, loc: Loc, message: str, code: str) -> None:
        super().__init__(message)
        self.loc, self.code = loc, code


def question_texts(name: str, question: Any) -> list[tuple[Loc, str]]:
    """Every text of a question in which a reference could stand: its instructions and each
    criterion's description, with the path of each."""
    texts: list[tuple[Loc, Any]] = [(("questions", name, "instructions"), question.instructions)]
    criteria = question.criteria
    if isinstance(criteria, NoulCriteria):
        texts += [
            (("questions", name, "criteria", side), getattr(criteria, side)) for side in ("true", "false")
        ]
    elif isinstance(criteria, dict):
        texts += [(("questions", name, "criteria", option), text) for option, text in criteria.items()]
    elif isinstance(criteria, list):
        texts += [(("questions", name, "criteria", level), text) for level, text in enumerate(criteria)]
    return [(loc, content_text(text)) for loc, text in texts if described(text)]


class SystemOneRequest(BodyModel):
    """``POST /v1/systemone`` and ``POST /decide``."""

    model: str | None = None
    state: Content
    questions: dict[str, Question] = Field(
        json_schema_extra={"minProperties": 1, "maxProperties": MAX_QUESTIONS}
    )
    assets: dict[str, ImageAsset] | None = Field(
        default=None,
        description="the request's images by the name that stands for each in its state (Jev 1.14's image "
        "mode: send TypeSafe-Danger-Zone-Images), read before the state's text in the order the state names "
        f"them; at most {MAX_IMAGES}; PNG or JPEG, in data_base64 or a multipart file part (part)",
    )
    # -- opendecide extensions
    domain: str | None = Field(default=None, max_length=200, description="calibration domain tag (optional)")
    _image_order: list[str] | None = PrivateAttr(default=None)
    _image_refusal: ImageReferenceRefused | None = PrivateAttr(default=None)
    """What ``place_images`` refused when the body was parsed, raised by the route after its header
    checks (``service/parse.py``)."""

    @field_validator("questions")
    @classmethod
    def check_has_questions(cls, questions: dict[str, Question]) -> dict[str, Question]:
        if not 1 <= len(questions) <= MAX_QUESTIONS:
            raise ValueError(f"a request asks 1 to {MAX_QUESTIONS} questions, got {len(questions)}")
        check_question_names(questions)
        return questions

    @field_validator("questions", mode="before")
    @classmethod
    def check_no_box(cls, questions: Any) -> Any:
        return refuse_box(questions)

    @field_validator("assets")
    @classmethod
    def check_image_count(cls, assets: dict[str, ImageAsset] | None) -> dict[str, ImageAsset] | None:
        if assets is not None and len(assets) > MAX_IMAGES:
            raise ValueError(f"a request holds at most {MAX_IMAGES} images, got {len(assets)}")
        return assets

    def state_text(self) -> str:
        return content_text(self.state)

    def image_parts(self) -> list[tuple[Loc, StateImage]]:
        """The state's images in order (``place_images``'s, else the map's), each with the path of the
        part it came from."""
        if not self.assets:
            return []
        order = getattr(self, "_image_order", None) or list(self.assets)
        return [
            (self.assets[name]._loc or ("body", "assets", name), self.assets[name].image()) for name in order
        ]

    def place_images(self) -> None:
        """Where Jev's text references each image (its name, matched as plain text): the reader puts a
        request's images before its state's text, which every question shares, in the order the state
        names them. ImageReferenceRefused naming the field for a reference in a question's instructions
        or criteria (an image there would be read with the state, not where it stands), and naming the
        asset for an image the request never references (Jev 1.14 refuses those too)."""
        if not self.assets:
            return
        state = self.state_text()
        texts = [
            (("body", "questions", name, question.type, *loc[2:]), text)
            for name, question in self.questions.items()
            for loc, text in question_texts(name, question)
        ]
        first: dict[str, int] = {}
        for name in self.assets:
            for loc, text in texts:
                if name in text:
                    raise ImageReferenceRefused(
                        loc,
                        f"image {name!r} is referenced in a question's {loc[4]}; this server reads a request's "
                        "images with its state, which all its questions share, and places no image inside a "
                        "question: reference it in state, and name it there (a state key in backticks)",
                        "unsupported_feature",
                    )
            at = state.find(name)
            if at < 0:
                raise ImageReferenceRefused(
                    ("body", "assets", name),
                    f"image {name!r} is not referenced in state: an image stands where its name is in the "
                    "request's text",
                    "invalid_input",
                )
            first[name] = at
        self._image_order = sorted(self.assets, key=first.__getitem__)

    def state_for_reading(self) -> str:
        """What the reader reads: the state's text, carrying its images where it has any
        (``readers.images.ImageState``)."""
        text = self.state_text()
        images = [image for _, image in self.image_parts()]
        return ImageState(text, images) if images else text


MAX_BATCH_STATES = 1024
MAX_BATCH_READS = 4096


class BatchRequest(BodyModel):
    """``POST /decide/batch``: many states, the same questions (opendecide extension)."""

    model: str | None = None
    states: list[Content] = Field(min_length=1, max_length=MAX_BATCH_STATES)
    questions: dict[str, Question] = Field(
        json_schema_extra={"minProperties": 1, "maxProperties": MAX_QUESTIONS}
    )
    domain: str | None = Field(default=None, max_length=200)
    assets: Any = Field(default=None, description="refused: a batch's states carry no images")

    @field_validator("assets")
    @classmethod
    def refuse_assets(cls, assets: Any) -> None:
        # Declared so that images are refused by name: an unknown field would be ignored, and the
        # states read as if no image had been sent.
        if assets is not None:
            raise ValueError("a batch reads text states only: send a state with images to /v1/systemone")
        return None

    @field_validator("questions", mode="before")
    @classmethod
    def check_no_box(cls, questions: Any) -> Any:
        return refuse_box(questions)

    @field_validator("questions")
    @classmethod
    def check_has_questions(cls, questions: dict[str, Question]) -> dict[str, Question]:
        return SystemOneRequest.check_has_questions(questions)

    @model_validator(mode="after")
    def check_total_reads(self) -> BatchRequest:
        reads = len(self.states) * sum(question.read_count() for question in self.questions.values())
        if reads > MAX_BATCH_READS:
            raise ValueError(
                f"a batch reads at most {MAX_BATCH_READS} states × questions (× rotations), got {reads}"
            )
        return self

    def requests(self) -> list[SystemOneRequest]:
        return [
            SystemOneRequest.model_construct(
                model=self.model, state=state, questions=self.questions, assets=None, domain=self.domain
            )
            for state in self.states
        ]
