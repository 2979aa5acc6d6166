"""Which option names a reader takes for one: the shipped UTS #39 table and the rule built on it."""

from __future__ import annotations

import gzip
import hashlib
from importlib.resources import files

import pytest

from service.protocol.confusables import DATA_FILE, DATA_SHA256, prototypes, skeleton
from service.protocol.questions import first_duplicate


def test_the_shipped_table_is_the_pinned_unicode_file():
    raw = gzip.decompress((files("service.protocol") / "unicode" / DATA_FILE).read_bytes())
    assert hashlib.sha256(raw).hexdigest() == DATA_SHA256
    assert b"# Version: 13.0.0" in raw[:400]
    # Every mapping line of the file is read (6,311 in version 13.0.0), none dropped by the parser.
    lines = [line for line in raw.decode("utf-8-sig").splitlines() if line.split("#", 1)[0].strip()]
    assert len(prototypes()) == len(lines) == 6311


@pytest.mark.parametrize(
    "a, b",
    [
        ("a", "\u0430"),  # Latin a, Cyrillic a
        ("Open", "\u039fpen"),  # Greek capital omicron
        ("paypal", "p\u0430yp\u0430l"),
        ("yes", "y\u0435s"),  # Cyrillic ie
    ],
)
def test_letters_from_another_script_share_a_skeleton(a, b):
    assert a != b and skeleton(a) == skeleton(b)
    assert first_duplicate([a, "other", b]) == (0, 2)


@pytest.mark.parametrize(
    "names, duplicate",
    [
        (["m", "rn"], None),  # one skeleton, but both plain ASCII: every tokenizer reads them apart
        (["1", "l", "I"], None),
        (["O", "0"], None),
        (["true", "True"], None),  # case is not folded for names (the OpenAI route's typed values are)
        (["cafe", "caf\u00e9"], None),  # an accent is a different word
        (["A", "\uff21"], (0, 1)),  # NFKC: a full-width A
        (["stop", "st\u200bop"], (0, 1)),  # a zero-width space inside
        (["caf\u00e9", "cafe\u0301"], (0, 1)),  # composed or not
        (["x", "y", "z"], None),
    ],
)
def test_first_duplicate(names, duplicate):
    assert first_duplicate(names) == duplicate
