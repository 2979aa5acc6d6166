"""A complete, self-contained OpenAPI 3.1 document: every ``$ref`` resolves, every POST has its request
schema, every route lists its 4xx/5xx responses, and the limits (1–400 questions, 2–255 options, 2–10
levels) are in the schemas. Generators and fuzzers (schemathesis) read it as it is.

Routes parse their own bodies (so a 422's ``loc`` is exact), so FastAPI cannot see their request
models: ``body_schema`` names the model in the route, and ``complete_openapi`` adds the models'
schemas to ``components`` in the validation (request) form.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from service.protocol import ErrorResponse, ValidationErrorResponse

REF = "#/components/schemas/{model}"
REQUEST_MODELS: dict[str, type[BaseModel]] = {}

DESCRIPTIONS = {
    400: "the body does not decode (Content-Encoding)",
    401: "missing or invalid API key (authentication_error)",
    403: "the API key lacks the scope this route needs (permission_error); the message names it",
    404: "unknown decision id",
    408: "the body did not arrive within the body timeout",
    413: "body, prompt (context length) or request cost over its limit; the limit is named",
    415: "not application/json, a body not UTF-8, or an unknown Content-Encoding",
    422: "validation error: each item's loc names the field",
    429: "this key's rate limit (rate_limit_error); Retry-After",
    502: "the engine answered without a usable read (fail-closed)",
    503: "the engine is not ready or unreachable; Retry-After",
    504: "the engine did not answer in time",
    529: "the admission queue is full (overloaded_error); Retry-After",
}


def body_schema(model: type[BaseModel], *, with_image_parts: bool = False) -> dict[str, Any]:
    """The route's ``openapi_extra``: a JSON request body of ``model``; ``with_image_parts`` adds Jev's
    image mode, ``multipart/form-data`` with the request as its one JSON part and the images as file
    parts its assets name (docs/images.md)."""
    REQUEST_MODELS[model.__name__] = model
    schema = {"$ref": REF.format(model=model.__name__)}
    content: dict[str, Any] = {"application/json": {"schema": schema}}
    if with_image_parts:
        content["multipart/form-data"] = {
            "schema": {
                "type": "object",
                "description": "Jev's image mode (header TypeSafe-Danger-Zone-Images: true): the one "
                "application/json part is the request, whatever its name; every other part a PNG or "
                "JPEG image, named by the part field of an asset",
                "properties": {"request": schema},
                "required": ["request"],
                "additionalProperties": {"type": "string", "contentMediaType": "image/png"},
            },
            "encoding": {"request": {"contentType": "application/json"}},
        }
    return {"requestBody": {"required": True, "content": content}}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a route: these statuses with their bodies."""
    return {
        code: {
            "model": ValidationErrorResponse if code == 422 else ErrorResponse,
            "description": DESCRIPTIONS[code],
        }
        for code in codes
    }


def complete_openapi(app: FastAPI) -> dict[str, Any]:
    """``app.openapi`` with the request models' schemas added to components (computed once)."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    document = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        description=app.description,
        routes=app.routes,
    )
    used = {
        name: model for name, model in REQUEST_MODELS.items() if _mentions(document, REF.format(model=name))
    }
    _, definitions = models_json_schema([(model, "validation") for model in used.values()], ref_template=REF)
    components = document.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in definitions.get("$defs", {}).items():
        if name in components and components[name] != schema:
            raise RuntimeError(f"two different schemas named {name!r} in the OpenAPI document")
        components[name] = schema
    app.openapi_schema = document
    return document


def _mentions(document: dict[str, Any], ref: str) -> bool:
    for item in document.get("paths", {}).values():
        for operation in item.values():
            schema = (
                operation.get("requestBody", {})
                .get("content", {})
                .get("application/json", {})
                .get("schema", {})
            )
            if schema.get("$ref") == ref:
                return True
    return False
