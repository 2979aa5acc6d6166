"""Resolve label tokens in context: where the answer slot is, and which token each label is.

The chat template renders the conversation once with sentinels in place of the system text, the
user text (the shared part, then the question) and the assistant's answer. The text before the answer sentinel is the prompt (cut at the
answer slot), the text after it the template's closing. A label set resolves when rendering each
label in the slot changes exactly one token, at the same position (the first token after the prompt),
with a distinct id per label, and the label text alone encodes to that one token.

Caller text (state, instructions, options) is encoded with special tokens split, so a state that
contains ``<|im_end|>`` stays text and cannot forge a turn. Tokenizers never merge across special
tokens, so label resolution only needs the text from the last special token before the slot: it is
cached on that tail, never on the state.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from opendecide.tenant_cache import TenantCache

SYSTEM, USER, ANSWER = "\ue000system\ue001", "\ue000user\ue001", "\ue000answer\ue001"
QUESTION = "\ue000question\ue001"
PREAMBLE = "\ue000preamble\ue001"


@dataclass(frozen=True)
class AnswerSlot:
    """A prompt cut at the answer slot and the label tokens that fill it.

    ``prefix_tokens`` counts the leading ids every question about the same state shares (the
    template's opening, the system text and the shared user text); the rest is this question's.
    """

    prompt_ids: tuple[int, ...]
    label_ids: tuple[int, ...]
    labels: tuple[str, ...]
    prefix_tokens: int = 0
    label_sequences: tuple[tuple[int, ...], ...] = ()
    """Per label, the token ids it fills the slot with in context (multi-token labels only; the
    first id is ``label_ids``'s). When one label's ids begin another's, each ends with the closing's
    first token, so a name is never scored as a prefix of a longer one."""


class LabelsUnresolvable(ValueError):
    """The labels do not each fill the answer slot with one distinct token."""


def _sentinel(base: str, texts: Iterable[str]) -> str:
    """``base``, lengthened until no caller text contains it (private-use code points, so rarely)."""
    texts = list(texts)
    while any(base in text for text in texts):
        base += "\ue001"
    return base


class ChatTemplate:
    """A tokenizer's chat template, cut at the answer slot."""

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        # transformers flips a flag on the shared Rust tokenizer for split_special_tokens=True on every
        # call, so concurrent calls would tokenize with each other's setting: caller text gets its own
        # copy with the flag set for good, and every encode holds a lock (tokenizing takes far less
        # than the forward pass). Re-entrant, so the event loop can hold it around a whole inline
        # price (``held_within``).
        self._text_tokenizer = copy.deepcopy(tokenizer)
        self._text_tokenizer.split_special_tokens = True
        self._lock = threading.RLock()
        specials = set(tokenizer.all_special_tokens)
        specials.update(token.content for token in tokenizer.added_tokens_decoder.values() if token.special)
        self._specials = tuple(sorted((s for s in specials if s), key=len, reverse=True))
        self.max_token_chars = max(len(token) for token in tokenizer.get_vocab())
        # Resolved labels, per cache salt: the keys are callers' option names, and a resolution
        # another tenant made would answer at once (255 names: ~19 ms against ~0.4, timed once), showing that
        # someone asked them. Past a bound the salt holding the most gives back first.
        self._resolved: TenantCache[tuple] = TenantCache(4096)
        self._singles: TenantCache[tuple] = TenantCache(65536)
        self._sequenced: TenantCache[tuple] = TenantCache(4096)

    @contextlib.contextmanager
    def held_within(self, wait_s: float) -> Iterator[bool]:
        """The tokenizer held by this thread if it comes free within ``wait_s`` (True), else not held
        (False): the event loop waits out a worker's short hold (a read's prompt, a millisecond) but
        not a long one (a caller's 600,000-character state, half a second, which every other
        tenant's request would wait out on the loop with it)."""
        taken = self._lock.acquire(timeout=wait_s)
        try:
            yield taken
        finally:
            if taken:
                self._lock.release()

    def encode(self, text: str) -> list[int]:
        """Template text: special-token strings are special tokens."""
        with self._lock:
            return self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=False)

    def encode_text(self, text: str) -> list[int]:
        """Caller text: special-token strings stay plain text."""
        with self._lock:
            return self._text_tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)

    def _render(self, system: str, user: str, answer: str) -> str:
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
            {"role": "assistant", "content": answer},
        ]
        with self._lock:
            return self.tokenizer.apply_chat_template(messages, tokenize=False)

    def closing(self, lead: str = "") -> tuple[str, str]:
        """The template text from the last special token before the answer slot (the assistant
        turn's ``lead`` included), and after it."""
        text = self._render(SYSTEM, USER, lead + ANSWER)
        before, after = self._split_once(text, ANSWER)
        return self._tail(before), after

    def slot(
        self,
        system: str,
        shared: str,
        question: str,
        labels: tuple[str, ...],
        *,
        sequences: bool = False,
        lead: str = "",
        preamble: str = "",
        cache_salt: str | None = None,
    ) -> AnswerSlot:
        """Prompt ids cut at the answer slot, and one token id per label.

        The user message is ``preamble + shared + question``, each encoded on its own so the shared
        part's ids never depend on the question after it, nor the preamble's (a question's option
        list before the state, ``PromptText.preamble``) on the state. ``prefix_tokens`` ends with
        the preamble where there is one (what the question's reads on every state share), else
        with the shared part (what every question about the state shares). The assistant turn holds ``lead`` before the slot;
        ``labels`` are the texts read there (with any space they take after the lead). Raises
        ``LabelsUnresolvable`` when the labels do not resolve to distinct single tokens, or with
        ``sequences`` to distinct token sequences (then ``label_ids`` are their first tokens, not
        necessarily distinct). Labels resolved before under ``cache_salt`` (the caller's) are not
        resolved again.
        """
        texts = [system, preamble, shared, question]
        system_mark, preamble_mark, shared_mark, question_mark = (
            _sentinel(base, texts) for base in (SYSTEM, PREAMBLE, USER, QUESTION)
        )
        text = self._render(system_mark, preamble_mark + shared_mark + question_mark, lead + ANSWER)
        before, after = self._split_once(text, ANSWER)
        if any(before.count(mark) != 1 for mark in (system_mark, preamble_mark, shared_mark, question_mark)):
            raise ValueError("the chat template does not place each message's content exactly once")
        label_sequences: tuple[tuple[int, ...], ...] = ()
        if sequences:
            label_sequences = self._cached(
                self._sequenced, cache_salt, (self._tail(before), after, labels), self._sequences_tail
            )
            label_ids = tuple(ids[0] for ids in label_sequences)
        else:
            label_ids = self._cached(
                self._resolved,
                cache_salt,
                (self._tail(before), after, labels),
                lambda tail, after, labels: self._resolve_tail(tail, after, labels, cache_salt),
            )
        ids, marks_end = self._encode_prompt(
            before,
            {system_mark: system, preamble_mark: preamble, shared_mark: shared, question_mark: question},
        )
        return AnswerSlot(
            tuple(ids),
            label_ids,
            labels,
            prefix_tokens=marks_end[preamble_mark if preamble else shared_mark],
            label_sequences=label_sequences,
        )

    def single_token_labels(
        self,
        candidates: Iterable[str],
        count: int,
        *,
        lead: str = "",
        separator: str = "",
        cache_salt: str | None = None,
    ) -> tuple[str, ...]:
        """The first ``count`` candidates that each fill the answer slot (after ``lead``, read as
        ``separator + candidate``) with one token."""
        tail, after = self.closing(lead)
        chosen = []
        for candidate in candidates:
            if self._single(tail, after, separator + candidate, cache_salt) is not None:
                chosen.append(candidate)
                if len(chosen) == count:
                    break
        return tuple(chosen)

    def _encode_prompt(self, before: str, contents: dict[str, str]) -> tuple[list[int], dict[str, int]]:
        """Template text and caller texts encoded piece by piece, and where each caller text ends."""
        ids: list[int] = []
        ends: dict[str, int] = {}
        rest = before
        while True:
            hits = [(rest.find(mark), mark) for mark in contents if mark in rest]
            if not hits:
                return ids + self.encode(rest), ends
            position, mark = min(hits)
            ids += self.encode(rest[:position]) + self.encode_text(contents[mark])
            ends[mark] = len(ids)
            rest = rest[position + len(mark) :]

    @staticmethod
    def _split_once(text: str, mark: str) -> tuple[str, str]:
        if text.count(mark) != 1:
            raise ValueError("the chat template does not place each message's content exactly once")
        before, after = text.split(mark)
        return before, after

    def _tail(self, before: str) -> str:
        cut = max((before.rfind(special) for special in self._specials), default=-1)
        return before[cut:] if cut >= 0 else before

    @staticmethod
    def _cached(cache: TenantCache[tuple], salt: str | None, key: tuple, compute: Callable[..., Any]) -> Any:
        """``compute(*key)``, held per ``salt`` (an exception is not held: the next call computes again)."""
        held = cache.get(salt, key)
        if held is None:
            held = (compute(*key),)  # in a tuple: None is a result (not one token), not a miss
            cache.put(salt, key, held)
        return held[0]

    def _single(self, tail: str, after: str, label: str, cache_salt: str | None) -> int | None:
        return self._cached(self._singles, cache_salt, (tail, after, label), self._single_token)

    def _single_token(self, tail: str, after: str, label: str) -> int | None:
        """The label's token id when ``label`` alone adds exactly one token to the slot, else None."""
        if not label:
            return None
        prompt = self.encode(tail)
        alone = self.encode(tail + label)
        if len(alone) != len(prompt) + 1 or alone[:-1] != prompt:
            return None
        if self.encode(tail + label + after)[: len(alone)] != alone:  # the label merges with the closing
            return None
        return alone[-1]

    def _resolve_tail(
        self, tail: str, after: str, labels: tuple[str, ...], cache_salt: str | None
    ) -> tuple[int, ...]:
        position = len(self.encode(tail))
        rendered = [self.encode(tail + label + after) for label in labels]
        closing = rendered[0][position + 1 :]
        label_ids = []
        for label, ids in zip(labels, rendered):
            token = self._single(tail, after, label, cache_salt)
            if token is None or ids[position] != token or ids[position + 1 :] != closing:
                raise LabelsUnresolvable(f"label {label!r} is not a single token in the answer slot")
            label_ids.append(token)
        if len(set(label_ids)) != len(label_ids):
            raise LabelsUnresolvable("two labels resolve to the same token")
        return tuple(label_ids)

    def _sequences_tail(self, tail: str, after: str, labels: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
        """Each label's token ids in the slot, as the template tokenizes ``prompt + label + closing``."""
        prompt = self.encode(tail)
        sequences = []
        for label in labels:
            alone = self.encode(tail + label)
            closed = self.encode(tail + label + after)
            if not label or alone[: len(prompt)] != prompt or len(alone) == len(prompt):
                raise LabelsUnresolvable(f"label {label!r} merges with the text before the answer slot")
            if closed[: len(alone)] != alone or len(closed) == len(alone):
                raise LabelsUnresolvable(f"label {label!r} merges with the template's closing")
            sequences.append((tuple(alone[len(prompt) :]), closed[len(alone)]))
        names = [ids for ids, _ in sequences]
        if len(set(names)) != len(names):
            raise LabelsUnresolvable("two labels resolve to the same tokens")
        if any(a != b and b[: len(a)] == a for a in names for b in names):
            ends = {end for _, end in sequences}
            if len(ends) != 1:
                raise LabelsUnresolvable("one label begins another and the closing does not end them alike")
            return tuple(ids + (end,) for ids, end in sequences)
        return tuple(names)
