"""A session with Google's official SDK against this service, request and answer printed.

    PYTHONPATH=$PWD python docs/examples/google_sdk.py

The service runs in this process (uvicorn on a free loopback port, the embedded model); the SDK
(``google-genai`` 3.3.0, unchanged) is pointed at it by its base URL alone, so it sends its default
``/v1/decisions`` with ``x-goog-api-key``, which the service serves as ``/v1beta/decisions``. The
printed answer is the SDK's parsed object as JSON, without the ``x_reading`` extension (shown once,
for the first answer).
"""

from __future__ import annotations

import json

from google import genai
from google.genai import types

from deploy.processes import serving
from readers.embedded import prepare_embedded_model
from readers.engines.local import LocalEngine
from service.app import create_app

REQUEST = {
    "model": "models/gemini-decision-1",
    "input": [
        {"type": "text", "text": "My parcel says delivered but it is not here. Order 17."},
        {"type": "text", "text": "Tracking: delivered on Wednesday, left by the bins."},
    ],
    "questions": {
        "unhappy": {"type": "noul", "instructions": "The customer is unhappy."},
        "action": {
            "type": "choice",
            "instructions": "What should the desk do?",
            "criteria": {"refund": "", "replace": "", "investigate": "ask the courier first"},
        },
        "urgency": {
            "type": "score",
            "instructions": "How urgent is this?",
            "criteria": ["low", "medium", "high"],
        },
    },
}


def main() -> None:
    with serving(create_app(LocalEngine(prepare_embedded_model()))) as url:
        client = genai.Client(api_key="unused", http_options=types.HttpOptions(base_url=url))
        print(f"client.decisions.create(**{json.dumps(REQUEST, indent=2)})\n")
        decision = client.decisions.create(**REQUEST)
    answer = decision.model_dump(mode="json", exclude_none=True)
    first = next(iter(answer["answers"]))
    reading = answer["answers"][first].pop("x_reading", None)
    for item in answer["answers"].values():
        item.pop("x_reading", None)
    print(json.dumps(answer, indent=2))
    print(f"\nanswers[{first!r}].x_reading:", json.dumps(reading, indent=2))


if __name__ == "__main__":
    main()
