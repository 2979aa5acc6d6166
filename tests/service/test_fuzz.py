"""Schemathesis against the service's own OpenAPI document: every route, ≥ 1,000 generated cases
(valid and invalid), checks: no 5xx, status codes and bodies match the documented responses, every
4xx body has the error shape. The case count and the 5xx count are printed at the end of the run.

The app runs in process over ASGI with a function engine (named as such: it answers every read at
once from the embedded model's tokenizer, so the run stays within CI time); what is fuzzed is the
HTTP layer, parsing, validation, admission and the answer shapes. Reading itself is fuzzed on the
real model in tests/readers/test_reader_properties.py.
"""

from __future__ import annotations

import collections
import time

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import positive_data_acceptance

from calibration.open import open_store
from readers.engines.base import ReadMode
from service.app import create_app
from service.errors import GOOGLE_PREFIX, OPENAI_PATHS
from tests.service.support import RUN_SUMMARIES, favour_first, function_engine

KEY = "od-fuzz-key-0123456789abcdef"
CASES_PER_BODY_ROUTE = {GenerationMode.POSITIVE: 110, GenerationMode.NEGATIVE: 70}
CASES_PER_OTHER_ROUTE = 10


def error_shape(ctx, response, case) -> bool | None:
    """Every 4xx body is either the validation list or ``{"detail": {"error_type", "message"}}``; on
    OpenAI's route, ``{"error": {"message", "type", "param", "code"}}``; under Google's ``/v1beta/``,
    ``{"error": {"code", "message", "status", "details"}}`` with ``code`` the HTTP status."""
    if not 400 <= response.status_code < 500:
        return None
    if case.operation.path.startswith(GOOGLE_PREFIX):
        error = response.json()["error"]
        assert (
            set(error) <= {"code", "message", "status", "details"} and error["code"] == response.status_code
        ), error
        assert isinstance(error["message"], str) and isinstance(error["status"], str), error
        return True
    if case.operation.path in OPENAI_PATHS:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert isinstance(error["message"], str) and isinstance(error["type"], str), error
        return True
    detail = response.json()["detail"]
    if response.status_code == 422:
        assert isinstance(detail, list) and detail, detail
        assert all(set(item) == {"loc", "msg", "type"} for item in detail), detail
    else:
        assert isinstance(detail["error_type"], str) and isinstance(detail["message"], str), detail
    return True


@pytest.mark.slow  # over 1,000 generated requests through the whole HTTP stack
def test_generated_requests_never_get_a_5xx(local_engine, tmp_path):
    engine = function_engine(local_engine, favour_first, ReadMode.EXACT)
    app = create_app(engine, store=open_store(tmp_path / "fuzz.sqlite3"), api_keys=[KEY])
    config = SchemathesisConfig()
    # A generated body over its route's limit is refused by its size (413, before it is parsed): that
    # rejects negative data as much as a 422 does.
    config.projects.default.checks.negative_data_rejection.expected_statuses.append("413")
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)
    statuses: collections.Counter = collections.Counter()
    started = time.monotonic()
    operations = [result.ok() for result in schema.get_all_operations()]
    for operation in operations:
        has_body = operation.method.upper() == "POST"
        modes = CASES_PER_BODY_ROUTE if has_body else {GenerationMode.POSITIVE: CASES_PER_OTHER_ROUTE}
        for mode, examples in modes.items():

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=examples,
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            )
            def run(case):
                response = case.call_and_validate(
                    headers={"Authorization": f"Bearer {KEY}"},
                    # Schema-valid bodies may still break rules JSON Schema cannot state (a noul needs
                    # instructions or criteria; option names equal after NFC): those 422s are correct.
                    excluded_checks=[positive_data_acceptance],
                    additional_checks=[error_shape],
                )
                statuses[response.status_code] += 1

            run()
    total = sum(statuses.values())
    server_errors = sum(count for status, count in statuses.items() if status >= 500)
    RUN_SUMMARIES.append(f"schemathesis: {total} cases over {len(operations)} operations in {time.monotonic() - started:.0f} s; "
                         f"5xx: {server_errors}; by status: {dict(sorted(statuses.items()))}")  # fmt: skip
    assert total >= 1000 and server_errors == 0
