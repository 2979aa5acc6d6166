"""Look-alike names: Unicode's confusable skeletons (UTS #39), from the data file shipped beside this
module (``unicode/``: the file, its version, sha256 and licence).

A name's skeleton maps every character to the prototype Unicode lists for it, so names a reader takes
for one another (Cyrillic "а" and Latin "a", Greek "Ο" and Latin "O") share a skeleton. Option names
are compared this way because a caller who sends both would get one probability split between two
spellings of one label, and the answer could not say which was meant.
"""

from __future__ import annotations

import gzip
import hashlib
import unicodedata
from functools import cache
from importlib.resources import files

DATA_FILE = "confusables-13.0.0.txt.gz"
DATA_SHA256 = "96f2500ec78fd96f11561d4b40237435dfece70303b1db3c0974138a333aa206"  # of the decompressed file


@cache
def prototypes() -> dict[str, str]:
    """Character → its prototype, as ``confusables.txt`` lists them (each line ``source ; target ; MA``,
    code points in hex). Read once per process, on first use; a file that is not the pinned one is an
    installation fault, raised rather than compared against."""
    raw = gzip.decompress((files("service.protocol") / "unicode" / DATA_FILE).read_bytes())
    digest = hashlib.sha256(raw).hexdigest()
    if digest != DATA_SHA256:
        raise RuntimeError(f"{DATA_FILE}: sha256 {digest}, expected {DATA_SHA256}")
    table: dict[str, str] = {}
    for line in raw.decode("utf-8-sig").splitlines():
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        source, target, _kind = (field.strip() for field in entry.split(";"))
        table[chr(int(source, 16))] = "".join(chr(int(point, 16)) for point in target.split())
    return table


def skeleton(text: str) -> str:
    """UTS #39's skeleton: decomposed (NFD), each character replaced by its prototype, decomposed again."""
    table = prototypes()
    mapped = "".join(table.get(char, char) for char in unicodedata.normalize("NFD", text))
    return unicodedata.normalize("NFD", mapped)
