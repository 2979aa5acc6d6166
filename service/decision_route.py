"""The one path every decision route takes, whatever wire format it speaks.

Jev's ``/v1/systemone`` (= ``/decide``) and ``/decide/batch``, OpenAI's ``/v1/decisions``, and any
later format are adapters: each parses its own body model, translates it into Jev's request (the one
question model the pipeline reads, ``Asked``), and renders the pipeline's answer back. Everything
between is here, once, in this order:

1. the caller must hold the ``decide`` scope (403 before the body is read);
2. a full admission queue refuses at once (529 before the body is read or priced: a flood costs no work);
3. the body is parsed within the limits (``service/parse.py``: 422 naming the field; ``model`` must be
   the served model or one of the format's aliases);
4. the format translates it (``ask``; a translation error is its own 422/400 naming the field);
5. the reads are admitted by the prompt tokens they schedule (``service/pricing.py``), in the
   caller's tenant's fair share (``service/admission.py:admitted``), and marked as its reads;
6. the pipeline runs, cancelled if the client leaves or the app's deadline passes
   (``service/cancel.py``);
7. each answer is counted, and the model and decision ids go to the access log (``observed``);
8. the format renders the answer (``render``).

Errors are raised, not rendered, here: the app's exception handlers answer in this service's shape,
and a format whose errors look otherwise names its paths and its shape once in
``service/errors.py:ERROR_SHAPES`` (OpenAI's: ``openai_error``), which
``service/middleware/error_shape.py`` applies to whatever answered. So none of the steps above needs
to know which format a route speaks, and a new format adds a body model, ``ask``, ``render`` and one
``ERROR_SHAPES`` entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from readers.errors import EngineBadReply
from readers.images import engine_image_limit
from service.admission import admitted
from service.cancel import unless_disconnected
from service.errors import validation_error
from service.parse import parse_for_model
from service.pipeline.decide import decide, decide_batch
from service.protocol import BatchRequest, BatchResponse, SystemOneRequest, SystemOneResponse
from service.protocol.models import JEV_ALIASES
from service.scopes import require_scope

BodyT = TypeVar("BodyT", bound=BaseModel)


@dataclass(frozen=True)
class Asked:
    """A parsed body in the pipeline's terms: Jev's request (one state, or a batch of states asking
    the same questions), and the caller's routing key for its reads (single requests only)."""

    jev: SystemOneRequest | BatchRequest
    affinity_key: str | None = None

    def __post_init__(self) -> None:
        if self.affinity_key is not None and isinstance(self.jev, BatchRequest):
            raise ValueError("the batch pipeline (decide_batch) takes no affinity key")

    def states(self) -> list[str]:
        """The states the reads are about, each priced once by admission."""
        if isinstance(self.jev, BatchRequest):
            return [one.state_text() for one in self.jev.requests()]
        return [self.jev.state_for_reading()]


Decided = SystemOneResponse | BatchResponse


def as_asked(body: SystemOneRequest | BatchRequest, scope_state: dict) -> Asked:
    """Jev's own bodies need no translation."""
    return Asked(body)


def as_answered(body: Any, decided: Decided) -> BaseModel:
    """Jev's own answers need no renaming."""
    return decided


