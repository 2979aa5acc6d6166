"""The reader: questions about one state → label probabilities, through one engine call."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from readers.engines.base import Engine, ReadRequest
from readers.errors import InvalidQuestion, PromptTooLong
from readers.labels import AnswerSlot, ChatTemplate, LabelsUnresolvable
from readers.prompt import LabelStyle, QuestionSpec, build_prompt, label_candidates
from readers.probabilities import DEFAULT_FLOOR_OFFSET, LabelProbabilities, label_probabilities


@dataclass(frozen=True)
class Reading:
    """Everything one read produced, in option order."""

    question: QuestionSpec
    label_style: LabelStyle
    labels: tuple[str, ...]
    label_ids: tuple[int, ...]
    label_probabilities: LabelProbabilities
    read_mode: str
    prompt_tokens: int
    engine_latency_ms: float
    latency_ms: float
    queued_ms: float = 0.0


class Reader:
    """Builds prompts with the engine's own chat template and reads label tokens through it."""

    def __init__(self, engine: Engine, *, floor_offset: float = DEFAULT_FLOOR_OFFSET) -> None:
        self.engine = engine
        self.template = ChatTemplate(engine.tokenizer)
        self.floor_offset = floor_offset

    def prepare(self, question: QuestionSpec, state: str, *, loc: tuple[str | int, ...] = ()) -> tuple[AnswerSlot, LabelStyle]:
        """Prompt ids and label ids for ``question``, trying label styles in order of preference."""
        self._check_length_bound(question, state, loc)
        failures = []
        n = len(question.options)
        for style, labels in label_candidates(question):
            if style is LabelStyle.CODES:
                labels = self.template.single_token_labels(labels, n)
                if len(labels) < n:
                    failures.append(f"codes: only {len(labels)} letter codes are single tokens")
                    continue
            prompt = build_prompt(question, state, labels, style)
            try:
                slot = self.template.slot(prompt.system, prompt.shared, prompt.question, labels)
            except LabelsUnresolvable as error:
                failures.append(f"{style}: {error}")
                continue
            self._check_length(len(slot.prompt_ids), loc)
            return slot, style
        raise InvalidQuestion(
            f"{len(question.options)} options cannot each be named by one distinct token of "
            f"{self.engine.info.name} ({'; '.join(failures)})",
            loc=(*loc, "criteria"),
        )

    def _check_length_bound(self, question: QuestionSpec, state: str, loc: tuple[str | int, ...]) -> None:
        """Refuse, without tokenizing, text that cannot fit: no token spans more than
        ``max_token_chars`` characters, so characters / max_token_chars is a lower bound on tokens."""
        chars = len(state) + len(question.instructions or "") + sum(len(d or "") + len(o) for o, d in zip(question.options, question.descriptions))
        at_least = chars // self.template.max_token_chars
        if at_least + 1 > self.engine.info.context_length:
            raise PromptTooLong(
                f"state and question take at least {at_least} tokens ({chars} characters); {self.engine.info.name} "
                f"holds {self.engine.info.context_length} tokens including the answer token",
                prompt_tokens=at_least,
                context_length=self.engine.info.context_length,
                param=_param(loc),
                exact_count=False,
            )

    def _check_length(self, prompt_tokens: int, loc: tuple[str | int, ...]) -> None:
        context = self.engine.info.context_length
        if prompt_tokens + 1 > context:
            raise PromptTooLong(
                f"state and question take {prompt_tokens} tokens; {self.engine.info.name} holds "
                f"{context} tokens including the answer token",
                prompt_tokens=prompt_tokens,
                context_length=context,
                param=_param(loc),
            )

    async def read(self, question: QuestionSpec, state: str, *, loc: tuple[str | int, ...] = ()) -> Reading:
        """One question about ``state``: the same prompt as that question in ``read_many``."""
        return (await self.read_many([question], state, locs=[loc]))[0]

    async def read_many(
        self, questions: Sequence[QuestionSpec], state: str, *, locs: Sequence[tuple[str | int, ...]] | None = None
    ) -> list[Reading]:
        """Every question about ``state`` in one engine call, readings in question order.

        Each question's prompt is built on its own (state first, then the question), so a reading
        never depends on which other questions came with it; the engine may compute their shared
        prefix, the state, once.
        """
        started = time.monotonic()
        locs = list(locs) if locs is not None else [()] * len(questions)
        if len(locs) != len(questions):
            raise ValueError("read_many needs one loc per question")
        # Rendering and tokenizing a long state takes milliseconds to seconds: off the event loop.
        prepared = await asyncio.to_thread(lambda: [self.prepare(q, state, loc=loc) for q, loc in zip(questions, locs)])
        requests = [ReadRequest(slot.prompt_ids, slot.label_ids, slot.labels, slot.prefix_tokens) for slot, _ in prepared]
        replies = await self.engine.read_many(requests)
        latency_ms = (time.monotonic() - started) * 1000
        readings = []
        for question, (slot, style), reply in zip(questions, prepared, replies):
            readings.append(
                Reading(
                    question=question,
                    label_style=style,
                    labels=slot.labels,
                    label_ids=slot.label_ids,
                    label_probabilities=label_probabilities(reply, slot.label_ids, floor_offset=self.floor_offset),
                    read_mode=reply.read_mode.value,
                    prompt_tokens=len(slot.prompt_ids),
                    engine_latency_ms=reply.latency_ms,
                    queued_ms=reply.queued_ms,
                    latency_ms=latency_ms,
                )
            )
        return readings


def _param(loc: tuple[str | int, ...]) -> str | None:
    return ".".join(str(part) for part in loc) or None
