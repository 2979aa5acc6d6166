"""Google's decision request → the Jev request the pipeline reads → Google's answers.

As for OpenAI's format (``openai_decide.py``), there is one decision path: :func:`to_systemone` builds
the ``SystemOneRequest`` a Jev client would send for the same state and questions (the caller's
question ids are the Jev names; the text parts of ``input`` are the state), ``decide.decide`` reads
it, and :func:`to_google_response` renames the answers. So the same state and question give the
same probabilities on all three routes (docs/gemini-decisions.md has the field table).

Google's ``confidence`` is the probability of the winning outcome (max(noul, 1 − noul), or the top
probability), not Jev's rescaled ``confidence``; an abstained answer (``x_reading.abstained``) is
still answered, since Google's format has no refusal: its ``x_reading`` says so.
"""

from __future__ import annotations

from pydantic import ValidationError

from service.pipeline.openai_decide import decision_usage
from service.pipeline.transcript import TranscriptError
from service.protocol import ChoiceAnswer, NoulAnswer, ScoreAnswer, SystemOneRequest, SystemOneResponse
from service.protocol.google_answers import (
    GoogleAnswer,
    GoogleChoiceAnswer,
    GoogleDecisionResponse,
    GoogleNoulAnswer,
    GoogleScoreAnswer,
    GoogleUsage,
    ModalityTokens,
)
from service.protocol.google_decisions import GoogleDecisionRequest, GoogleScoreQuestion, parts_text
from service.protocol.image_parts import MAX_IMAGES, ImageRefused, image_from_base64
from service.protocol.questions import ImageAsset


def to_systemone(request: GoogleDecisionRequest) -> SystemOneRequest:
    """The Jev request for ``request``; TranscriptError (a 400 naming the field) where a part is not
    text or a question cannot be read as Jev's."""
    media = request.media_part()
    if media is not None:
        where, kind = media
        message = f"{kind} parts are not supported: the served model reads text and images only"
        raise TranscriptError(("body", *where), message, "unsupported_feature")
    assets = image_assets(request)
    questions = {}
    for name, question in request.questions.items():
        try:
            questions[name] = question.to_jev()
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            loc = ("body", "questions", name, question.type, *first["loc"])
            raise TranscriptError(
                loc, str(first.get("msg", "invalid question")).removeprefix("Value error, ")
            ) from None
    # Constructed, not validated: Jev's question cap is Jev's; this route allows Google's 1,000, and
    # admission still prices every read.
    return SystemOneRequest.model_construct(
        model=request.model,
        state=parts_text(request.input_parts()),
        questions=questions,
        assets=assets or None,
        domain=None,
    )


def image_assets(request: GoogleDecisionRequest) -> dict[str, ImageAsset]:
    """The input's image parts, decoded and checked, as the state's images; TranscriptError naming
    the part that breaks a limit, has no inline data, or names a ``uri`` (never fetched)."""
    # Keyed by position: Jev names its assets, these formats only order them.
    assets: dict[str, ImageAsset] = {}
    for count, (where, part) in enumerate(request.image_parts(), start=1):
        loc = ("body", *where)
        if count > MAX_IMAGES:
            raise TranscriptError(loc, f"a request holds at most {MAX_IMAGES} images")
        fields = part.model_extra or {}
        data, mime_type = fields.get("data"), fields.get("mime_type")
        if not isinstance(data, str):
            message = (
                "image parts are not supported by uri: send the image inline, as base64 data with its "
                "mime_type; this service makes no outbound request for caller input"
            )
            raise TranscriptError(loc, message, "unsupported_feature")
        if not isinstance(mime_type, str):
            raise TranscriptError(loc, "image: inline data needs its mime_type (image/png, image/jpeg, …)")
        try:
            assets[str(count - 1)] = ImageAsset.from_image(image_from_base64(data, mime_type), loc)
        except ImageRefused as refused:
            raise TranscriptError(loc, f"image: {refused}", refused.code) from None
    return assets


def to_google_response(request: GoogleDecisionRequest, response: SystemOneResponse) -> GoogleDecisionResponse:
    """Google's answers, keyed by the caller's question ids, from the pipeline's Jev answers."""
    answers: dict[str, GoogleAnswer] = {}
    for name, question in request.questions.items():
        answer = response.answers[name]
        if isinstance(answer, NoulAnswer):
            answers[name] = GoogleNoulAnswer(
                confidence=max(answer.noul, 1 - answer.noul), noul=answer.noul, reading=answer.reading
            )
        elif isinstance(answer, ChoiceAnswer):
            answers[name] = GoogleChoiceAnswer(
                choice=answer.choice,
                confidence=answer.probabilities[answer.choice],
                probabilities=answer.probabilities,
                reading=answer.reading,
            )
        else:
            assert isinstance(answer, ScoreAnswer) and isinstance(question, GoogleScoreQuestion)
            answers[name] = GoogleScoreAnswer(
                confidence=max(answer.probabilities.values()),
                legend={str(index): level for index, level in enumerate(question.criteria)},
                probabilities=answer.probabilities,
                score=answer.score,
                reading=answer.reading,
            )
    return GoogleDecisionResponse(
        answers=answers, usage=google_usage(response), provenance=response.provenance
    )


def google_usage(response: SystemOneResponse) -> GoogleUsage:
    """Google's usage fields, counted as the OpenAI route counts them (``decision_usage``)."""
    counted = decision_usage(response)
    return GoogleUsage(
        input_tokens_by_modality=[ModalityTokens(tokens=counted.input_tokens)],
        total_cached_tokens=counted.input_tokens_details.cached_tokens,
        total_input_tokens=counted.input_tokens,
        total_output_tokens=counted.output_tokens,
        total_thought_tokens=0,
        total_tokens=counted.total_tokens,
    )
