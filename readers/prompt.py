"""Prompt text for one question: pure, versioned, no tokenizer.

Layout (what a request's questions share first, so an engine computes it once per state):

- system: one fixed line, the same for every state and question;
- user: the state, a blank line, then the question, option descriptions (named options, in
  canonical order) or the coded/levelled option list, and the answer format (score levels read by
  their own words are not listed, as named options are not);
- assistant: ``ANSWER_LEAD`` ("Answer:"), then the answer slot, where the label's tokens go (read
  as the next word, " World" or " A"; ``PromptLayout.slot_forms``); a layout composed per question
  type may read a type without the lead (the current one: yes/no questions, ``PromptLayout.by_type``).

Everything up to and including the blank line after the state is the shared prefix; a question's
text never reaches into it, so a read's prompt does not depend on the other questions beside it.

A choice question of ``MANY_OPTIONS`` options or more (decide-prompt/9's part, /8) has its option
list before the state instead (``PromptText.preamble``): a long list costs more than the state, and
before it, the list is shared by the question's read and its content-free prior reads and kept
across states, where after the state it was computed again under each. Such a question shares only
the system line with the other questions about its state.

Changing any text here changes what the model reads: bump ``PROMPT_VERSION``. Earlier layouts stay
in ``PROMPT_LAYOUTS`` so an eval run can read a task under the old and the new layout side by side;
the service reads only the current one.
"""

from __future__ import annotations

import enum
import json
import string
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

PROMPT_VERSION = "decide-prompt/9"
SYSTEM_PROMPT = "Answer the question that follows the text."
STATE_SEPARATOR = "\n\n"
ANSWER_LEAD = "Answer:"

QuestionType = Literal["noul", "choice", "score"]


class LabelStyle(enum.StrEnum):
    """How options are named in the answer slot, and how their names are read.

    ``words``, ``codes`` and ``digits`` are single tokens read in one engine call. ``first_tokens``
    reads only the first token of each name (one call; the first tokens must be distinct).
    ``trie`` and ``code_trie`` read whole multi-token names by the chain rule over a token trie of
    the names (one engine call per trie depth).
    """

    WORDS = "words"  # the options' own words (yes/no for noul), each one token
    FIRST_TOKENS = "first_tokens"  # the options' own words, read by their distinct first tokens
    TRIE = "trie"  # the options' own words, whole, by the chain rule over their tokens
    CODES = "codes"  # letter codes A, B, …, each one token
    CODE_TRIE = (
        "code_trie"  # letter codes of any token count, by the chain rule (when one-token codes run out)
    )
    DIGITS = "digits"  # score levels 0 … 9

    @property
    def names_options(self) -> bool:
        """The labels are the options' own words (not codes or digits)."""
        return self in (LabelStyle.WORDS, LabelStyle.FIRST_TOKENS, LabelStyle.TRIE)

    @property
    def reads_sequences(self) -> bool:
        """Labels may span several tokens (their in-context token sequences are resolved)."""
        return self in (LabelStyle.FIRST_TOKENS, LabelStyle.TRIE, LabelStyle.CODE_TRIE)

    @property
    def reads_trie(self) -> bool:
        return self in (LabelStyle.TRIE, LabelStyle.CODE_TRIE)


DEFAULT_LABEL_STYLES = (LabelStyle.WORDS, LabelStyle.TRIE, LabelStyle.CODES, LabelStyle.CODE_TRIE)
"""Preference order for noul and choice questions."""

DIGIT_SCORES = (LabelStyle.DIGITS,)
"""Score levels read as their numbers 0 … n−1 (every layout before decide-prompt/5)."""
WORDED_SCORES = (LabelStyle.WORDS, LabelStyle.TRIE, LabelStyle.DIGITS)
"""Score levels read by their own words where every level is a short name (``level_words``), else
as numbers."""
MAX_LEVEL_WORDS = 4
"""The longest level text (in words) read by its words: a rubric line is a description to list, not
an answer to write, and each of its tokens would cost the trie one more engine call."""

