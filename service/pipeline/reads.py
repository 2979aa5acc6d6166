"""Question → read: the one translation of a wire question into what the reader reads.

Answers (``decide.py``), calibration examples (``examples.py``) and admission (``service/routes/
decisions.py``, which prices a request by its engine reads) all read a question through
:func:`to_read`, so a fit is made on reads made exactly as the answers it applies to are read, and a
request is admitted by the reads it will cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from readers.debias import ROTATE, read_many_rotated
from readers.errors import Loc
from readers.prompt import QuestionSpec
from readers.reader import Reader, Reading
from service.protocol import Question


@dataclass(frozen=True)
class PlannedRead:
    """One question as the reader reads it: its spec, the option orders read and averaged (1: as
    asked), the rotation method (``x_debias``), and where it sits in the body, for errors."""

    spec: QuestionSpec
    rotations: int
    method: str
    loc: Loc = ()

    def engine_reads(self) -> list[QuestionSpec]:
        """The spec once per order read: what admission prices (each rotation costs its prompt)."""
        return [self.spec] * self.rotations


def to_read(question: Question, loc: Loc = ()) -> PlannedRead:
    """How the service reads ``question`` (a wire question, ``service.protocol``)."""
    return PlannedRead(question.to_spec(), question.read_count(), question.debias or ROTATE, loc)


async def read_planned(
    reader: Reader, plans: Sequence[PlannedRead], state: str, *, affinity_key: str | None = None
) -> list[Reading]:
    """Every planned question about ``state`` in one engine call (``readers.debias.read_many_rotated``):
    their prompts share the state, which the engine reads once. ``affinity_key``: the caller's
    routing key for the reads (``ReadRequest.affinity_key``)."""
    return await read_many_rotated(
        reader,
        [plan.spec for plan in plans],
        state,
        rotations=[plan.rotations for plan in plans],
        methods=[plan.method for plan in plans],
        locs=[plan.loc for plan in plans],
        affinity_key=affinity_key,
    )
