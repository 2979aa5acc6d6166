"""From an engine's log-probs to label probabilities: a pure function, no model involved.

Conventions (natural logs throughout):

- A label whose token came back keeps its log-prob. A label missing from a top-k reply gets the
  *floor*: the lowest log-prob the engine returned, minus ``floor_offset`` (5 by default). The read
  is then not exact, and the answer says so.
- Probabilities are a softmax over the label log-probs (floored where missing).
- Bounds: a missing label's true log-prob lies anywhere in (-inf, lowest returned]. Each label's
  probability bounds are the extremes of the softmax over that range; an exact read has lo == hi.
- ``label_mass`` is the vocabulary probability the returned labels hold (sum of exp), or None when
  the engine renormalised over the labels (a masked read) so the mass carries no information.
- If no label came back the read carries no information: ``informative`` is False, every bound is
  [0, 1], and the caller must not present the tie as an answer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from readers.engines.base import EngineReply, ReadMode
from readers.errors import EngineBadReply

DEFAULT_FLOOR_OFFSET = 5.0


@dataclass(frozen=True)
class LabelProbabilities:
    """Probabilities over the labels of one question, with how they were obtained."""

    logprobs: tuple[float | None, ...]
    """Per label, the log-prob the engine returned, or None where it was missing."""
    probabilities: tuple[float, ...]
    bounds: tuple[tuple[float, float], ...]
    returned: tuple[bool, ...]
    floor: float | None
    label_mass: float | None

    @property
    def labels_returned(self) -> int:
        return sum(self.returned)

    @property
    def exact(self) -> bool:
        return all(self.returned)

    @property
    def floor_used(self) -> bool:
        return self.floor is not None

    @property
    def informative(self) -> bool:
        return any(self.returned)


def softmax(logits: Sequence[float]) -> list[float]:
    """Numerically stable softmax of natural-log scores."""
    top = max(logits)
    weights = [math.exp(value - top) for value in logits]
    total = sum(weights)
    return [weight / total for weight in weights]


def label_probabilities(
    reply: EngineReply,
    label_ids: Sequence[int],
    *,
    floor_offset: float = DEFAULT_FLOOR_OFFSET,
) -> LabelProbabilities:
    """Turn one engine reply into label probabilities.

    Raises ``EngineBadReply`` when the reply cannot support a read: no log-probs at all, a
    non-finite value, or a label missing from a reply that claimed to cover every label.
    """
    if floor_offset < 0 or not math.isfinite(floor_offset):
        raise ValueError("floor_offset must be a finite, non-negative number")
    logprobs = reply.logprobs
    if not logprobs:
        raise EngineBadReply("engine reply carried no log-probs")
    for token_id, value in logprobs.items():
        if math.isnan(value) or value > 1e-6:
            raise EngineBadReply(f"engine returned log-prob {value!r} for token {token_id}")
    returned = tuple(token_id in logprobs and math.isfinite(logprobs[token_id]) for token_id in label_ids)
    if reply.read_mode is ReadMode.EXACT and not all(returned):
        missing = [token_id for token_id, ok in zip(label_ids, returned) if not ok]
        raise EngineBadReply(f"exact read is missing label tokens {missing}")

    label_logprobs = tuple(logprobs[token_id] if ok else None for token_id, ok in zip(label_ids, returned))
    label_mass = None if reply.normalised_over_labels else _mass(label_logprobs)

    if all(returned):
        probabilities = tuple(softmax([value for value in label_logprobs if value is not None]))
        bounds = tuple((p, p) for p in probabilities)
        return LabelProbabilities(label_logprobs, probabilities, bounds, returned, None, label_mass)

    finite = [value for value in logprobs.values() if math.isfinite(value)]
    if not finite:
        raise EngineBadReply("engine reply carried no finite log-probs")
    lowest = min(finite)
    floor = lowest - floor_offset
    if not any(returned):
        n = len(label_ids)
        return LabelProbabilities(
            label_logprobs, tuple([1.0 / n] * n), tuple([(0.0, 1.0)] * n), returned, floor, label_mass
        )

    filled = [value if value is not None else floor for value in label_logprobs]
    probabilities = tuple(softmax(filled))
    bounds = _bounds(label_logprobs, ceiling=lowest)
    return LabelProbabilities(label_logprobs, probabilities, bounds, returned, floor, label_mass)


def _mass(label_logprobs: Sequence[float | None]) -> float | None:
    values = [math.exp(value) for value in label_logprobs if value is not None]
    return sum(values) if values else None


def _bounds(label_logprobs: Sequence[float | None], *, ceiling: float) -> tuple[tuple[float, float], ...]:
    """Probability bounds when missing labels lie anywhere in (-inf, ceiling]."""
    return _interval_bounds(
        [ceiling if value is None else value for value in label_logprobs],
        [value is not None for value in label_logprobs],
    )


def _interval_bounds(highest: Sequence[float], known: Sequence[bool]) -> tuple[tuple[float, float], ...]:
    """Probability bounds when each label's log-prob is ``highest`` where ``known``, else anywhere in
    (-inf, highest].

    A known label is least likely when every unknown one sits at its highest and most likely when
    they all vanish; an unknown label is most likely alone at its highest, least likely at -inf.
    """
    shift = max(highest)
    weights = [math.exp(value - shift) for value in highest]
    present = sum(weight for weight, ok in zip(weights, known) if ok)
    unknown = sum(weight for weight, ok in zip(weights, known) if not ok)
    return tuple(
        (weight / (present + unknown), weight / present) if ok else (0.0, weight / (present + weight))
        for weight, ok in zip(weights, known)
    )


def chain_probabilities(
    nodes: Sequence[LabelProbabilities],
    paths: Sequence[Sequence[tuple[int, int]]],
    *,
    floor_offset: float = DEFAULT_FLOOR_OFFSET,
    normalised_over_labels: bool = False,
) -> LabelProbabilities:
    """Probabilities of multi-token labels by the chain rule: log P(label) = Σ log P(tokenᵢ | prompt, tokens<ᵢ).

    ``nodes`` are the reads of a token trie's nodes, each over its child tokens (from
    :func:`label_probabilities`); ``paths[k]`` lists label ``k``'s steps as (node index, child index).
    A label is returned when every token on its path came back; a missing token takes its node's
    floor in the point estimate and lies in (-inf, that node's lowest returned log-prob] in the
    bounds. ``floor`` is the lowest node floor used. With ``normalised_over_labels`` (masked reads)
    each node is renormalised over its children, so the product is the constrained distribution
    and ``label_mass`` is None.
    """
    filled, highest, returned, floors = [], [], [], []
    for path in paths:
        point = high = 0.0
        complete = True
        for node_index, child in path:
            node = nodes[node_index]
            value = node.logprobs[child]
            if value is None:
                assert node.floor is not None  # a missing child means the node was floored
                complete = False
                floors.append(node.floor)
                point, high = point + node.floor, high + node.floor + floor_offset
            else:
                point, high = point + value, high + value
        filled.append(point)
        highest.append(high)
        returned.append(complete)
    logprobs = tuple(value if ok else None for value, ok in zip(filled, returned))
    floor = min(floors) if floors else None
    label_mass = None if normalised_over_labels else _mass(logprobs)
    n = len(paths)
    if not any(returned):
        return LabelProbabilities(
            logprobs, tuple([1.0 / n] * n), tuple([(0.0, 1.0)] * n), tuple(returned), floor, label_mass
        )
    probabilities = tuple(softmax(filled))
    if all(returned):
        return LabelProbabilities(
            logprobs, probabilities, tuple((p, p) for p in probabilities), tuple(returned), None, label_mass
        )
    return LabelProbabilities(
        logprobs, probabilities, _interval_bounds(highest, returned), tuple(returned), floor, label_mass
    )
