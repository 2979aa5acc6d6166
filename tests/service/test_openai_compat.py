"""In process: the input rendering, OpenAI's error shape, and Jev 1.14's features refused by name.

The SDK runs against real servers in test_openai_decisions.py (integration tier); here the pure parts
and the Jev route's refusals, over ASGI with a function engine (named as such: it reaches no model).
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import pytest

from readers.engines.base import EngineReply, ReadMode, ReadRequest
from readers.engines.routing import prefix_key
from service.admission import AdmissionLimits
from service.errors import openai_error, openai_param
from service.pipeline.openai_decide import to_systemone
from service.pipeline.transcript import TRANSCRIPT_VERSION, TranscriptError, render_input
from service.pricing import MAX_OPTION_NAME_TOKENS
from service.protocol.openai_decisions import DecisionRequest
from service.protocol.questions import MAX_OPTION_NAME_CHARS, MAX_QUESTION_NAME_CHARS
from tests.service.support import favour_first, function_engine, stalled_engine

QUESTION = {"type": "predicate", "instructions": "The parcel arrived."}


def request(input, questions=(QUESTION,)) -> DecisionRequest:
    return DecisionRequest.model_validate(
        {"model": "gpt-6-luna", "input": input, "questions": list(questions)}
    )


def test_a_string_input_is_the_state_unchanged():
    assert render_input(request("Great phone.").input) == "Great phone."


def test_an_item_array_renders_as_the_documented_transcript():
    items = [
        {"role": "developer", "content": [{"type": "input_text", "text": "Answer as the desk."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Where is it?"}, {"type": "input_json", "data": {"order": 17}}]},
        {"type": "function_call", "call_id": "c1", "name": "status", "arguments": '{"order": 17}'},
        {"type": "custom_tool_call", "call_id": "c2", "name": "grep", "input": "parcel"},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "in transit"}]},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "no match"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is on its way."}, {"type": "refusal", "refusal": "No date."}]},
    ]  # fmt: skip
    assert TRANSCRIPT_VERSION == "decide-transcript/1"  # the text below is this version's
    assert render_input(request(items).input) == (
        "[developer]\nAnswer as the desk.\n\n"
        '[user]\nWhere is it?\n{"order": 17}\n\n'
        '[tool call status, c1]\n{"order": 17}\n\n'
        "[tool call grep, c2]\nparcel\n\n"
        "[tool result status, c1]\nin transit\n\n"
        "[tool result grep, c2]\nno match\n\n"
        "[assistant]\nIt is on its way.\n(refused) No date."
    )


@pytest.mark.parametrize(
    "items, loc",
    [
        ([{"type": "function_call_output", "call_id": "c9", "output": "x"}], ("body", "input", 0, "call_id")),
        # A function output does not answer a custom tool call with the same id.
        ([{"type": "custom_tool_call", "call_id": "c1", "name": "g", "input": "x"},
          {"type": "function_call_output", "call_id": "c1", "output": "x"}], ("body", "input", 1, "call_id")),
        ([{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
          {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}], ("body", "input", 1, "call_id")),
    ],
)  # fmt: skip
def test_an_output_without_its_call_is_refused_naming_the_item(items, loc):
    with pytest.raises(TranscriptError) as raised:
        render_input(request(items).input)
    assert raised.value.loc == loc


@pytest.mark.parametrize(
    "input, questions, loc, code",
    [
        # A data URL whose bytes are no image; a URL to fetch; an image in a question's instructions.
        ([{"role": "user", "content": [{"type": "input_text", "text": "x"}, {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}],
         [QUESTION], ("body", "input", 0, "content", 1), "invalid_input"),
        ([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
          {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image", "image_url": "https://example.com/a.png"}]}],
         [QUESTION], ("body", "input", 1, "output", 0), "unsupported_feature"),
        ("x", [QUESTION, {"type": "predicate", "instructions": [{"type": "input_image", "image_url": "https://example.com/a.png"}]}],
         ("body", "questions", 1, "instructions", 0), "unsupported_feature"),
    ],
)  # fmt: skip
def test_an_image_that_cannot_be_read_is_refused_naming_where(input, questions, loc, code):
    with pytest.raises(TranscriptError) as raised:
        to_systemone(request(input, questions))
    assert raised.value.loc == loc and raised.value.code == code


def test_typed_choices_stay_distinct_options():
    question = {
        "type": "choice",
        "instructions": "x",
        "choices": [{"value": True}, {"value": "true"}, {"value": "maybe"}],
    }
    jev = to_systemone(request("x", [question])).questions["0"]
    assert list(jev.criteria) == ["true", '"true"', "maybe"]


def test_a_score_level_reads_as_its_label_and_description():
    question = {
        "type": "score",
        "instructions": "x",
        "levels": [{"label": "low"}, {"label": "high", "description": "very"}],
    }
    assert to_systemone(request("x", [question])).questions["0"].criteria == ["low", "high: very"]


@pytest.mark.parametrize(
    "status, body, expected",
    [
        (422, {"detail": [{"loc": ["body", "questions", 3, "choice", "choices"], "msg": "Value error, too few", "type": "value_error"}]},
         (400, {"message": "questions[3].choices: too few", "type": "invalid_request_error", "param": "questions[3].choices", "code": "value_error"})),
        (422, {"detail": [{"loc": ["body", "model"], "msg": "unknown model", "type": "unknown_model"}]},
         (404, {"message": "model: unknown model", "type": "not_found_error", "param": "model", "code": "model_not_found"})),
        (401, {"detail": {"error_type": "authentication_error", "message": "invalid API key", "param": "Authorization"}},
         (401, {"message": "invalid API key", "type": "authentication_error", "param": "Authorization", "code": "authentication_error"})),
        (529, {"detail": {"error_type": "overloaded_error", "message": "busy"}},
         (503, {"message": "busy", "type": "server_error", "param": None, "code": "overloaded_error"})),
        (405, {"detail": "Method Not Allowed"},
         (405, {"message": "Method Not Allowed", "type": "invalid_request_error", "param": None, "code": None})),
    ],
)  # fmt: skip
def test_every_error_shape_becomes_openais(status, body, expected):
    new_status, new_body = openai_error(status, body)
    assert (new_status, new_body["error"]) == expected


def test_param_names_fields_only():
    assert openai_param(["body", "input", 2, "message", "content", 0, "input_image"]) == "input[2].content[0]"
    assert openai_param("body") is None
    # Jev's criteria, where a rule checked on the translated question names them: OpenAI's field.
    assert openai_param(["body", "questions", "3", "choice", "criteria", "12"]) == "questions[3].choices"
    assert openai_param("body.questions.3.criteria") == "questions[3].choices"  # the reader's labels
    assert openai_param(["body", "questions", 3, "score", "criteria", 1]) == "questions[3].levels[1]"


@pytest.mark.anyio
@pytest.mark.parametrize("header", ["TypeSafe-Danger-Zone-Images", "TypeSafe-Danger-Zone-Long-Context"])
async def test_a_danger_zone_header_is_refused_naming_it_on_the_jev_route(
    client_factory, quick_engine, header
):
    body = {"state": "x", "questions": {"q": {"type": "noul", "instructions": "x"}}}
    async with client_factory(quick_engine) as client:
        refused = await client.post("/v1/systemone", json=body, headers={header: "true"})
        off = await client.post("/v1/systemone", json=body, headers={header: "false"})
    assert refused.status_code == 400
    detail = refused.json()["detail"]
    assert detail["error_type"] == "unsupported_feature" and detail["param"] == header
    assert off.status_code == 200


@pytest.mark.anyio
async def test_a_box_question_and_image_assets_are_refused_naming_the_feature(client_factory, quick_engine):
    async with client_factory(quick_engine) as client:
        box = await client.post(
            "/v1/systemone",
            json={"state": "x", "questions": {"where": {"type": "box", "instructions": "the cat"}}},
        )
        assets = await client.post(
            "/v1/systemone",
            json={
                "state": "x",
                "assets": [{"type": "image"}],  # Jev names its assets: a map, not a list
                "questions": {"q": {"type": "noul", "instructions": "x"}},
            },
        )
    assert box.status_code == 422 and "box question type" in box.json()["detail"][0]["msg"]
    assert assets.status_code == 422 and assets.json()["detail"][0]["loc"] == ["body", "assets"]


@pytest.mark.anyio
@pytest.mark.parametrize("model", ["jev-1.14.0", "jev-1.13.0", "jev-1.13-20260917", "jev-latest"])
async def test_jev_model_names_are_accepted(client_factory, quick_engine, model):
    async with client_factory(quick_engine) as client:
        response = await client.post(
            "/v1/systemone",
            json={"model": model, "state": "x", "questions": {"q": {"type": "noul", "instructions": "x"}}},
        )
    assert response.status_code == 200


@pytest.mark.anyio
async def test_prompt_cache_key_routes_and_safety_identifier_is_logged_as_an_id(
    local_engine, client_factory, caplog
):
    seen: list[ReadRequest] = []

    def record(request: ReadRequest):
        seen.append(request)
        return favour_first(request)

    body = {"model": "gpt-6-luna", "input": "x", "questions": [QUESTION, {**QUESTION, "instructions": "Another."}],
            "prompt_cache_key": "tenant-7", "safety_identifier": "user-42"}  # fmt: skip
    with caplog.at_level(logging.INFO, logger="opendecide.access"):
        async with client_factory(function_engine(local_engine, record, ReadMode.EXACT)) as client:
            response = await client.post("/v1/decisions", json=body)
    assert response.status_code == 200, response.text
    assert seen and {request.affinity_key for request in seen} == {"tenant-7"}
    # One key for every read, whatever its prompt: the router sends them to one engine.
    assert {prefix_key(request) for request in seen} == {prefix_key(replace(seen[0], prompt_ids=(1, 2, 3)))}
    assert prefix_key(replace(seen[0], affinity_key=None)) != prefix_key(seen[0])
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "opendecide.access"]
    assert logged[-1]["safety_identifier"] == "user-42" and logged[-1]["route"] == "/v1/decisions"


@pytest.mark.anyio
async def test_a_read_with_no_label_is_a_refusal_and_the_others_are_answered(local_engine, client_factory):
    # A top-k engine whose k tokens hold none of the first question's labels: no label came back.
    def labels_only_for_the_second(request: ReadRequest):
        if "Another." in local_engine.tokenizer.decode(list(request.prompt_ids)):
            return favour_first(request)
        others = [token for token in range(40) if token not in request.label_ids][:32]
        return EngineReply({token: -3.5 for token in others}, ReadMode.TOPK, len(request.prompt_ids), 1.0)

    body = {"model": "gpt-6-luna", "input": "x", "questions": [{**QUESTION, "name": "first"}, {**QUESTION, "instructions": "Another.", "name": "second"}]}  # fmt: skip
    async with client_factory(function_engine(local_engine, labels_only_for_the_second)) as client:
        response = await client.post("/v1/decisions", json=body)
    assert response.status_code == 200, response.text
    first, second = response.json()["answers"]
    assert first["type"] == "refusal" and first["name"] == "first"
    assert first["x_reading"]["informative"] is False and first["x_reading"]["labels_returned"] == 0
    assert second["type"] == "predicate" and second["name"] == "second"


def choice_question(values: list, **fields) -> dict:
    return {"type": "choice", "instructions": "Which?", "choices": [{"value": v} for v in values], **fields}


NAME_AND_OPTION_BOUNDS = [
    # (what is wrong, the question, the param the error names): refused before any read
    ("look-alike choices after NFKC", choice_question(["A", "\uff21"]), "questions[0].choices"),
    ("a zero-width space inside a choice", choice_question(["apple", "ap\u200bple"]), "questions[0].choices"),
    ("an invisible-only choice", choice_question(["\u200b", "b"]), "questions[0].choices"),
    # '"true"' is read as the quoted string "true" is beside a boolean true: one name, two values.
    ("two values read as one name", choice_question([True, "true", '"true"']), "questions[0].choices"),
    ("a full-width true beside a quoted one", choice_question([True, "true", "\uff54rue"]), "questions[0].choices"),
    ("a choice over its characters", choice_question(["A" * (MAX_OPTION_NAME_CHARS + 1), "B"]), "questions[0].choices"),
    ("a choice over its tokens", choice_question([" ".join(["word"] * (MAX_OPTION_NAME_TOKENS + 4)), "B"]), "questions[0].choices"),
    ("an empty question name", {**QUESTION, "name": ""}, "questions[0].name"),
    ("a blank question name", {**QUESTION, "name": "  "}, "questions[0].name"),
    ("a question name over its characters", {**QUESTION, "name": "q" * (MAX_QUESTION_NAME_CHARS + 1)}, "questions[0].name"),
]  # fmt: skip


@pytest.mark.anyio
@pytest.mark.parametrize("case", NAME_AND_OPTION_BOUNDS, ids=[case[0] for case in NAME_AND_OPTION_BOUNDS])
async def test_names_and_choices_are_bounded_and_distinct_as_on_the_jev_route(
    client_factory, local_engine, case
):
    _, question, param = case
    reads: list[ReadRequest] = []

    def counting(request: ReadRequest):
        reads.append(request)
        return favour_first(request)

    body = {"model": "gpt-6-luna", "input": "A fruit bowl.", "questions": [QUESTION, question]}
    async with client_factory(function_engine(local_engine, counting, ReadMode.EXACT)) as client:
        response = await client.post("/v1/decisions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param.replace("[0]", "[1]")
    assert reads == []


@pytest.mark.anyio
async def test_every_typed_choice_gets_its_own_probability(local_engine, client_factory):
    """A boolean true, the string "true" (read quoted) and a string beside them: three options, each
    answered with its own probability, mapped back by the name it was read as."""
    tokenizer = local_engine.tokenizer

    def favour(label: str):
        wanted = tokenizer.encode(label, add_special_tokens=False)[0]

        def read(request: ReadRequest):
            # About the state, the first token of the label wanted is likeliest; the content-free
            # reads of the prior correction are flat, so the correction leaves the lean as it is.
            about_state = state in tokenizer.decode(list(request.prompt_ids))
            lean = about_state and wanted in request.label_ids
            logprobs = {token: (-0.1 if lean and token == wanted else -4.0) for token in request.label_ids}
            return EngineReply(logprobs, ReadMode.EXACT, len(request.prompt_ids), 1.0)

        return read

    state = "A fruit bowl on the table."
    question = choice_question(["maybe", True, "true"])
    chosen = {}
    for label in (" maybe", " true", ' "'):
        engine = function_engine(local_engine, favour(label), ReadMode.EXACT)
        async with client_factory(engine) as client:
            response = await client.post(
                "/v1/decisions", json={"model": "gpt-6-luna", "input": state, "questions": [question]}
            )
        assert response.status_code == 200, response.text
        (answer,) = response.json()["answers"]
        assert [p["value"] for p in answer["probabilities"]] == ["maybe", True, "true"]
        top = max(answer["probabilities"], key=lambda p: p["probability"])
        assert answer["choice"] == top["value"] and type(answer["choice"]) is type(top["value"])
        chosen[label] = answer["choice"]
    assert chosen == {" maybe": "maybe", " true": True, ' "': "true"}


@pytest.mark.anyio
async def test_a_request_past_the_deadline_is_504_in_openais_shape(client_factory, local_engine):
    cancelled: list[str] = []
    engine = stalled_engine(local_engine, cancelled)
    # 2 s: time to reach the read on a loaded runner (test_bounds.py says why).
    async with client_factory(engine, admission=AdmissionLimits(deadline_s=2.0)) as client:
        response = await client.post(
            "/v1/decisions", json={"model": "gpt-6-luna", "input": "x", "questions": [QUESTION]}
        )
    assert response.status_code == 504, response.text
    error = response.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "deadline_exceeded"
    assert error["param"] == "deadline" and "2 s deadline" in error["message"]
    assert cancelled == ["read"]  # its work was stopped, not left running


@pytest.mark.anyio
@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "latin-1"])
async def test_a_body_not_utf8_is_415_in_openais_shape(client_factory, quick_engine, encoding):
    body = {"model": "gpt-6-luna", "input": "Café crème", "questions": [QUESTION]}
    async with client_factory(quick_engine) as client:
        response = await client.post(
            "/v1/decisions",
            content=json.dumps(body, ensure_ascii=False).encode(encoding),
            headers={"content-type": "application/json"},
        )
        same_in_utf8 = await client.post("/v1/decisions", json=body)
    assert response.status_code == 415, response.text
    error = response.json()["error"]
    assert error["code"] == "unsupported_media_type" and error["type"] == "invalid_request_error"
    assert error["param"] is None and "UTF-8" in error["message"]  # the body as a whole
    assert same_in_utf8.status_code == 200