MASKED_LABEL_STYLES = (LabelStyle.WORDS, LabelStyle.FIRST_TOKENS, LabelStyle.CODES, LabelStyle.CODE_TRIE)
"""The order on masked engines. A masked read renormalises over the tokens the grammar allows, so
only differences within one node are the model's: a trie node with one child reads 1, and the chain
rule over such nodes favours long names. First tokens are one node, so they stay exact there."""


def masked_score_styles(styles: Sequence[LabelStyle]) -> tuple[LabelStyle, ...]:
    """A layout's score styles on a masked engine: first tokens where it would read a trie (for the
    reason ``MASKED_LABEL_STYLES`` gives), so one-token and distinct-first-token levels still read
    as on exact engines, and the rest by digits."""
    return tuple(LabelStyle.FIRST_TOKENS if style is LabelStyle.TRIE else style for style in styles)


@dataclass(frozen=True)
class QuestionSpec:
    """A question as the reader sees it: options in order, descriptions rendered to text."""

    question_type: QuestionType
    instructions: str | None
    options: tuple[str, ...]
    descriptions: tuple[str | None, ...]


@dataclass(frozen=True)
class PromptText:
    """A prompt's texts, and the label text each option answers with.

    The user message is ``preamble + shared + question``: ``shared`` (the state and its separator)
    is the same for every question about the state, ``question`` is this question's own text, and
    ``preamble`` (empty but in an options-first layout, ``build_options_first``) is this question's
    option list before the state, the same for the question on every state (its content-free prior
    reads included).
    """

    system: str
    shared: str
    question: str
    labels: tuple[str, ...]
    label_style: LabelStyle
    preamble: str = ""


_CONTENT_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(", ", ": "))


def content_text(content: Any) -> str:
    """Render Jev content (text, object or array) as prompt text; objects become compact JSON.

    Encoded piece by piece (``iterencode``, the same text as ``json.dumps``): the one-shot C encoder
    holds the GIL for a whole object, ~200 ms for a 14 MB state, which stalled the event loop while a
    worker thread priced the request; piece by piece, other threads run between pieces."""
    if isinstance(content, str):
        return content
    return "".join(_CONTENT_ENCODER.iterencode(content))


def letter_codes() -> list[str]:
    """A, B, …, Z, then AA, AB, …, ZZ: code candidates in order (the tokenizer says which are one token)."""
    letters = string.ascii_uppercase
    return list(letters) + [first + second for first in letters for second in letters]


def level_words(question: QuestionSpec) -> tuple[str, ...] | None:
    """A score's levels as answers to write: their texts, where each is a short name (at most
    ``MAX_LEVEL_WORDS`` words, one line) and no two are the same name; else None (read as digits)."""
    texts = tuple((description or "").strip() for description in question.descriptions)
    if not all(texts) or any(len(text.split()) > MAX_LEVEL_WORDS or "\n" in text for text in texts):
        return None
    if len({text.casefold() for text in texts}) < len(texts):
        return None
    return texts


def label_candidates(
    question: QuestionSpec,
    styles: Sequence[LabelStyle] = DEFAULT_LABEL_STYLES,
    score_styles: Sequence[LabelStyle] = DIGIT_SCORES,
) -> Iterator[tuple[LabelStyle, tuple[str, ...]]]:
    """Label sets to try for a question, in the order of ``styles`` (``score_styles`` for a score:
    ``digits``, or a style that names options, which reads the levels' own words, ``level_words``).

    For ``codes`` and ``code_trie`` the set is the pool of candidates, minus the options' own names
    (option "B" must not be read from code "B" of another option); the reader keeps the first ones
    that are single tokens (``codes``) or the first ``n`` (``code_trie``).
    """
    if question.question_type == "score":
        for style in score_styles:
            if style is LabelStyle.DIGITS:
                yield style, tuple(str(level) for level in range(len(question.options)))
            elif style.names_options and (words := level_words(question)) is not None:
                yield style, words
        return
    words = (
        ("Yes", "No") if question.question_type == "noul" else question.options
    )  # sentence-initial capitals: more label mass
    taken = set(question.options) | set(words)
    for style in styles:
        if style is LabelStyle.DIGITS:
            raise ValueError("digits name score levels only")
        yield (
            style,
            words if style.names_options else tuple(code for code in letter_codes() if code not in taken),
        )


