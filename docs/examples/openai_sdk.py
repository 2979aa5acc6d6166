"""A session with OpenAI's official SDK against this service, request and answer printed.

    PYTHONPATH=$PWD python docs/examples/openai_sdk.py

The service runs in this process (uvicorn on a free loopback port, the embedded model); the SDK
(``openai`` 3.51.0, unchanged) is pointed at it by its base URL. The printed answers are the SDK's
parsed objects, dumped as JSON without the ``x_reading`` extension (shown once, for the first answer).
"""

from __future__ import annotations

import json

import openai

from deploy.processes import serving
from readers.embedded import prepare_embedded_model
from readers.engines.local import LocalEngine
from service.app import create_app

REQUEST = {
    "model": "gpt-6-luna",
    "input": [
        {"role": "user", "content": "My parcel says delivered but it is not here. Order 17."},
        {"type": "function_call", "call_id": "c1", "name": "order_status", "arguments": '{"order": 17}'},
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": "delivered on Wednesday, left by the bins",
        },
    ],
    "questions": [
        {"type": "predicate", "instructions": "The customer is unhappy.", "name": "unhappy"},
        {
            "type": "choice",
            "instructions": "What should the desk do?",
            "name": "action",
            "choices": [{"value": "refund"}, {"value": "replace"}, {"value": "investigate"}],
        },
        {
            "type": "score",
            "instructions": "How urgent is this?",
            "name": "urgency",
            "levels": [{"label": "low"}, {"label": "medium"}, {"label": "high"}],
        },
        {
            "type": "predicate",
            "instructions": "The parcel was stolen.",
            "name": "stolen",
            "x_min_confidence": 0.99,
        },
    ],
    "prompt_cache_key": "desk-7",
    "safety_identifier": "user-1234",
}


def main() -> None:
    with serving(create_app(LocalEngine(prepare_embedded_model()))) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        print(f"client.decisions.create(**{json.dumps(REQUEST, indent=2)})\n")
        decision = client.decisions.create(**REQUEST)
    answers = decision.model_dump(mode="json")
    reading = answers["answers"][0]["x_reading"]
    for answer in answers["answers"]:
        answer.pop("x_reading")
    print(json.dumps(answers, indent=2))
    print("\nanswers[0].x_reading:", json.dumps(reading, indent=2))


if __name__ == "__main__":
    main()
