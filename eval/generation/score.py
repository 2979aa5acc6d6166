"""Scoring generated answers: GSM8K final numbers and BFCL simple function calls. Pure functions.

**GSM8K.** The gold answer is the number after ``#### `` in the upstream ``answer``. A model's answer is
the *last* number in its text, with ``,`` and ``$`` stripped; right when the two are numerically equal
(``18`` = ``18.00``). A text with no number is wrong (``extracted`` None).

**BFCL simple** (the rules of BFCL's own ``ast_checker.simple_function_checker`` for Python, read at
gorilla commit ``a6da28ee``; this is our own code). One call must come back. Its name must be the
function's (or the name with ``.`` written ``_``, as OpenAI-style tool names must be). Then:

- every ``required`` parameter is present;
- every parameter given is a parameter of the function *and* of the possible answer;
- its type is the described one (``integer`` int, ``float`` float, ``string``/``any`` str, ``boolean`` bool,
  ``array``/``tuple`` list, ``dict`` dict; exact types, so ``true`` is no integer), with one coercion: an
  int where a float is described is read as that float; a value of the possible answer's own type is
  also accepted (BFCL's "variable" case); array items are checked one level deep;
- its value is one of the possible answer's values: strings compared after removing spaces and
  ``,./-_*^``, lower-cased and ``'`` read as ``"``; lists element-wise so; dicts key by key so; other
  values by equality (``5 == 5.0``);
- a possible-answer parameter left out is allowed only where ``""`` is among its values (optional).

Tool calls are read from the server's parsed ``tool_calls``. When there are none, a JSON call in the
text (``{"name": ..., "arguments": {...}}``, bare or inside ``<tool_call>`` tags or a code fence) is
parsed as a fallback, and the record says ``call_source: "text"`` so the two are reported apart.
"""

from __future__ import annotations

import json
import re
from typing import Any

# --- GSM8K --------------------------------------------------------------------------------------

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def gsm8k_gold(answer: str) -> str:
    """The number after ``#### `` in an upstream GSM8K answer (commas stripped)."""
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def extract_last_number(text: str) -> str | None:
    """The last number in ``text``, ``$`` and thousands commas stripped; None when there is none.

    >>> extract_last_number("She makes 9 * 2 = $18 a day. The answer is $1,018.")
    '1018'
    """
    matches = _NUMBER.findall(text.replace("$", ""))
    if not matches:
        return None
    return matches[-1].replace(",", "")


def numbers_equal(a: str, b: str) -> bool:
    try:
        return abs(float(a) - float(b)) < 1e-9 * max(1.0, abs(float(b)))
    except ValueError:
        return False


def score_gsm8k(text: str, gold_answer: str) -> dict[str, Any]:
    """``{"correct", "extracted", "gold"}`` for a model's answer text."""
    gold = gsm8k_gold(gold_answer)
    extracted = extract_last_number(text)
    return {
        "correct": extracted is not None and numbers_equal(extracted, gold),
        "extracted": extracted,
        "gold": gold,
    }


# --- BFCL simple ---------------------------------------------------------------------------------

PYTHON_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}
# BFCL's function types as OpenAI/JSON-schema tool types (what a server's tool parser is offered).
OPENAI_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}