def _or_list(labels: tuple[str, ...]) -> str:
    if len(labels) == 2:
        return f"{labels[0]} or {labels[1]}"
    return ", ".join(labels[:-1]) + f" or {labels[-1]}"


def canonical_order(labels: Sequence[str]) -> list[int]:
    """Label indices sorted by text, case-folded: the order named options are shown in, whatever
    order the caller gave them (so reversing the options cannot change the prompt)."""
    return sorted(range(len(labels)), key=lambda i: (labels[i].casefold(), labels[i]))


def _listed_lines(question: QuestionSpec, labels: tuple[str, ...]) -> list[str]:
    """Coded options (caller order) or score levels (in order) and their answer format: the same
    text in every layout so far."""
    if question.question_type == "choice":
        lines = ["Options:"]
        for label, option, description in zip(labels, question.options, question.descriptions):
            lines.append(f"{label}. {option}: {description}" if description else f"{label}. {option}")
        return lines + [f"Reply with exactly one letter: {_or_list(labels)}."]
    lines = ["Levels:"] + [
        f"{label}: {description}" for label, description in zip(labels, question.descriptions)
    ]
    return lines + [f"Reply with exactly one number from {labels[0]} to {labels[-1]}."]


def build_prompt(
    question: QuestionSpec, state: str, labels: tuple[str, ...], style: LabelStyle
) -> PromptText:
    """The texts for ``question`` about ``state``, answering with ``labels`` (the current layout).

    Named options (``words``, ``first_tokens``, ``trie``; yes/no for noul) are not listed: the
    question and "Answer with one word." read best on SmolLM2-135M with the state first
    (docs/prompts-and-labels.md), and the reads are over the options anyway. Options with descriptions get one
    line each, in canonical order. Codes must be listed to mean anything (caller order); score
    levels are listed in order.
    """
    lines = [f"Question: {question.instructions}"] if question.instructions else []
    if question.question_type == "score" and style.names_options:
        lines += [f"From lowest to highest: {', '.join(labels)}.", "Answer with one of them."]
    elif question.question_type == "noul" or (question.question_type == "choice" and style.names_options):
        lines += [
            f"{labels[i]}: {question.descriptions[i]}"
            for i in canonical_order(labels)
            if question.descriptions[i]
        ]
        lines.append("Answer with one word.")
    else:
        lines += _listed_lines(question, labels)
    return PromptText(SYSTEM_PROMPT, state + STATE_SEPARATOR, "\n".join(lines), labels, style)


def build_unlisted_levels(
    question: QuestionSpec, state: str, labels: tuple[str, ...], style: LabelStyle
) -> PromptText:
    """decide-prompt/6: :func:`build_prompt`, but a score read by its levels' words is asked like a
    choice of named options: the levels are not listed (a listed scale drew SmolLM2-135M to its last
    level), and the read is over them anyway."""
    if question.question_type == "score" and style.names_options:
        lines = [f"Question: {question.instructions}"] if question.instructions else []
        lines.append("Answer in a word or two.")
        return PromptText(SYSTEM_PROMPT, state + STATE_SEPARATOR, "\n".join(lines), labels, style)
    return build_prompt(question, state, labels, style)


def build_question_first(
    question: QuestionSpec, state: str, labels: tuple[str, ...], style: LabelStyle
) -> PromptText:
    """decide-prompt/1: the question, its options (caller order) and the answer format as the system
    text, the state as the user text. Nothing of the state is shared between questions."""
    lines = [f"Question: {question.instructions}"] if question.instructions else []
    if question.question_type == "noul":
        lines += [
            f"{label}: {description}"
            for label, description in zip(labels, question.descriptions)
            if description
        ]
        lines.append(f"Reply with exactly one word: {_or_list(labels)}.")
    elif question.question_type == "choice" and style.names_options:
        lines.append("Options: " + ", ".join(labels))
        lines += [
            f"- {label}: {description}"
            for label, description in zip(labels, question.descriptions)
            if description
        ]
        lines.append("Reply with exactly one option.")
    else:
        lines += _listed_lines(question, labels)
    return PromptText("\n".join(lines), "", state, labels, style)


