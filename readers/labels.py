"""Resolve label tokens in context: where the answer slot is, and which token each label is.

The chat template renders the conversation once with a sentinel as the assistant's answer. The text
before the sentinel is the prompt (cut at the answer slot), the text after it is the template's
closing. A label set resolves when rendering each label in the slot changes exactly one token, at the
same position (the first token after the prompt), with a distinct id per label.

Tokenizers never merge across special tokens, so the check only needs the text from the last special
token before the slot: label resolution is cached on that tail, never on the state.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

SENTINEL = "\ue000answer\ue001"  # private-use code points: no chat template or label contains them


@dataclass(frozen=True)
class AnswerSlot:
    """A prompt cut at the answer slot and the label tokens that fill it."""

    prompt_ids: tuple[int, ...]
    label_ids: tuple[int, ...]
    labels: tuple[str, ...]


class LabelsUnresolvable(ValueError):
    """The labels do not each fill the answer slot with one distinct token."""


class ChatTemplate:
    """A tokenizer's chat template, cut at the answer slot."""

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        specials = set(tokenizer.all_special_tokens)
        specials.update(token.content for token in tokenizer.added_tokens_decoder.values() if token.special)
        self._specials = tuple(sorted((s for s in specials if s), key=len, reverse=True))
        self._resolve = functools.lru_cache(maxsize=4096)(self._resolve_tail)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def render(self, system: str, user: str) -> tuple[str, str]:
        """The conversation text before and after the answer slot."""
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
            {"role": "assistant", "content": SENTINEL},
        ]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False)
        if text.count(SENTINEL) != 1:
            raise ValueError("the chat template does not place the assistant's answer exactly once")
        before, after = text.split(SENTINEL)
        return before, after

    def slot(self, system: str, user: str, labels: tuple[str, ...]) -> AnswerSlot:
        """Prompt ids cut at the answer slot, and one token id per label.

        Raises ``LabelsUnresolvable`` when the labels do not resolve to distinct single tokens.
        """
        before, after = self.render(system, user)
        tail = self._tail(before)
        label_ids = self._resolve(tail, after, labels)
        prompt_ids = self.encode(before)
        return AnswerSlot(tuple(prompt_ids), label_ids, labels)

    def _tail(self, before: str) -> str:
        cut = max((before.rfind(special) for special in self._specials), default=-1)
        return before[cut:] if cut >= 0 else before

    def _resolve_tail(self, tail: str, after: str, labels: tuple[str, ...]) -> tuple[int, ...]:
        prompt = self.encode(tail)
        position = len(prompt)
        rendered = [self.encode(tail + label + after) for label in labels]
        closing = rendered[0][position + 1 :]
        for label, ids in zip(labels, rendered):
            if ids[:position] != prompt or ids[position + 1 :] != closing:
                raise LabelsUnresolvable(f"label {label!r} is not a single token in the answer slot")
        label_ids = tuple(ids[position] for ids in rendered)
        if len(set(label_ids)) != len(label_ids):
            raise LabelsUnresolvable("two labels resolve to the same token")
        return label_ids
