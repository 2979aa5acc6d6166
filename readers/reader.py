"""The reader: questions about one state → label probabilities, through one engine call."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass

from readers.engines.base import Engine, EngineReply, ReadMode, ReadRequest, Tier
from readers.errors import InvalidQuestion, PromptTooLong
from readers.images import ImageTokens, ImageTokensBySalt, state_images
from readers.labels import AnswerSlot, ChatTemplate, LabelsUnresolvable
from readers.probabilities import (
    DEFAULT_FLOOR_OFFSET,
    LabelProbabilities,
    chain_probabilities,
    label_probabilities,
)
from readers.prompt import (
    CURRENT_LAYOUT,
    MASKED_LABEL_STYLES,
    LabelStyle,
    PromptLayout,
    QuestionSpec,
    label_candidates,
    masked_score_styles,
)
from readers.trie import Trie


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
    label_sequences: tuple[tuple[int, ...], ...] = ()
    """Per label, its in-context token ids (multi-token label styles only)."""
    engine_calls: int = 1
    """Engine calls this reading took part in: 1, or a trie's depth (one call per depth level) on an
    engine that does not share a call's tokens (``Capabilities.shares_tokens_in_call``)."""
    tokens_computed: int | None = None
    """Prompt tokens the engine computed for this question's reads (every trie level); None where the
    engine does not say."""
    tokens_reused: int | None = None
    """Prompt tokens of those reads whose keys and values the engine had (its cache, or another read
    of the same batch): ``tokens_computed + tokens_reused`` is the reads' prompt tokens together."""
    features: tuple[float, ...] | None = None
    """The model's final hidden state at the answer slot (the first read's position), where the
    engine returns it (``Capabilities.features``): what a probe calibration reads (``calibration.probe``)."""


class ReadProgress:
    """When the engine last completed a read for this reader: readiness's proof of life
    (``service/routes/operations.py``). Reads in flight prove nothing: a hung engine holds them."""

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self.last_completed: float | None = None

    def completed(self) -> None:
        self.last_completed = self._clock()

    def seconds_since(self) -> float | None:
        """Seconds since the last completed read; None before the first."""
        return None if self.last_completed is None else self._clock() - self.last_completed