def build_options_first(
    question: QuestionSpec, state: str, labels: tuple[str, ...], style: LabelStyle
) -> PromptText:
    """decide-prompt/8: :func:`build_unlisted_levels`, but a choice question's option list (the
    described options' lines, canonical order; coded options and their lines, caller order) comes
    before the state, the question and the answer format after it. The list is then a prefix the
    question's read and its three content-free prior reads share, computed once and kept across
    states, where after the state it was computed again under each (a 255-option list with
    descriptions: ~3,700 tokens, four times). A choice without descriptions read by its names lists
    nothing: its text and ids are /7's."""
    if question.question_type != "choice":
        return build_unlisted_levels(question, state, labels, style)
    intro = [f"Question: {question.instructions}"] if question.instructions else []
    if style.names_options:
        listed = [
            f"{labels[i]}: {question.descriptions[i]}"
            for i in canonical_order(labels)
            if question.descriptions[i]
        ]
        closing = ["Answer with one word."]
    else:
        *listed, reply = _listed_lines(question, labels)
        closing = [reply]
    preamble = "\n".join(listed) + STATE_SEPARATOR if listed else ""
    return PromptText(
        SYSTEM_PROMPT, state + STATE_SEPARATOR, "\n".join(intro + closing), labels, style, preamble
    )


@dataclass(frozen=True)
class PromptLayout:
    """One prompt version: how a question about a state becomes text, the label styles its reads
    prefer (on exact and top-k engines; masked engines read ``MASKED_LABEL_STYLES``), the
    ``answer_lead``: text the assistant turn starts with before the answer slot ("" = the slot opens
    the turn; how labels follow it: ``slot_forms``), and how score levels are named
    (``score_label_styles``: digits, or the levels' own words where they are short names)."""

    version: str
    build: Callable[[QuestionSpec, str, tuple[str, ...], LabelStyle], PromptText]
    label_styles: tuple[LabelStyle, ...] = DEFAULT_LABEL_STYLES
    answer_lead: str = ""
    score_label_styles: tuple[LabelStyle, ...] = DIGIT_SCORES
    shares_state: bool = True
    """Every question's prompt opens with the state, so a request's questions share it (False: the
    question comes first, nothing is shared)."""
    by_type: tuple[tuple[QuestionType, PromptLayout], ...] = ()
    """Question types read under another layout's text, lead and labels (a layout composed per
    type, each part chosen on development records; the parts must share the state-first prefix)."""
    many_options: tuple[int, PromptLayout] | None = None
    """(n, layout): choice questions of at least n options are read under that layout (an
    options-first one, ``build_options_first``), n chosen on development records (``MANY_OPTIONS``)."""
    reads_as: str | None = None
    """The earlier version whose prompts this one's questions outside ``many_options`` have, token for
    token (tested): their reads keep its name as their read version, so calibrations fitted on them
    still apply (``read_version_for``). None: this version's own."""

    def __post_init__(self) -> None:
        # One preference order of noul/choice styles per reader (a caller may override it for all).
        parts = [part for _, part in self.by_type] + ([self.many_options[1]] if self.many_options else [])
        if any(part.label_styles != self.label_styles for part in parts):
            raise ValueError(f"{self.version}: its parts must read noul/choice labels in its own style order")

    def for_question(self, question_type: str, options: int = 0) -> PromptLayout:
        """The layout a question of ``question_type`` with ``options`` options is read under: its
        part by option count (choice questions), else by type, else this one."""
        if self.many_options is not None and question_type == "choice" and options >= self.many_options[0]:
            return self.many_options[1]
        # A scan, not a dict: it runs for every question read, and there are at most three parts.
        return next((part for kind, part in self.by_type if kind == question_type), self)

    def read_version_for(self, question_type: str, options: int = 0) -> str:
        """The prompt version a question's reads are made under, as calibrations are keyed: the
        many-options part's for a question read under it, else ``reads_as`` or this version. A
        question whose prompt did not change keeps its read version, and so its stored fits."""
        if (
            self.many_options is not None
            and self.for_question(question_type, options) is self.many_options[1]
        ):
            return self.many_options[1].version
        return self.reads_as or self.version

    def slot_forms(self) -> tuple[tuple[str, str], ...]:
        """(assistant text before the slot, text before each label) to try, in order. After a lead
        a label is read as the next word, its space included (" World"); where the tokenizer keeps
        that space a token of its own (SmolLM2 splits " 3" into " " and "3"), the space goes into
        the prompt and the label is read after it."""
        if not self.answer_lead:
            return (("", ""),)
        return ((self.answer_lead, " "), (self.answer_lead + " ", ""))


