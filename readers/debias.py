"""Order-debiased reads: a question read in k cyclic rotations of its option order, averaged.

A small model prefers options by their position in the prompt. Rotating the option order and
averaging each option's log-probability over the rotations cancels a position preference: with all
n cyclic rotations every option sits at every position exactly once.

- Rotation ``shift`` s puts option ``(i + s) mod n`` at position i. ``k`` rotations use the shifts
  ``round(j · n / k)``, j = 0 … k−1: evenly spread, and shift 0 (the order as asked) always first.
- What is averaged: each option's label-normalised log-probability, ``log p`` (floor included where a
  label was missing), then a softmax. On exact reads this equals averaging the raw label log-probs
  (the per-rotation normaliser is one constant per rotation, which the softmax removes).
- Rotations are mapped back to the options by option name, never by position, so label styles
  (words or letter codes) may differ between rotations.
- The k rotated questions about one state go into one ``Reader.read_many`` call with the request's
  other questions, so they share the state's prefix (its KV) in the engine.
- Agreement: the share of rotations whose own most probable option is the averaged answer's.
- ``rotate_reverse`` (our extension of the cyclic set): the rotations of the asked order and of its
  reverse, 2n orders for n ≥ 3 (for n = 2 the reverse is a rotation). Cyclic rotations alone put
  every option at every position, but each option keeps its neighbours; a reader sensitive to them
  still answers differently when the order is reversed. With all 2n orders, the asked order and its
  reverse read the same set of orders, so the answer no longer depends on which of the two was asked.
  Orders alternate between the two families (asked shift 0 first), each family evenly spread.

Score questions are not rotated: their levels are ordered and named by their position (digits).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from readers.probabilities import LabelProbabilities, softmax
from readers.prompt import QuestionSpec
from readers.reader import Reader, Reading, total_or_none

ROTATE = "rotate"
ROTATE_REVERSE = "rotate_reverse"
DEBIAS_METHODS = (ROTATE, ROTATE_REVERSE)
MAX_ROTATIONS = 16
"""A rotated question costs one read per rotation: 16 bounds that cost (questions with more options
get 16 evenly spread rotations by default)."""


@dataclasses.dataclass(frozen=True)
class RotatedReading(Reading):
    """A reading averaged over ``rotations`` option orders (a :class:`Reading`, in the asked order)."""

    rotations: int = 1
    rotation_agreement: float = 1.0
    rotation_choices: tuple[str, ...] = ()
    """Each rotation's most probable option, in read order."""


def distinct_orders(option_count: int, method: str) -> int:
    """How many distinct orders ``method`` can read: n rotations, or 2n with their reverses (n ≥ 3)."""
    return option_count * 2 if method == ROTATE_REVERSE and option_count > 2 else option_count


def default_rotations(option_count: int, method: str = ROTATE) -> int:
    """Every distinct order of ``method`` (all cyclic rotations: each option at each position once),
    capped at :data:`MAX_ROTATIONS`."""
    return min(distinct_orders(option_count, method), MAX_ROTATIONS)


