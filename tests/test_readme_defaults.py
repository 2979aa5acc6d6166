"""What README.md and docs/architecture.md say about defaults and limits is what the code does.

Each statement is found by a pattern whose captured part must equal a value rendered from the code's own
constant: change the default and the sentence fails this test until it is rewritten. A statement the
pattern no longer finds fails too, so a reworded sentence is brought back under the check.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.pipeline.prior import DEFAULT_PRIOR_CORRECTION
from service.protocol.questions import MAX_LEVELS, MAX_OPTIONS, MAX_QUESTIONS, MIN_LEVELS, MIN_OPTIONS

ROOT = Path(__file__).resolve().parents[1]


def prior_types() -> str:
    """``choice and score``: the question types the default prior correction covers, as prose."""
    types = [t for t in ("noul", "choice", "score") if DEFAULT_PRIOR_CORRECTION.covers(t)]
    return " and ".join([", ".join(types[:-1]), types[-1]]) if len(types) > 1 else "".join(types)


# (file, pattern with one group, the group's value from the code)
STATEMENTS = [
    ("README.md", r"on by default for (\w+(?: and \w+)*) questions", prior_types),
    ("docs/architecture.md", r"(\w+(?: and \w+)*) questions by default", prior_types),
    ("README.md", r"one of (\d+–\d+) named options", lambda: f"{MIN_OPTIONS}–{MAX_OPTIONS}"),
    ("README.md", r"a rubric of (\d+–\d+) levels", lambda: f"{MIN_LEVELS}–{MAX_LEVELS}"),
    ("README.md", r"up to (\d+) questions", lambda: str(MAX_QUESTIONS)),
]


@pytest.mark.parametrize("file, pattern, expected", STATEMENTS, ids=[s[1] for s in STATEMENTS])
def test_a_stated_default_is_the_codes(file, pattern, expected):
    text = " ".join((ROOT / file).read_text().split())  # sentences wrap across lines
    found = re.findall(pattern, text)
    assert found, f"{file} no longer says {pattern!r}: reword the check with the sentence"
    assert set(found) == {expected()}, f"{file} says {found}, the code {expected()!r}"
