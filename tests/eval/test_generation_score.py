"""Scoring tables: GSM8K final-number extraction and BFCL simple AST match (eval/generation/score.py)."""

from __future__ import annotations

import pytest

from eval.generation.datasets import DataMismatch, load_dataset, subset
from eval.generation.score import (
    check_call,
    extract_last_number,
    gsm8k_gold,
    openai_tool,
    score_bfcl,
    score_gsm8k,
    server_calls,
    text_calls,
)


@pytest.mark.parametrize(
    ("text", "extracted"),
    [
        ("The answer is 18.", "18"),
        ("She makes 9 * 2 = $18 every day.", "18"),
        ("Total: $1,234,567", "1234567"),
        ("First 3 apples, then 4 pears, so 7", "7"),
        ("It is -5 degrees", "-5"),
        ("x = 3.50", "3.50"),
        ("The answer is 18, not 17.", "17"),  # the last number, whatever the prose says
        ("12 eggs. ", "12"),  # a full stop is no decimal point
        ("no number here", None),
        ("", None),
        ("costs $.5", ".5"),
        ("1,000.", "1000"),
    ],
)
def test_gsm8k_extracts_the_last_number(text, extracted):
    assert extract_last_number(text) == extracted


@pytest.mark.parametrize(
    ("text", "gold", "correct"),
    [
        ("so she makes $18", "...\n#### 18", True),
        ("18.00", "#### 18", True),  # numeric compare, not text
        ("1,018", "#### 1018", True),
        ("1018", "#### 1,018", True),  # upstream gold with a comma
        ("-3", "#### -3", True),
        ("18 then 19", "#### 18", False),
        ("nothing", "#### 0", False),
        ("0.5", "#### .5", True),
    ],
)
def test_gsm8k_scores_numerically(text, gold, correct):
    assert score_gsm8k(text, gold)["correct"] is correct


def test_gsm8k_gold_of_the_first_upstream_problem():
    problem = load_dataset("gsm8k").problems[0]
    assert gsm8k_gold(problem.gold) == "18" and problem.id == "gsm8k-0"


AREA = {
    "name": "calc.area",
    "parameters": {
        "type": "dict",
        "properties": {
            "base": {"type": "integer"},
            "ratio": {"type": "float"},
            "unit": {"type": "string"},
            "sides": {"type": "array", "items": {"type": "integer"}},
            "options": {"type": "dict"},
            "exact": {"type": "boolean"},
        },
        "required": ["base"],
    },
}
POSSIBLE = {
    "base": [10],
    "ratio": [0.5, ""],
    "unit": ["square meters", ""],
    "sides": [[3, 4], ""],
    "options": [{"mode": ["fast", "quick"]}, ""],
    "exact": [True, ""],
}


@pytest.mark.parametrize(
    ("name", "arguments", "reason"),
    [
        ("calc.area", {"base": 10}, None),
        ("calc_area", {"base": 10}, None),  # OpenAI-style tool names write "." as "_"
        ("area", {"base": 10}, "wrong function name"),
        ("calc.area", {}, "missing required parameter 'base'"),
        ("calc.area", {"base": 10, "color": "red"}, "unexpected parameter 'color'"),
        ("calc.area", {"base": "10"}, "wrong type for 'base'"),  # no string → int coercion
        ("calc.area", {"base": 10.0}, "wrong type for 'base'"),  # no float → int either
        ("calc.area", {"base": True}, "wrong type for 'base'"),  # bool is not int
        ("calc.area", {"base": 11}, "wrong value for 'base'"),
        ("calc.area", {"base": 10, "ratio": 0.5}, None),
        ("calc.area", {"base": 10, "ratio": 1}, "wrong value for 'ratio'"),  # int read as 1.0, then compared
        ("calc.area", {"base": 10, "unit": "Square-Meters"}, None),  # strings standardised
        ("calc.area", {"base": 10, "unit": "square_meters."}, None),
        ("calc.area", {"base": 10, "unit": "square feet"}, "wrong value for 'unit'"),
        ("calc.area", {"base": 10, "sides": [3, 4]}, None),
        ("calc.area", {"base": 10, "sides": [4, 3]}, "wrong value for 'sides'"),  # order counts
        # As BFCL: the optional "" passes the item type check, and the value check fails it.
        ("calc.area", {"base": 10, "sides": ["3", "4"]}, "wrong value for 'sides'"),
        ("calc.area", {"base": 10, "options": {"mode": "Quick"}}, None),
        ("calc.area", {"base": 10, "options": {"mode": "slow"}}, "wrong value for 'options'"),
        ("calc.area", {"base": 10, "options": {"speed": "fast"}}, "wrong value for 'options'"),
        ("calc.area", {"base": 10, "exact": True}, None),
        ("calc.area", {"base": 10, "exact": "true"}, "wrong type for 'exact'"),
    ],
)
def test_bfcl_ast_match(name, arguments, reason):
    found = check_call(AREA, {"name": name, "arguments": arguments}, POSSIBLE)
    assert (found is None) if reason is None else (found is not None and found.startswith(reason)), found


def test_bfcl_int_for_float_is_accepted():
    function = {"name": "f", "parameters": {"properties": {"x": {"type": "float"}}, "required": ["x"]}}
    assert check_call(function, {"name": "f", "arguments": {"x": 2}}, {"x": [2.0]}) is None


