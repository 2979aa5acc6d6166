"""What a request costs: the prompt tokens its reads make the engine compute, counted as the engines count them.

Admission (``service/admission.py``) holds a request's cost against the work in flight and queued, and
the service's measured speed; so the cost must be the work the engine will do, not an upper bound of
another shape. A request is priced by building the prompts the pipeline will read (the same
``Reader.prepare`` the reads use, each question in every option order it is read in, and the
content-free prior reads a new question schedules) and counting **each distinct token once**:

- the prompts' distinct prefixes: the reads of one state share the system prompt and the state, and
  where the layout lists a question before the state, the question is shared across states (the
  content-free prior reads of a question share it with the question's own read);
- below each prompt, its answer slot's token-trie nodes, one token each (``readers/trie.py``): a
  255-option question adds the trie's distinct tokens, not levels × options;
- a state's images once per state, each at the tokens the engine gives an image of its size
  (``readers.images.ImageTokens``): the count its reads reported for that size, else the largest of
  its start-up probe's (``Capabilities.image_tokens``) and those reported for smaller images.

This is what the local engine computes for a request on an empty prefix cache (its reads report it:
``tokens_computed``), and what vLLM computes with prefix caching; with prompts already cached both
compute less, so a cost is at most the work. Pricing one request takes its tokenization, the reads'
own first step; a large body is priced off the event loop (``admitted``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from readers.debias import expand_rotations
from readers.images import state_images
from readers.prompt import QuestionSpec
from readers.reader import Reader, answer_trie

if TYPE_CHECKING:
    from service.pipeline.prior import OptionPriors
    from service.pipeline.reads import PlannedRead

Loc = tuple[str | int, ...]

MAX_OPTION_NAME_TOKENS = 32
"""Tokens in one option name at most: a name is read token by token (one engine call per depth of the
options' token trie, and again on each content-free state the first time a question is seen), so its
tokens bound a request's sequential engine calls. Characters are bounded in the wire model
(``service.protocol.questions.MAX_OPTION_NAME_CHARS``)."""


def distinct_tokens(reader: Reader, reads: Iterable[tuple[QuestionSpec, str, Loc]]) -> int:
    """Prompt tokens the engine computes for ``reads`` (question, state, loc) with nothing cached:
    the distinct prefixes of their prompts plus each distinct prompt's answer-trie nodes below it.
    Raises what ``Reader.prepare`` raises (a question or state that cannot be read, naming ``loc``)."""
    below: dict[tuple[int, ...], int] = {}
    images: dict[tuple[str, ...], int] = {}  # a state's images' tokens, by their digests: once per state
    probed = reader.engine.capabilities.image_tokens
    for spec, state, loc in reads:
        carried = state_images(state)
        if carried:
            images[(state, *(image.sha256 for image in carried))] = reader.image_tokens.total(carried, probed)
        slot, style = reader.prepare(spec, state, loc=loc)
        # The root is the prompt's own last token; every other node adds one token under it.
        below[slot.prompt_ids] = max(below.get(slot.prompt_ids, 0), answer_trie(slot, style).node_count - 1)
    # In sorted order, a prompt shares with the union of those before it exactly its longest common
    # prefix with the one just before it: the union's size is Σ len − Σ adjacent common prefixes.
    total, previous = 0, ()
    for prompt in sorted(below):
        total += len(prompt) - _common_prefix(previous, prompt)
        previous = prompt
    # Images come before the text, each at the tokens the engine gives an image of its size.
    return total + sum(below.values()) + sum(images.values())


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def planned_reads(
    reader: Reader,
    plans: Sequence[PlannedRead],
    states: Sequence[str],
    priors: OptionPriors | None,
) -> list[tuple[QuestionSpec, str, Loc]]:
    """Every read the pipeline makes for ``plans`` asked of each of ``states``: each question in the
    orders it is read in (``readers.debias.expand_rotations``), and for each question read as asked
    that ``priors`` covers and holds no prior for under ``reader``'s cache salt (the caller's), its
    content-free prior reads."""
    reads: list[tuple[QuestionSpec, str, Loc]] = []
    specs = [plan.spec for plan in plans]
    rotations = [plan.rotations for plan in plans]
    methods = [plan.method for plan in plans]
    locs = [plan.loc for plan in plans]
    for state in states:
        expanded, expanded_locs, _ = expand_rotations(reader, specs, state, rotations, methods, locs)
        reads += [(spec, state, loc) for spec, loc in zip(expanded, expanded_locs)]
    if priors is not None:
        from calibration.bias import CONTENT_FREE_STATES

        free_states = priors.states if priors.states is not None else CONTENT_FREE_STATES
        unmeasured = {
            (plan.spec, plan.loc): None
            for plan in plans
            if plan.rotations == 1
            and priors.policy.covers(plan.spec.question_type)
            and not priors.held(reader, plan.spec)
        }
        reads += [(spec, state, loc) for spec, loc in unmeasured for state in free_states]
    return reads


def check_option_tokens(reader: Reader, questions: dict[str, Any], loc: tuple = ("body",)) -> None:
    """422 naming the option whose name is over ``MAX_OPTION_NAME_TOKENS`` tokens."""
    from service.errors import validation_error

    encode = reader.template.encode_text
    for name, question in questions.items():
        if question.type != "choice":  # yes/no and score levels are the service's own labels
            continue
        for option in question.criteria:
            tokens = len(encode(" " + option))
            if tokens > MAX_OPTION_NAME_TOKENS:
                raise validation_error(
                    (*loc, "questions", name, "choice", "criteria", option[:40]),
                    f"option name has {tokens} tokens; at most {MAX_OPTION_NAME_TOKENS} (each is one sequential engine read)",
                    "option_name_too_long",
                )