def openai_tool(function: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function description as an OpenAI ``tools`` entry (its types as JSON schema's)."""

    def convert(schema: Any) -> Any:
        if isinstance(schema, dict):
            out = {key: convert(value) for key, value in schema.items()}
            if isinstance(out.get("type"), str):
                out["type"] = OPENAI_TYPES.get(out["type"], out["type"])
            return out
        if isinstance(schema, list):
            return [convert(item) for item in schema]
        return schema

    return {
        "type": "function",
        "function": {
            "name": function["name"],
            "description": function.get("description", ""),
            "parameters": convert(function["parameters"]),
        },
    }


def standardize(text: str) -> str:
    return re.sub(r"[ ,./\-_*^]", "", text).lower().replace("'", '"')


def _standardize_item(value: Any) -> Any:
    return standardize(value) if isinstance(value, str) else value


def _answer_type(values: list[Any]) -> type | None:
    for value in values:
        if value != "":
            return type(value)
    return None


def _type_ok(value: Any, values: list[Any], expected: type, nested: type | None) -> tuple[bool, bool]:
    """(type accepted, value is a "variable": the possible answer's type rather than the described one)."""
    answer_type = _answer_type(values)
    is_variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if nested is None:
            return True, is_variable
        for possible in values:
            # As BFCL's checker: a possible value that is no list (the optional "") passes the item check.
            if not isinstance(possible, list) or all(
                _type_ok(item, possible, nested, None)[0] for item in value
            ):
                return True, is_variable
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, False


def _dict_ok(value: dict, values: list[Any]) -> bool:
    for possible in values:
        if possible == "" or not isinstance(possible, dict):
            continue
        given_ok = all(
            key in possible and _standardize_item(item) in [_standardize_item(v) for v in possible[key]]
            for key, item in value.items()
        )
        missing_ok = all(key in value or "" in accepted for key, accepted in possible.items())
        if given_ok and missing_ok:
            return True
    return False


def _list_of_dicts_ok(value: list, values: list[Any]) -> bool:
    return any(
        isinstance(possible, list)
        and len(possible) == len(value)
        and all(isinstance(item, dict) and _dict_ok(item, [want]) for item, want in zip(value, possible))
        for possible in values
    )


def check_call(function: dict[str, Any], call: dict[str, Any], possible: dict[str, list[Any]]) -> str | None:
    """Why ``call`` (``{"name", "arguments"}``) does not match ``possible`` (parameter → accepted values)
    for ``function``; None when it matches."""
    name = function["name"]
    if call["name"] not in (name, name.replace(".", "_")):
        return f"wrong function name {call['name']!r}"
    arguments = call["arguments"]
    if not isinstance(arguments, dict):
        return "arguments are not an object"
    properties = function["parameters"]["properties"]
    for param in function["parameters"].get("required", []):
        if param not in arguments:
            return f"missing required parameter {param!r}"
    for param, value in arguments.items():
        if param not in properties or param not in possible:
            return f"unexpected parameter {param!r}"
        described = properties[param]["type"]
        expected = PYTHON_TYPES[described]
        nested = PYTHON_TYPES[properties[param]["items"]["type"]] if described in ("array", "tuple") else None
        if described == "float" and type(value) is int:
            value = float(value)  # BFCL accepts an int where a float is described
        accepted = possible[param]
        type_ok, is_variable = _type_ok(value, accepted, expected, nested)
        if not type_ok:
            return f"wrong type for {param!r}: {type(value).__name__}, described {described}"
        if not is_variable:
            if expected is dict:
                if not _dict_ok(value, accepted):
                    return f"wrong value for {param!r}: {value!r}"
                continue
            if expected is list and nested is dict:
                if not _list_of_dicts_ok(value, accepted):
                    return f"wrong value for {param!r}: {value!r}"
                continue
            if expected is str:
                if standardize(value) not in [standardize(v) for v in accepted if isinstance(v, str)]:
                    return f"wrong value for {param!r}: {value!r}"
                continue
            if expected is list:
                wanted = [[_standardize_item(v) for v in a] for a in accepted if isinstance(a, list)]
                if [_standardize_item(v) for v in value] not in wanted:
                    return f"wrong value for {param!r}: {value!r}"
                continue
        if value not in accepted:
            return f"wrong value for {param!r}: {value!r}"
    for param, accepted in possible.items():
        if param not in arguments and "" not in accepted:
            return f"missing parameter {param!r} (not optional in the possible answer)"
    return None


def score_bfcl(
    function: dict[str, Any], calls: list[dict[str, Any]], ground_truth: list[dict]
) -> dict[str, Any]:
    """``{"correct", "reason"}`` for the calls a model made; simple records accept exactly one call."""
    if len(calls) != 1:
        return {"correct": False, "reason": f"{len(calls)} calls, 1 expected"}
    (possible,) = ground_truth[0].values()
    reason = check_call(function, calls[0], possible)
    return {"correct": reason is None, "reason": reason}


def parse_arguments(arguments: Any) -> Any:
    """A tool call's ``arguments``: servers send a JSON string; unparseable text stays a string."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def server_calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The calls in a chat message's parsed ``tool_calls``."""
    return [
        {"name": call["function"]["name"], "arguments": parse_arguments(call["function"].get("arguments"))}
        for call in message.get("tool_calls") or []
        if call.get("type", "function") == "function"
    ]


_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_FENCED = re.compile(r"```(?:json)?\s*(.*?)```", re.S)


def text_calls(text: str) -> list[dict[str, Any]]:
    """Calls written as JSON in the text (the fallback when the server parsed none): each
    ``{"name", "arguments"|"parameters"}`` object (or a list of them) in ``<tool_call>`` tags, a code
    fence, or the text itself."""
    candidates = _TAGGED.findall(text) or _FENCED.findall(text) or [text.strip()]
    calls = []
    for candidate in candidates:
        try:
            parsed = json.loads(candidate)
        except json.JSONDecodeError:
            start = candidate.find("{")
            if start < 0:
                continue
            try:
                parsed, _ = json.JSONDecoder().raw_decode(candidate[start:])
            except json.JSONDecodeError:
                continue
        for item in parsed if isinstance(parsed, list) else [parsed]:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                arguments = item.get("arguments", item.get("parameters", {}))
                calls.append({"name": item["name"], "arguments": parse_arguments(arguments)})
    return calls