def test_bfcl_array_items_of_another_type_fail_on_value():
    """As BFCL's checker: a list failing the item check is then read as a "variable" of the possible
    answer's type (list) and fails on the plain value comparison."""
    function = {
        "name": "f",
        "parameters": {
            "properties": {"x": {"type": "array", "items": {"type": "integer"}}},
            "required": ["x"],
        },
    }
    assert check_call(function, {"name": "f", "arguments": {"x": ["3"]}}, {"x": [[3]]}).startswith(
        "wrong value"
    )
    assert check_call(function, {"name": "f", "arguments": {"x": [3]}}, {"x": [[3]]}) is None


def test_bfcl_a_possible_answer_parameter_without_empty_is_not_optional():
    function = {
        "name": "f",
        "parameters": {"properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x"]},
    }
    assert check_call(function, {"name": "f", "arguments": {"x": 1}}, {"x": [1], "y": [2]}).startswith(
        "missing parameter 'y'"
    )


def test_bfcl_one_call_only():
    ground_truth = [{"calc.area": POSSIBLE}]
    call = {"name": "calc.area", "arguments": {"base": 10}}
    assert score_bfcl(AREA, [call], ground_truth)["correct"]
    assert not score_bfcl(AREA, [call, call], ground_truth)["correct"]
    assert score_bfcl(AREA, [], ground_truth)["reason"] == "0 calls, 1 expected"


def given(values):
    return next((value for value in values if value != ""), "")


def first_value(value):
    """A possible answer's value as a call gives it: its dicts (and lists of dicts) hold accepted-value
    lists per key, a call one value per key."""
    if isinstance(value, dict):
        return {key: first_value(given(values)) for key, values in value.items() if given(values) != ""}
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        return [first_value(item) for item in value]
    return value


def test_every_shipped_possible_answer_matches_itself():
    """A call built from each record's first accepted values matches: the checker and the data agree."""
    for problem in load_dataset("bfcl_simple").problems:
        # The function's name: BFCL checks against it (simple_363's possible answer names another).
        ((_, possible),) = problem.gold[0].items()
        name = problem.functions[0]["name"]
        # The first non-empty value (a few records list "" first, e.g. simple_200's required fuel_efficiency).
        arguments = {
            param: first_value(given(values)) for param, values in possible.items() if given(values) != ""
        }
        assert check_call(problem.functions[0], {"name": name, "arguments": arguments}, possible) is None, (
            problem.id
        )


def test_tools_are_offered_with_json_schema_types():
    tool = openai_tool(AREA)
    properties = tool["function"]["parameters"]["properties"]
    assert tool["function"]["parameters"]["type"] == "object"
    assert properties["ratio"]["type"] == "number" and properties["options"]["type"] == "object"
    assert properties["sides"] == {"type": "array", "items": {"type": "integer"}}


def test_server_calls_parse_the_arguments_string():
    message = {"tool_calls": [{"type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]}
    assert server_calls(message) == [{"name": "f", "arguments": {"x": 1}}]
    assert server_calls({"content": "hi", "tool_calls": []}) == []


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "f", "arguments": {"x": 1}}',
        '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>',
        'Sure:\n```json\n{"name": "f", "parameters": {"x": 1}}\n```',
        'I will call {"name": "f", "arguments": {"x": 1}} now',
        '[{"name": "f", "arguments": "{\\"x\\": 1}"}]',
    ],
)
def test_text_calls_fallback(text):
    assert text_calls(text) == [{"name": "f", "arguments": {"x": 1}}]


def test_text_without_a_call():
    assert text_calls("The area is 25.") == []


def test_datasets_load_checked():
    gsm8k, bfcl = load_dataset("gsm8k"), load_dataset("bfcl_simple")
    assert len(gsm8k.problems) == 1319 and len(bfcl.problems) == 400
    assert bfcl.problems[399].id == "simple_399" and len(bfcl.problems[0].functions) == 1
    assert gsm8k.mismatched == [] and bfcl.mismatched == []


def test_a_changed_file_is_refused_unless_allowed(monkeypatch):
    import eval.generation.datasets as data

    real = data.manifest()
    changed = {
        "datasets": {
            **real["datasets"],
            "gsm8k": {**real["datasets"]["gsm8k"], "files": {"gsm8k/test.jsonl": "0" * 64}},
        }
    }
    monkeypatch.setattr(data, "manifest", lambda: changed)
    with pytest.raises(DataMismatch, match="--allow-mismatch"):
        load_dataset("gsm8k")
    assert load_dataset("gsm8k", allow_mismatch=True).mismatched == ["gsm8k/test.jsonl"]


def test_seeded_subsets_are_stable_and_nested():
    problems = load_dataset("gsm8k").problems
    five, hundred = subset(problems, 5, 7), subset(problems, 100, 7)
    assert [p.id for p in five] == [p.id for p in subset(problems, 5, 7)]
    assert {p.id for p in five} <= {p.id for p in hundred}
    assert [p.id for p in hundred] == sorted((p.id for p in hundred), key=lambda i: int(i.split("-")[1]))
    assert subset(problems, None, 7) == problems


def test_licences_ship_beside_the_data():
    # Each dataset's upstream LICENSE (same commit, byte for byte) is a package file with its sha256.
    import hashlib
    from importlib import resources

    import eval.generation.datasets as data

    for task in ("gsm8k", "bfcl_simple"):
        ((name, sha),) = data.manifest()["datasets"][task]["licence_file"].items()
        text = resources.files("eval.data").joinpath(name).read_bytes()
        assert hashlib.sha256(text).hexdigest() == sha
    assert b"MIT License" in resources.files("eval.data").joinpath("gsm8k/LICENSE").read_bytes()
    assert b"Apache License" in resources.files("eval.data").joinpath("bfcl/LICENSE").read_bytes()