async def serve_decisions(
    request: Request,
    wire: type[BodyT],
    ask: Callable[[BodyT, dict], Asked] = as_asked,
    render: Callable[[BodyT, Decided], BaseModel] = as_answered,
    *,
    aliases: tuple[str, ...] = JEV_ALIASES,
) -> JSONResponse:
    """Answer one decision request whose body is a ``wire`` model.

    ``ask(body, scope_state)`` translates the parsed body into Jev's request; it may raise a
    validation error naming a field, and may note what the access log should carry in the request's
    ``scope_state``. ``render(body, decided)`` turns the pipeline's answer into the format's response.
    ``aliases``: model names, besides the served one, a body's ``model`` may give."""
    caller = require_scope(request.scope["state"], "decide", f"POST {request.url.path}")
    request.app.state.admission.refuse_if_full(
        caller.tenant
    )  # before the body is read and parsed: a flood costs no work
    reader, body = await parse_for_model(request, wire, aliases=aliases)
    asked = ask(body, request.scope["state"])
    refuse_unread_images(asked.jev, reader.engine)
    state = request.app.state
    context = {
        "request_id": request.scope["state"]["request_id"],
        "store": state.store,
        "images": state.images,
        "priors": state.priors,
        "tenant": caller.tenant,
    }

    # The engine takes turns between tenants' reads, and reuses a prompt only under its own salt; a
    # batch's reads are the batch tier for a router that schedules by priority.
    tier = "batch" if isinstance(asked.jev, BatchRequest) else "interactive"
    reads = reader.for_tenant(caller.tenant, caller.cache_salt, tier)

    async def work() -> Decided:
        if isinstance(asked.jev, BatchRequest):
            return await decide_batch(asked.jev, reads, **context)
        return await decide(asked.jev, reads, affinity_key=asked.affinity_key, **context)

    jobs = [(asked.states, asked.jev.questions, ("body",))]
    try:
        decided = await unless_disconnected(request, admitted(request, reads, jobs, work))
    except EngineBadReply as error:
        refuse_over_engine_image_limit(asked.jev, reader.engine, error)
        raise
    answer_sets = (
        [result.answers for result in decided.results]
        if isinstance(decided, BatchResponse)
        else [decided.answers]
    )
    observed(request, decided.model, answer_sets)
    return JSONResponse(render(body, decided).model_dump(mode="json"))


def refuse_unread_images(jev: SystemOneRequest | BatchRequest, engine: Any) -> None:
    """Refuses the first image part, naming the engine and its model, where the engine does not read
    images (the local engine; a vLLM serving a text-only model): an image is never dropped and the
    text read as if it had not been sent. In the validation shape, as the formats' other part
    refusals: Jev's 422 names the part (its image mode's header is refused before this), OpenAI's
    and Google's 400 name it as their SDKs read a field."""
    if isinstance(jev, SystemOneRequest) and jev.assets and not engine.capabilities.images:
        loc, _ = jev.image_parts()[0]
        message = (
            f"images are not read here: the {engine.kind} engine serves {engine.info.name}, which reads "
            "text only (GET /v1/models: reads_images)"
        )
        raise validation_error(loc, message, "unsupported_feature")


def refuse_over_engine_image_limit(
    jev: SystemOneRequest | BatchRequest, engine: Any, error: EngineBadReply
) -> None:
    """The engine refused more images in one prompt than it was started to read (vLLM's
    ``--limit-mm-per-prompt``, below this service's ``MAX_IMAGES``): the caller's request, not an
    engine fault, so refused in the validation shape naming the first image over the engine's limit
    (Jev's 422, OpenAI's and Google's 400), rather than answered 502."""
    limit = engine_image_limit(str(error))
    if limit is None or not isinstance(jev, SystemOneRequest):
        return
    parts = jev.image_parts()
    if len(parts) <= limit:
        return
    message = (
        f"the {engine.kind} engine serving {engine.info.name} reads at most {limit} images in one prompt "
        f"(its --limit-mm-per-prompt); this request has {len(parts)}"
    )
    raise validation_error(parts[limit][0], message, "too_many_images") from error


def observed(request: Request, model: str, answer_sets: Iterable[dict]) -> None:
    """Per-question metrics, and the model and decision ids for the access log."""
    metrics = request.app.state.metrics
    ids = request.scope["state"].setdefault("decision_ids", [])
    request.scope["state"]["model"] = model
    for answers in answer_sets:
        for answer in answers.values():
            metrics.observe_answer(model, answer.type, answer.reading)
            ids.append(answer.reading.decision_id)