def rotation_orders(option_count: int, k: int, method: str = ROTATE) -> tuple[tuple[int, ...], ...]:
    """``k`` option orders (option indices by position), the asked order first.

    >>> rotation_orders(3, 3)
    ((0, 1, 2), (1, 2, 0), (2, 0, 1))
    >>> rotation_orders(3, 2, ROTATE_REVERSE)
    ((0, 1, 2), (2, 1, 0))
    """
    n = option_count
    if method not in DEBIAS_METHODS:
        raise ValueError(f"unknown debias method {method!r}")
    if not 1 <= k <= distinct_orders(n, method):
        raise ValueError(f"{method} reads 1 to {distinct_orders(n, method)} orders of {n} options, got {k}")
    if method == ROTATE or n == 2:
        return tuple(_shifted(tuple(range(n)), s) for s in rotation_shifts(n, k))
    asked, reverse = rotation_shifts(n, (k + 1) // 2), rotation_shifts(n, k // 2) if k > 1 else ()
    backwards = tuple(reversed(range(n)))
    families = [_shifted(tuple(range(n)), s) for s in asked], [_shifted(backwards, s) for s in reverse]
    return tuple(order for pair in zip(*families) for order in pair) + tuple(families[0][len(families[1]) :])


def _shifted(order: tuple[int, ...], shift: int) -> tuple[int, ...]:
    return order[shift:] + order[:shift]


def rotation_shifts(option_count: int, k: int) -> tuple[int, ...]:
    """``k`` evenly spread cyclic shifts of ``option_count`` options, starting at 0.

    >>> rotation_shifts(6, 2)
    (0, 3)
    >>> rotation_shifts(4, 4)
    (0, 1, 2, 3)
    """
    if not 1 <= k <= option_count:
        raise ValueError(f"rotations must be between 1 and the option count {option_count}, got {k}")
    return tuple(round(j * option_count / k) for j in range(k))


def rotate(question: QuestionSpec, shift: int) -> QuestionSpec:
    """``question`` with its options (and their descriptions) cyclically shifted left by ``shift``."""
    return reorder(question, _shifted(tuple(range(len(question.options))), shift))


def reorder(question: QuestionSpec, order: Sequence[int]) -> QuestionSpec:
    """``question`` with option ``order[i]`` (and its description) at position i."""
    if question.question_type == "score":
        raise ValueError("score levels are ordered: they are not rotated")
    return dataclasses.replace(
        question,
        options=tuple(question.options[i] for i in order),
        descriptions=tuple(question.descriptions[i] for i in order),
    )


def expand_rotations(
    reader: Reader,
    questions: Sequence[QuestionSpec],
    state: str,
    rotations: Sequence[int],
    methods: Sequence[str] | None = None,
    locs: Sequence[tuple[str | int, ...]] | None = None,
) -> tuple[list[QuestionSpec], list[tuple[str | int, ...]], list[tuple[int, tuple[tuple[int, ...], ...]]]]:
    """The questions ``read_many_rotated`` reads about ``state``: each in its orders, the asked one
    first (one order where the layout's prompt ignores the order), their locs, and where each
    question's orders start. Admission prices a request by these reads (``service/pricing.py``)."""
    methods = list(methods) if methods is not None else [ROTATE] * len(questions)
    if not len(rotations) == len(methods) == len(questions):
        raise ValueError("read_many_rotated needs one rotation count and method per question")
    locs = list(locs) if locs is not None else [()] * len(questions)
    expanded, expanded_locs, spans = [], [], []
    for question, k, method, loc in zip(questions, rotations, methods, locs):
        if k > 1 and order_free(reader, question, state, loc):
            k = 1  # every order is the same prompt: one read is the average
        orders = (
            rotation_orders(len(question.options), k, method)
            if k > 1
            else (tuple(range(len(question.options))),)
        )
        spans.append((len(expanded), orders))
        expanded += [reorder(question, order) if i else question for i, order in enumerate(orders)]
        expanded_locs += [loc] * len(orders)
    return expanded, expanded_locs, spans


async def read_many_rotated(
    reader: Reader,
    questions: Sequence[QuestionSpec],
    state: str,
    *,
    rotations: Sequence[int],
    methods: Sequence[str] | None = None,
    locs: Sequence[tuple[str | int, ...]] | None = None,
    affinity_key: str | None = None,
) -> list[Reading]:
    """Every question about ``state`` read in ``rotations[i]`` orders of ``methods[i]`` (default
    ``rotate``; 1 = as asked, a plain :class:`Reading`) in ONE ``reader.read_many`` call; rotated
    questions come back as :class:`RotatedReading`."""
    expanded, expanded_locs, spans = expand_rotations(reader, questions, state, rotations, methods, locs)
    readings = await reader.read_many(expanded, state, locs=expanded_locs, affinity_key=affinity_key)
    out: list[Reading] = []
    for question, (start, orders) in zip(questions, spans):
        if len(orders) == 1:
            out.append(readings[start])
        else:
            out.append(combine(question, readings[start : start + len(orders)]))
    return out


def order_free(reader: Reader, question: QuestionSpec, state: str, loc: tuple[str | int, ...] = ()) -> bool:
    """Whether ``question``'s prompt is the same in every option order. Since decide-prompt/3 named
    options are not listed (descriptions in a canonical order), so their rotations are one prompt;
    codes are listed in order, so theirs are not. A shift and the reverse together move every
    option, so equal prompts for both mean the layout ignores the order."""
    n = len(question.options)
    asked = reader.prepare(question, state, loc=loc)[0].prompt_ids
    return all(
        reader.prepare(other, state, loc=loc)[0].prompt_ids == asked
        for other in (rotate(question, 1), reorder(question, tuple(reversed(range(n)))))
    )


def combine(question: QuestionSpec, readings: Sequence[Reading]) -> RotatedReading:
    """One reading of ``question`` from its rotated readings (the first is the order as asked)."""
    options = question.options
    per_rotation = [_by_option(reading) for reading in readings]
    mean_log_p = [
        sum(math.log(max(rot[o][0], 1e-300)) for rot in per_rotation) / len(readings) for o in options
    ]
    probabilities = tuple(softmax(mean_log_p))
    returned = tuple(all(rot[o][2] for rot in per_rotation) for o in options)
    raw = [[rot[o][1] for rot in per_rotation] for o in options]
    logprobs = tuple(
        sum(values) / len(values) if all(v is not None for v in values) else None for values in raw
    )
    floors = [r.label_probabilities.floor for r in readings if r.label_probabilities.floor is not None]
    masses = [r.label_probabilities.label_mass for r in readings]
    choices = tuple(max(options, key=lambda o, rot=rot: rot[o][0]) for rot in per_rotation)
    best = options[max(range(len(options)), key=probabilities.__getitem__)]
    label_probabilities = LabelProbabilities(
        logprobs=logprobs,
        probabilities=probabilities,
        bounds=_bounds(
            probabilities, [[rot[o][3] for rot in per_rotation] for o in options], exact=all(returned)
        ),
        returned=returned,
        floor=min(floors) if floors else None,
        label_mass=sum(masses) / len(masses) if all(m is not None for m in masses) else None,
    )
    first = readings[0]
    return RotatedReading(
        question=question,
        label_style=first.label_style,
        labels=first.labels,
        label_ids=first.label_ids,
        label_probabilities=label_probabilities,
        read_mode=first.read_mode,
        prompt_tokens=sum(r.prompt_tokens for r in readings),
        tokens_computed=total_or_none(r.tokens_computed for r in readings),
        tokens_reused=total_or_none(r.tokens_reused for r in readings),
        engine_latency_ms=max(r.engine_latency_ms for r in readings),
        latency_ms=max(r.latency_ms for r in readings),
        queued_ms=max(r.queued_ms for r in readings),
        features=_mean_features([r.features for r in readings]),
        rotations=len(readings),
        rotation_agreement=sum(choice == best for choice in choices) / len(choices),
        rotation_choices=choices,
    )


def _mean_features(features: Sequence[tuple[float, ...] | None]) -> tuple[float, ...] | None:
    """The answer slot's hidden state over the orders read (each order's prompt is its own): their
    mean, as the log-probs are averaged; None where an order has none."""
    if any(f is None for f in features):
        return None
    return tuple(sum(values) / len(values) for values in zip(*features))


def _by_option(reading: Reading) -> dict[str, tuple[float, float | None, bool, tuple[float, float]]]:
    """Option name → (probability, raw log-prob, returned, bounds) of one rotated reading."""
    read = reading.label_probabilities
    return {
        option: (read.probabilities[i], read.logprobs[i], read.returned[i], read.bounds[i])
        for i, option in enumerate(reading.question.options)
    }


def _bounds(
    probabilities: Sequence[float], rotation_bounds: Sequence[Sequence[tuple[float, float]]], *, exact: bool
) -> tuple[tuple[float, float], ...]:
    """Bounds on the averaged probabilities when some rotations missed labels.

    The averaged p_i is a normalised geometric mean over rotations; the normaliser is at most 1, so
    p_i ≥ the smallest rotation's lower bound, and p_i ≤ 1 − Σ_{j≠i} of those lower bounds.
    """
    if exact:
        return tuple((p, p) for p in probabilities)
    lows = [min(lo for lo, _ in bounds) for bounds in rotation_bounds]
    total = sum(lows)
    return tuple((lo, min(1.0, 1.0 - (total - lo))) for lo in lows)