PROMPT_LAYOUTS: dict[str, PromptLayout] = {
    layout.version: layout
    for layout in (
        # Its reads: one-token names, else one-token codes (multi-token names did not exist yet).
        PromptLayout(
            "decide-prompt/1", build_question_first, (LabelStyle.WORDS, LabelStyle.CODES), shares_state=False
        ),
        PromptLayout("decide-prompt/3", build_prompt),
        # decide-prompt/3's text, the answer read after "Answer:" in the assistant turn: on the
        # embedded model the lead moved AG News 25.7 → 42.3% and emotion 24.3 → 38.3% (docs/prompts-and-labels.md).
        PromptLayout("decide-prompt/4", build_prompt, answer_lead=ANSWER_LEAD),
        # decide-prompt/4 with score levels read by their own words (noul and choice text unchanged).
        PromptLayout(
            "decide-prompt/5", build_prompt, answer_lead=ANSWER_LEAD, score_label_styles=WORDED_SCORES
        ),
        # decide-prompt/5 with the levels unlisted (added after its dev run): the score part of the
        # current layout, chosen on dev records (docs/reads.md, evidence/reads/dev-reads/).
        PromptLayout(
            "decide-prompt/6",
            build_unlisted_levels,
            answer_lead=ANSWER_LEAD,
            score_label_styles=WORDED_SCORES,
        ),
    )
}
# Composed per question type (PromptLayout.by_type): yes/no questions under decide-prompt/3's text (no
# lead), choice under /4's, scores under /6's. The current layout: the dev rule's reads for SmolLM2-135M,
# yes/no by the Brier score, confirmed on irony rows neither sample holds (docs/reads.md,
# evidence/reads/noul-fresh/); gemma3-270m's own dev run chose the same parts.
PROMPT_LAYOUTS["decide-prompt/7"] = PromptLayout(
    "decide-prompt/7",
    build_unlisted_levels,
    answer_lead=ANSWER_LEAD,
    score_label_styles=WORDED_SCORES,
    by_type=(("noul", PROMPT_LAYOUTS["decide-prompt/3"]),),
)
# decide-prompt/7 with every choice question's option list before the state (build_options_first):
# a candidate read on development records at each option count (eval/decisions/many_options.py). Not
# state-first for described choice questions, so not a candidate of the dev-reads rule on its own.
PROMPT_LAYOUTS["decide-prompt/8"] = PromptLayout(
    "decide-prompt/8",
    build_options_first,
    answer_lead=ANSWER_LEAD,
    score_label_styles=WORDED_SCORES,
    shares_state=False,
    by_type=(("noul", PROMPT_LAYOUTS["decide-prompt/3"]),),
)
MANY_OPTIONS = 6
"""The option count from which the current layout reads a choice question options-first
(decide-prompt/8), below it as decide-prompt/7: chosen by the rule of ``eval/decisions/many_options.py``
on development records (docs/reads.md)."""
# The current layout: decide-prompt/7 below MANY_OPTIONS options, /8 from it (shipped tasks: 2–6
# options, read as under /7).
PROMPT_LAYOUTS["decide-prompt/9"] = PromptLayout(
    "decide-prompt/9",
    build_unlisted_levels,
    answer_lead=ANSWER_LEAD,
    score_label_styles=WORDED_SCORES,
    by_type=(("noul", PROMPT_LAYOUTS["decide-prompt/3"]),),
    many_options=(MANY_OPTIONS, PROMPT_LAYOUTS["decide-prompt/8"]),
    reads_as="decide-prompt/7",
)
CURRENT_LAYOUT = PROMPT_LAYOUTS[PROMPT_VERSION]


def prompt_layout(version: str) -> PromptLayout:
    try:
        return PROMPT_LAYOUTS[version]
    except KeyError:
        raise ValueError(f"unknown prompt version {version!r}; known: {', '.join(PROMPT_LAYOUTS)}") from None