class Reader:
    """Builds prompts with the engine's own chat template and reads label tokens through it."""

    def __init__(
        self,
        engine: Engine,
        *,
        floor_offset: float = DEFAULT_FLOOR_OFFSET,
        label_styles: Sequence[LabelStyle] | None = None,
        layout: PromptLayout = CURRENT_LAYOUT,
        score_label_styles: Sequence[LabelStyle] | None = None,
    ) -> None:
        """``label_styles``: the noul and choice label styles to try, preferred first (default: by
        the engine's read mode, the layout's own or on masked engines ``MASKED_LABEL_STYLES``).
        ``layout``: the prompt version to read under (the service reads only the current one); its
        ``score_label_styles`` name score levels (default: the layout's; on masked engines with first
        tokens for the trie, ``masked_score_styles``)."""
        masked = engine.capabilities.read_mode is ReadMode.MASKED
        if label_styles is None:
            label_styles = MASKED_LABEL_STYLES if masked else layout.label_styles
        if not label_styles or LabelStyle.DIGITS in label_styles:
            raise ValueError(
                "label_styles must name at least one noul/choice style (digits are for scores only)"
            )
        self.engine = engine
        self.layout = layout
        self.template = ChatTemplate(engine.tokenizer)
        self.floor_offset = floor_offset
        self.label_styles = tuple(LabelStyle(style) for style in label_styles)
        if score_label_styles is None:
            score_label_styles = layout.for_question("score").score_label_styles
            if masked:
                score_label_styles = masked_score_styles(score_label_styles)
        self.score_label_styles = tuple(LabelStyle(style) for style in score_label_styles)
        self.tenant: str | None = None
        """Whose reads this reader makes (``ReadRequest.tenant``); set by ``for_tenant``."""
        self.cache_salt: str | None = None
        """Whose prompt cache its reads use (``ReadRequest.cache_salt``); set by ``for_tenant``."""
        self.tier: Tier | None = None
        """How urgent its reads are (``ReadRequest.tier``); set by ``for_tenant``."""
        self.progress = ReadProgress()
        self._image_tokens = ImageTokensBySalt()  # shared by ``for_tenant``'s views
        self.image_tokens: ImageTokens = self._image_tokens.for_salt(None)
        """The tokens the engine gives an image, learned from this cache salt's reads (``for_tenant``)."""

    def for_tenant(self, tenant: str | None, cache_salt: str | None, tier: Tier | None = None) -> Reader:
        """This reader, its engine reads marked as ``tenant``'s, so the engine takes turns between
        tenants (``ReadRequest.tenant``), salted with ``cache_salt``, so they reuse only prompt
        tokens read under the same salt (``ReadRequest.cache_salt``), and of ``tier``
        (``ReadRequest.tier``), with the image token counts learned under that salt. Shares everything
        else, progress included."""
        view = copy.copy(self)
        view.tenant = tenant
        view.cache_salt = cache_salt
        view.tier = tier
        view.image_tokens = self._image_tokens.for_salt(cache_salt)
        return view

    def prepare(
        self, question: QuestionSpec, state: str, *, loc: tuple[str | int, ...] = ()
    ) -> tuple[AnswerSlot, LabelStyle]:
        """Prompt ids and label ids for ``question``, trying label styles in order of preference."""
        self._check_length_bound(question, state, loc)
        failures = []
        n = len(question.options)
        layout = self.layout.for_question(question.question_type, n)
        for style, candidates in label_candidates(question, self.label_styles, self.score_label_styles):
            deferred = None
            for lead, separator in layout.slot_forms():
                name = f"{style} after {lead!r}" if lead else str(style)
                labels = candidates
                if style is LabelStyle.CODES:
                    labels = self.template.single_token_labels(
                        candidates, n, lead=lead, separator=separator, cache_salt=self.cache_salt
                    )
                    if len(labels) < n:
                        failures.append(f"{name}: only {len(labels)} letter codes are single tokens")
                        continue
                elif style is LabelStyle.CODE_TRIE:
                    if len(labels) < n:
                        failures.append(f"{name}: only {len(labels)} letter codes")
                        break  # the same count in every form
                    labels = labels[:n]
                prompt = layout.build(question, state, labels, style)
                try:
                    slot = self.template.slot(
                        prompt.system,
                        prompt.shared,
                        prompt.question,
                        tuple(separator + label for label in labels),
                        sequences=style.reads_sequences,
                        lead=lead,
                        preamble=prompt.preamble,
                        cache_salt=self.cache_salt,
                    )
                    if style is LabelStyle.FIRST_TOKENS and len(set(slot.label_ids)) != n:
                        raise LabelsUnresolvable("two labels begin with the same token")
                except LabelsUnresolvable as error:
                    failures.append(f"{name}: {error}")
                    continue
                self._check_length(
                    len(slot.prompt_ids)
                    + self.image_tokens.total(state_images(state), self.engine.capabilities.image_tokens)
                    + max(map(len, slot.label_sequences), default=1)
                    - 1,
                    loc,
                )
                if style.reads_trie and n > 1 and len(set(slot.label_ids)) == 1 and deferred is None:
                    # Every label begins with the same token (a lone space before "10", "20"): that
                    # trie level reads 1 for all and costs an engine call; a later form may not have it.
                    deferred = slot, style
                    continue
                return slot, style
            if deferred is not None:
                return deferred
        raise InvalidQuestion(
            f"{len(question.options)} options cannot each be named by distinct tokens of "
            f"{self.engine.info.name} ({'; '.join(failures)})",
            loc=(*loc, "criteria"),
        )

    def _check_length_bound(self, question: QuestionSpec, state: str, loc: tuple[str | int, ...]) -> None:
        """Refuse, without tokenizing, text that cannot fit: no token spans more than
        ``max_token_chars`` characters, so characters / max_token_chars is a lower bound on tokens."""
        chars = (
            len(state)
            + len(question.instructions or "")
            + sum(len(d or "") + len(o) for o, d in zip(question.options, question.descriptions))
        )
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

    async def read(
        self, question: QuestionSpec, state: str, *, loc: tuple[str | int, ...] = (), keep: bool = True
    ) -> Reading:
        """One question about ``state``: the same prompt as that question in ``read_many``."""
        return (await self.read_many([question], state, locs=[loc], keep=keep))[0]

    async def read_many(
        self,
        questions: Sequence[QuestionSpec],
        state: str,
        *,
        locs: Sequence[tuple[str | int, ...]] | None = None,
        keep: bool = True,
        affinity_key: str | None = None,
    ) -> list[Reading]:
        """Every question about ``state`` in one engine call, readings in question order.

        Each question's prompt is built on its own (state first, then the question), so a reading
        never depends on which other questions came with it; the engine may compute their shared
        prefix, the state, once. ``keep`` False: the engine need not keep these prompts' keys and
        values for later requests (``ReadRequest.keep``). ``affinity_key``: the caller's routing key
        (``ReadRequest.affinity_key``).
        """
        started = time.monotonic()
        locs = list(locs) if locs is not None else [()] * len(questions)
        if len(locs) != len(questions):
            raise ValueError("read_many needs one loc per question")
        # Rendering and tokenizing a long state takes milliseconds to seconds: off the event loop.
        prepared = await asyncio.to_thread(
            lambda: [self.prepare(q, state, loc=loc) for q, loc in zip(questions, locs)]
        )
        tries = [answer_trie(slot, style) for slot, style in prepared]
        # Every question's trie nodes of one depth together, one engine call per depth (a question
        # with one-token labels is done after the first), or every depth in one call where the engine
        # computes each distinct token of a call once. The nodes are known before any is read.
        replies: list[dict[tuple[int, ...], EngineReply]] = [{} for _ in prepared]
        call_of: list[dict[tuple[int, ...], int]] = [{} for _ in prepared]
        engine_calls = [0] * len(prepared)
        depths = range(max(trie.depth for trie in tries))
        calls = [list(depths)] if self.engine.capabilities.shares_tokens_in_call else [[d] for d in depths]
        for call, call_depths in enumerate(calls):
            level = [
                (i, node)
                for depth in call_depths
                for i, trie in enumerate(tries)
                for node in trie.nodes_at(depth)
            ]
            requests = [
                ReadRequest(
                    prepared[i][0].prompt_ids + node,
                    tries[i].children(node),
                    self._node_texts(prepared[i][0], node),
                    self._prefix_tokens(prepared[i][0], tries[i]),
                    keep,
                    affinity_key,
                    self.tenant,
                    self.cache_salt,
                    self.tier,
                    features=not node and self.engine.capabilities.features,
                    images=state_images(state),
                )
                for i, node in level
            ]
            replied = await self.engine.read_many(requests)
            self.progress.completed()
            for (i, node), reply in zip(level, replied):
                replies[i][node] = reply
                call_of[i][node] = call
                engine_calls[i] = call + 1
        latency_ms = (time.monotonic() - started) * 1000
        images = state_images(state)
        if images and prepared:
            # The engine's count less the text's is what it gave the images: priced so from now on.
            self.image_tokens.observe(images, replies[0][()].prompt_tokens - len(prepared[0][0].prompt_ids))
        readings = []
        for question, (slot, style), trie, nodes, calls, node_calls in zip(
            questions, prepared, tries, replies, engine_calls, call_of
        ):
            root = nodes[()]
            readings.append(
                Reading(
                    question=question,
                    label_style=style,
                    labels=slot.labels,
                    label_ids=slot.label_ids,
                    label_probabilities=self._probabilities(trie, nodes),
                    read_mode=root.read_mode.value,
                    # With images, the engine's own count: the text's tokens and the images'.
                    prompt_tokens=root.prompt_tokens if state_images(state) else len(slot.prompt_ids),
                    engine_latency_ms=sum(
                        max(r.latency_ms for node, r in nodes.items() if node_calls[node] == c)
                        for c in range(calls)
                    ),
                    queued_ms=root.queued_ms,
                    latency_ms=latency_ms,
                    label_sequences=slot.label_sequences,
                    engine_calls=calls,
                    tokens_computed=total_or_none(reply.computed_tokens for reply in nodes.values()),
                    tokens_reused=total_or_none(reply.cached_tokens for reply in nodes.values()),
                    features=root.features,
                )
            )
        return readings

    def _node_texts(self, slot: AnswerSlot, node: tuple[int, ...]) -> tuple[str, ...]:
        """What may follow ``node``, as text: the labels at the root, else the rest of each option
        under the node. A masked engine constrains the continuation of the prompt it is sent, which
        at a deeper node already holds the node's tokens."""
        if not node:
            return slot.labels
        rests = (
            self.template.tokenizer.decode(list(sequence[len(node) :]), skip_special_tokens=True)
            for sequence in slot.label_sequences
            if tuple(sequence[: len(node)]) == node
        )
        return tuple(dict.fromkeys(rests))

    @staticmethod
    def _prefix_tokens(slot: AnswerSlot, trie: Trie) -> int:
        """The shared-prefix hint of a read: the state's end for one-token labels; for a trie the
        whole prompt but its last token, the same at every depth, so an engine that caches prefixes
        computes the question's prompt once and each node's read only adds the node's tokens."""
        return slot.prefix_tokens if trie.depth == 1 else len(slot.prompt_ids) - 1

    def _probabilities(self, trie: Trie, nodes: dict[tuple[int, ...], EngineReply]) -> LabelProbabilities:
        if trie.depth == 1:
            return label_probabilities(nodes[()], trie.children(()), floor_offset=self.floor_offset)
        order = list(nodes)
        reads = [
            label_probabilities(nodes[node], trie.children(node), floor_offset=self.floor_offset)
            for node in order
        ]
        index = {node: i for i, node in enumerate(order)}
        paths = [[(index[node], child) for node, child in trie.path(k)] for k in range(len(trie.sequences))]
        normalised = all(reply.normalised_over_labels for reply in nodes.values())
        return chain_probabilities(
            reads, paths, floor_offset=self.floor_offset, normalised_over_labels=normalised
        )


def answer_trie(slot: AnswerSlot, style: LabelStyle) -> Trie:
    """The nodes a prepared question is read at: its labels' token trie, or the root alone where
    each label is one token."""
    if style.reads_trie:
        return Trie(slot.label_sequences)
    return Trie(tuple((token,) for token in slot.label_ids))


def total_or_none(counts) -> int | None:
    """The sum of per-read counts, or None when some engine read did not report one."""
    counts = list(counts)
    return None if any(count is None for count in counts) else sum(counts)


def _param(loc: tuple[str | int, ...]) -> str | None:
    return ".".join(str(part) for part in loc) or None
