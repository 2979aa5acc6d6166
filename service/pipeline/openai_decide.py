"""OpenAI's decision request → the Jev request the pipeline reads → OpenAI's answers.

There is one decision path: :func:`to_systemone` builds the same ``SystemOneRequest`` a Jev client
would send for the same state and questions (each OpenAI question becomes Jev's question object, the
input becomes the state by ``transcript.render_input``), ``decide.decide`` reads it exactly as it
reads ``/v1/systemone``, and :func:`to_decision_response` only renames the answers. So the same
state and question give the same probabilities on both routes, with the same prior correction,
calibration, debiasing and abstention.

Mapping (docs/openai-decisions.md has the full table):

- ``predicate`` → ``noul``; ``probability`` = P(true).
- ``choice`` → ``choice`` with one criterion per choice, in order; typed values map back by position.
- ``score`` → ``score`` with one criterion per level (``label`` or ``label: description``);
  ``value`` is the level's index, ``score`` the expected index.
- An abstained answer (``x_reading.abstained``: no label came back, or confidence under the
  question's ``x_min_confidence``) is a ``refusal``; its ``x_reading`` still says what was read.
"""

from __future__ import annotations

from pydantic import ValidationError

from service.pipeline.transcript import TRANSCRIPT_VERSION, TranscriptError, render_input
from service.protocol import ChoiceAnswer, NoulAnswer, ScoreAnswer, SystemOneRequest, SystemOneResponse
from service.protocol.image_parts import MAX_IMAGES, ImageRefused, image_from_url
from service.protocol.openai_answers import (
    ChoiceProbability,
    DecisionAnswer,
    DecisionChoiceAnswer,
    DecisionPredicateAnswer,
    DecisionProvenance,
    DecisionRefusal,
    DecisionResponse,
    DecisionScoreAnswer,
    DecisionUsage,
    InputTokensDetails,
    OutputTokensDetails,
    ScoreProbability,
)
from service.protocol.openai_decisions import DecisionChoiceQuestion, DecisionRequest, DecisionScoreQuestion
from service.protocol.questions import ImageAsset


def question_key(index: int) -> str:
    """The Jev question name of the question at ``index``: OpenAI's questions are a list whose
    ``name`` is optional and need not be unique, Jev's a map, so the position is the key."""
    return str(index)


def to_systemone(request: DecisionRequest) -> SystemOneRequest:
    """The Jev request for ``request``; TranscriptError (a 400 naming the field) where the input or a
    question cannot be read as Jev's, or an image is anywhere (the served models read text)."""
    image = request.images_in()
    if image is not None:
        message = (
            "input_image in a question's instructions is not read: images belong in input, the state "
            "every question shares"
        )
        raise TranscriptError(("body", *image), message, "unsupported_feature")
    assets = input_assets(request)
    state = render_input(request.input)
    questions = {}
    for index, question in enumerate(request.questions):
        try:
            questions[question_key(index)] = question.to_jev()
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            loc = ("body", "questions", index, question.type, *first["loc"])
            raise TranscriptError(loc, _message(first)) from None
    # Constructed, not validated: Jev's 64-question cap is Jev's; this route allows OpenAI's 400,
    # and admission still prices every read.
    return SystemOneRequest.model_construct(
        model=request.model, state=state, questions=questions, assets=assets or None, domain=None
    )


def input_assets(request: DecisionRequest) -> dict[str, ImageAsset]:
    """The input's ``input_image`` parts, decoded and checked, as the state's images; TranscriptError
    naming the part that breaks a limit or is not a data URL (never fetched)."""
    # Keyed by position: Jev names its assets, these formats only order them.
    assets: dict[str, ImageAsset] = {}
    for count, (where, part) in enumerate(request.input_images(), start=1):
        loc = ("body", *where)
        if count > MAX_IMAGES:
            raise TranscriptError(loc, f"a request holds at most {MAX_IMAGES} images")
        try:
            assets[str(count - 1)] = ImageAsset.from_image(image_from_url(part.image_url), loc)
        except ImageRefused as refused:
            raise TranscriptError(loc, f"input_image: {refused}", refused.code) from None
    return assets


def _message(item: dict) -> str:
    return str(item.get("msg", "invalid question")).removeprefix("Value error, ")


def to_decision_response(request: DecisionRequest, response: SystemOneResponse) -> DecisionResponse:
    """OpenAI's answers, in question order, from the pipeline's Jev answers."""
    answers: list[DecisionAnswer] = []
    for index, question in enumerate(request.questions):
        answer = response.answers[question_key(index)]
        reading = answer.reading
        if reading.abstained:
            answers.append(DecisionRefusal(name=question.name, reading=reading))
        elif isinstance(answer, NoulAnswer):
            answers.append(
                DecisionPredicateAnswer(name=question.name, probability=answer.noul, reading=reading)
            )
        elif isinstance(answer, ChoiceAnswer):
            assert isinstance(question, DecisionChoiceQuestion)
            # By the name each typed value was read as, never by position alone: every choice has
            # its own name and its own probability, or the answer is wrong and must not be sent.
            names = question.option_names()
            assert sorted(names) == sorted(answer.probabilities), "choices and probabilities differ"
            values = {name: choice.value for name, choice in zip(names, question.choices, strict=True)}
            answers.append(
                DecisionChoiceAnswer(
                    choice=values[answer.choice],
                    confidence=answer.confidence,
                    name=question.name,
                    probabilities=[
                        ChoiceProbability(probability=answer.probabilities[name], value=values[name])
                        for name in names
                    ],
                    reading=reading,
                )
            )
        else:
            assert isinstance(answer, ScoreAnswer) and isinstance(question, DecisionScoreQuestion)
            answers.append(
                DecisionScoreAnswer(
                    confidence=answer.confidence,
                    name=question.name,
                    probabilities=[
                        ScoreProbability(label=level.label, probability=p, value=value)
                        for value, (level, p) in enumerate(
                            zip(question.levels, answer.probabilities.values(), strict=True)
                        )
                    ],
                    score=answer.score,
                    reading=reading,
                )
            )
    return DecisionResponse(
        answers=answers,
        model=response.model,
        usage=decision_usage(response),
        provenance=DecisionProvenance(**response.provenance.model_dump(), input_rendering=TRANSCRIPT_VERSION),
    )


def decision_usage(response: SystemOneResponse) -> DecisionUsage:
    """OpenAI's usage from the readings' own counts.

    ``cached_tokens``: per answer, its prompt's tokens (``x_reading.prompt_tokens``, as counted in
    ``input_tokens``) less the tokens the engine reported computing for it
    (``x_reading.tokens_computed``: its prefix cache, or the state shared with another question of the
    request, supplied the rest); an answer whose engine reports nothing adds 0. Not
    ``tokens_reused``: a multi-token label's deeper trie reads reuse their whole prompt again, which
    ``input_tokens`` does not count, and the new label tokens they compute make this figure, if
    anything, low.
    """
    input_tokens = response.usage.input_tokens
    reused = sum(
        max(0, answer.reading.prompt_tokens - answer.reading.tokens_computed)
        for answer in response.answers.values()
        if answer.reading.tokens_computed is not None
    )
    output_tokens = response.usage.output_tokens
    return DecisionUsage(
        input_tokens=input_tokens,
        input_tokens_details=InputTokensDetails(
            cache_write_tokens=0, cached_tokens=min(reused, input_tokens)
        ),
        output_tokens=output_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
        total_tokens=input_tokens + output_tokens,
    )
