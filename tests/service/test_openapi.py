"""The OpenAPI document is complete and self-contained: valid OpenAPI 3.1, every $ref resolves, every
POST has its request schema, errors and limits are documented."""

from __future__ import annotations

import pytest
from openapi_spec_validator import validate

from calibration.open import open_store
from service.app import create_app


@pytest.fixture(scope="module")
def document(tmp_path_factory):
    store = open_store(tmp_path_factory.mktemp("openapi") / "c.sqlite3")

    async def never():  # the document does not depend on the engine
        raise AssertionError("not opened")

    return create_app(open_engine=never, store=store).openapi()


def refs(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def test_valid_openapi_3_1(document):
    assert document["openapi"].startswith("3.1")
    validate(document)


def test_every_ref_resolves_inside_the_document(document):
    schemas = document["components"]["schemas"]
    found = set(refs(document))
    assert found and all(ref.startswith("#/components/schemas/") for ref in found)
    assert not [ref for ref in found if ref.rsplit("/", 1)[1] not in schemas]
    assert "$defs" not in str(document)  # nothing left in a model's inline definitions


def test_every_post_has_its_request_schema_and_errors(document):
    posts = {path: item["post"] for path, item in document["paths"].items() if "post" in item}
    assert set(posts) == {
        "/v1/systemone",
        "/decide",
        "/decide/batch",
        "/v1/calibrations",
        "/v1/feedback",
        "/v1/calibrations/refit",
        "/v1/decisions",
        "/v1beta/decisions",
    }
    google = posts.pop("/v1beta/decisions")  # Google's route: its errors are Google's shape
    for code in ("400", "401", "403", "404", "429", "503", "504"):
        assert google["responses"][code]["content"]["application/json"]["schema"]["$ref"].endswith(
            "/GoogleErrorResponse"
        )
    openai = posts.pop("/v1/decisions")  # OpenAI's route: its errors are OpenAI's shape, 400 for validation
    for code in ("400", "401", "404", "413", "429", "503"):
        assert openai["responses"][code]["content"]["application/json"]["schema"]["$ref"].endswith(
            "/OpenAIErrorResponse"
        )
    for path, operation in posts.items():
        schema = operation["requestBody"]["content"]["application/json"]["schema"]
        assert schema["$ref"].startswith("#/components/schemas/"), path
        assert {"401", "413", "415", "422", "429"} <= set(operation["responses"]), path
        assert operation["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith(
            "ValidationErrorResponse"
        )
        assert operation["responses"]["401"]["content"]["application/json"]["schema"]["$ref"].endswith(
            "/ErrorResponse"
        )
    assert {"502", "503", "504", "529"} <= set(posts["/v1/systemone"]["responses"])


def test_limits_are_in_the_schemas(document):
    schemas = document["components"]["schemas"]
    questions = schemas["SystemOneRequest"]["properties"]["questions"]
    assert (questions["minProperties"], questions["maxProperties"]) == (1, 400)
    criteria = schemas["ChoiceQuestion"]["properties"]["criteria"]
    assert (criteria["minProperties"], criteria["maxProperties"]) == (2, 255)
    levels = schemas["ScoreQuestion"]["properties"]["criteria"]
    assert (levels["minItems"], levels["maxItems"]) == (2, 10)
    assert schemas["BatchRequest"]["properties"]["states"]["maxItems"] == 1024


def test_error_body_names_error_type_and_message(document):
    detail = document["components"]["schemas"]["ErrorDetail"]
    assert {"error_type", "message"} <= set(detail["required"])


def test_extensions_are_x_prefixed_in_the_schema(document):
    schemas = document["components"]["schemas"]
    assert (
        "x_reading" in schemas["ChoiceAnswer"]["properties"]
        and "reading" not in schemas["ChoiceAnswer"]["properties"]
    )
    assert "x_provenance" in schemas["SystemOneResponse"]["required"]
