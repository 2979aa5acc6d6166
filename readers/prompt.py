"""Prompt text for one question: pure, versioned, no tokenizer.

Layout (what a request's questions share first, so an engine computes it once per state):

- system: one fixed line, the same for every state and question;
- user: the state, a blank line, then the question, its options with their descriptions and the
  answer format;
- assistant: the answer slot, where the label token goes.

Everything up to and including the blank line after the state is the shared prefix; a question's
text never reaches into it, so a read's prompt does not depend on the other questions beside it.

Changing any text here changes what the model reads: bump ``PROMPT_VERSION``.
"""

from __future__ import annotations

import enum
import json
import string
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

PROMPT_VERSION = "decide-prompt/2"
SYSTEM_PROMPT = "Answer the question that follows the text."
STATE_SEPARATOR = "\n\n"

QuestionType = Literal["noul", "choice", "score"]


class LabelStyle(enum.StrEnum):
    """How options are named in the answer slot."""

    WORDS = "words"  # the options' own words (yes/no for noul)
    CODES = "codes"  # letter codes A, B, …: only where the words do not resolve to distinct tokens
    DIGITS = "digits"  # score levels 0 … 9


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

    The user message is ``shared + question``: ``shared`` (the state and its separator) is the same
    for every question about the state, ``question`` is this question's own text.
    """

    system: str
    shared: str
    question: str
    labels: tuple[str, ...]
    label_style: LabelStyle


def content_text(content: Any) -> str:
    """Render Jev content (text, object or array) as prompt text; objects become compact JSON."""
    if isinstance(content, str):
        return content
    return json.dumps(content, ensure_ascii=False, separators=(", ", ": "))


def letter_codes() -> list[str]:
    """A, B, …, Z, then AA, AB, …, ZZ: code candidates in order (the tokenizer says which are one token)."""
    letters = string.ascii_uppercase
    return list(letters) + [first + second for first in letters for second in letters]


def label_candidates(question: QuestionSpec) -> Iterator[tuple[LabelStyle, tuple[str, ...]]]:
    """Label sets to try for a question, preferred first.

    For ``codes`` the set is the pool of candidates, minus the options' own names (option "B" must
    not be read from code "B" of another option); the reader keeps the first ones that are single
    tokens.
    """
    if question.question_type == "score":
        yield LabelStyle.DIGITS, tuple(str(level) for level in range(len(question.options)))
        return
    words = ("Yes", "No") if question.question_type == "noul" else question.options  # sentence-initial capitals: more label mass
    yield LabelStyle.WORDS, words
    taken = set(question.options) | set(words)
    yield LabelStyle.CODES, tuple(code for code in letter_codes() if code not in taken)


def _or_list(labels: tuple[str, ...]) -> str:
    if len(labels) == 2:
        return f"{labels[0]} or {labels[1]}"
    return ", ".join(labels[:-1]) + f" or {labels[-1]}"


def build_prompt(question: QuestionSpec, state: str, labels: tuple[str, ...], style: LabelStyle) -> PromptText:
    """The texts for ``question`` about ``state``, answering with ``labels``.

    Kept short: small models follow a compact question → options → answer-format layout better
    than a long preamble. The state comes first so every question about it shares its tokens.
    """
    lines = [f"Question: {question.instructions}"] if question.instructions else []
    if question.question_type == "noul":
        for label, description in zip(labels, question.descriptions):
            if description:
                lines.append(f"{label}: {description}")
        lines.append(f"Reply with exactly one word: {_or_list(labels)}.")
    elif question.question_type == "choice" and style is LabelStyle.WORDS:
        lines.append("Options: " + ", ".join(labels))
        lines += [f"- {label}: {description}" for label, description in zip(labels, question.descriptions) if description]
        lines.append("Reply with exactly one option.")
    elif question.question_type == "choice":
        lines.append("Options:")
        for label, option, description in zip(labels, question.options, question.descriptions):
            lines.append(f"{label}. {option}: {description}" if description else f"{label}. {option}")
        lines.append(f"Reply with exactly one letter: {_or_list(labels)}.")
    else:
        lines.append("Levels:")
        lines += [f"{label}: {description}" for label, description in zip(labels, question.descriptions)]
        lines.append(f"Reply with exactly one number from {labels[0]} to {labels[-1]}.")
    return PromptText(SYSTEM_PROMPT, state + STATE_SEPARATOR, "\n".join(lines), labels, style)
