"""The local engine's chunked forward: a batch's prompts through the model, each distinct token once.

``ChunkedForward`` holds the loaded model's decoder and head and the tree of kept keys and values
(``readers/engines/kvtree.py``). ``_compute_steps`` plans a batch against the tree, then runs the tokens to
compute through the decoder a chunk at a time, in one sequence per chunk: a mask lets each token see
exactly the tokens before it in its own prompt, positions are its own prompt's, so every read equals
the same prompt read alone (to float rounding). A chunk holds at most ``chunk_tokens`` tokens and a
bounded number of attention scores, so a read of many options works in bounded memory. It yields
between chunks, so the compute thread (``readers/engines/local.py``) can give another batch its turn.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass

from opendecide.extras import needs_extra

with needs_extra("local", "the local engine"):
    import torch
    from transformers import Cache
    from transformers.cache_utils import DynamicLayer

from readers.engines.attention import NAME as GROUPED_ATTENTION
from readers.engines.attention import ForwardMasks
from readers.engines.base import LocalBatching
from readers.engines.jobs import ReadsAbandoned
from readers.engines.kvtree import KV_TOKEN_DIM, Chunk, KVTree, Plan, Segment


@dataclass
class Computed:
    """A batch's reads: the final hidden state of each prompt and the plan that computed them."""

    hidden: list[torch.Tensor]
    plan: Plan
    peak_bytes: int
    """The largest chunk's past and new keys and values plus its attention scores (an estimate)."""


class ChunkedForward:
    """A loaded causal LM's decoder and head, run a chunk at a time against the kept keys and values.

    ``LocalEngine`` is one (it adds the job queue and the compute thread), so its tree, chunk sizes and
    steps stay attributes of the engine that tests and benchmarks adjust and wrap on one object."""

    def __init__(self, model, *, dtype: str, batching: LocalBatching) -> None:
        self.model = model
        self._decoder = model.get_decoder()
        self._head = model.get_output_embeddings()
        config = model.config
        # Gemma 3's sliding layers see only the last `sliding_window` keys. The decoder takes the 4-D
        # masks built below as they are, for every layer, so those layers get their own (``_layer_masks``).
        sliding = "sliding_attention" in (getattr(config, "layer_types", None) or ())
        self._window = int(config.sliding_window) if sliding and config.sliding_window else None
        self._softcap = getattr(config, "final_logit_softcapping", None)
        self.vocab_size = int(config.vocab_size)
        self.chunk_tokens = batching.chunk_tokens
        self.chunk_scores = batching.chunk_scores
        self.prefix_cache = KVTree(int(batching.prefix_cache_mib * 2**20))
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        bytes_per = torch.finfo(getattr(torch, dtype)).bits // 8
        self.kv_bytes_per_token = int(config.num_hidden_layers) * 2 * kv_heads * head_dim * bytes_per
        self._kv_shape = (int(config.num_hidden_layers), 2, kv_heads, head_dim)  # tokens go before head_dim
        self._kv_dtype = getattr(torch, dtype)
        # The grouped kernel prepares each mask once per forward for all the layers (ForwardMasks).
        self._grouped = config._attn_implementation == GROUPED_ATTENTION
        self._score_bytes = heads * 4  # float32 scores per query × key pair, over the heads

    def next_token_logprobs(self, prompt_ids: Sequence[int]) -> torch.Tensor:
        """Full-vocabulary log-softmax after ``prompt_ids``: one sequence, no cache, no padding (the
        reference every batched read is tested against)."""
        with torch.inference_mode():
            ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
            logits = self.model(input_ids=ids, logits_to_keep=1, use_cache=False).logits[0, -1]
            return torch.log_softmax(logits.float(), dim=-1)

    def batch_logprobs(
        self, prompts: Sequence[Sequence[int]], reuse: bool | Sequence[bool] = True
    ) -> list[torch.Tensor]:
        """Full-vocabulary log-softmax after each prompt, computed as described in the module
        docstring, on the calling thread; a prompt with ``reuse`` False is computed whole, on its own."""
        return list(self._logprobs(self.compute(prompts, reuse).hidden))

    def compute(
        self,
        prompts: Sequence[Sequence[int]],
        reuse: bool | Sequence[bool] = True,
        *,
        keep: Sequence[bool] | None = None,
        stop: Callable[[], bool] | None = None,
        salts: Sequence[str | None] | None = None,
    ) -> Computed:
        """The final hidden state of each prompt, every distinct token computed once (module
        docstring), on the calling thread; ``keep`` False: that prompt's new tokens are not kept
        after the batch. ``stop`` True before a chunk: raise ``ReadsAbandoned`` there, the tree left
        as if the batch never ran (a chunk already running cannot be stopped: torch finishes it)."""
        steps = self._compute_steps(prompts, reuse, keep=keep, stop=stop, wait=True, salts=salts)
        with torch.inference_mode():
            while True:
                try:
                    next(steps)
                except StopIteration as done:
                    return done.value

    def _compute_steps(
        self,
        prompts: Sequence[Sequence[int]],
        reuse: bool | Sequence[bool],
        *,
        keep: Sequence[bool] | None,
        stop: Callable[[], bool] | None,
        wait: bool = False,
        tenant: str | None = None,
        chunk_limit: Callable[[], int] | None = None,
        salts: Sequence[str | None] | None = None,
    ) -> Generator[bool, None, Computed]:
        """``compute`` a step at a time: yields True while its plan waits for tree nodes another batch
        of ``tenant`` is computing (``wait`` False: the compute thread runs that batch meanwhile), False
        after each chunk; returns the ``Computed``. ``chunk_limit()``, asked before each chunk, may cut
        it smaller than ``chunk_tokens`` (a chunk's leading tokens are a chunk too: depth-first order
        puts every token after those it attends to). The caller holds ``torch.inference_mode``."""
        if isinstance(reuse, bool):
            reuse = [reuse] * len(prompts)
        while (
            plan := self.prefix_cache.plan(prompts, reuse, keep, wait=wait, tenant=tenant, salts=salts)
        ) is None:
            if stop is not None and stop():
                raise ReadsAbandoned  # nothing planned yet: nothing to take out of the tree
            yield True
        try:
            wanted = {(id(output[0]), output[1]) for output in plan.outputs if output is not None}
            hidden: dict[tuple[int, int], torch.Tensor] = {}
            peak = 0
            past = _Past(self._kv_shape, self._kv_dtype, max(len(ids) for ids in prompts))
            for queries in _cut(plan.chunks(self.chunk_tokens, self.chunk_scores), chunk_limit):
                if stop is not None and stop():
                    raise ReadsAbandoned
                chunk = plan.chunk_keys(queries)
                peak = max(peak, self.chunk_bytes(chunk))
                new_kv, states = self._forward(chunk, past)
                at = 0
                for segment, group in itertools.groupby(queries, key=lambda query: query[0]):
                    n = sum(1 for _ in group)
                    segment.add_keys(new_kv[:, :, :, at : at + n])
                    at += n
                for row, (segment, offset) in enumerate(queries):
                    if (id(segment), offset) in wanted:
                        hidden[(id(segment), offset)] = states[row].clone()
                yield False
            outputs = [
                plan.kept[read] if output is None else hidden[(id(output[0]), output[1])]
                for read, output in enumerate(plan.outputs)
            ]
            self.prefix_cache.finish(plan, outputs)
        except BaseException:
            self.prefix_cache.abandon(plan)
            raise
        return Computed(outputs, plan, peak)

    def chunk_bytes(self, chunk: Chunk) -> int:
        """A chunk's working memory, estimated: its past and new keys and values, held where the
        tree and the batch's segments keep them and in the batch's ``_Past`` (room for the longest
        prompt, or half as many again), and the attention scores of one layer."""
        keys = chunk.key_tokens + len(chunk.queries)
        return 5 * keys // 2 * self.kv_bytes_per_token + len(chunk.queries) * keys * self._score_bytes

    def _forward(self, chunk: Chunk, past: _Past) -> tuple[torch.Tensor, torch.Tensor]:
        """One chunk through the decoder against its past keys, which ``past`` holds: the chunk's
        own keys and values [layers, 2, kv heads, tokens, head dim] and its last hidden states
        [tokens, hidden]."""
        past_tokens = chunk.key_tokens
        new_tokens = len(chunk.queries)
        # Each layer writes its new keys and values after the past in place (a growing cache would
        # copy the past again per layer).
        kv = past.hold(chunk)
        cache = Cache(layers=[_FilledLayer(layer, past_tokens) for layer in kv])
        queries, keys = chunk.positions()
        ids = torch.tensor([[segment.tokens[offset] for segment, offset in chunk.queries]])
        mask = chunk.visible()[None, None]
        hidden = self._decoder(
            input_ids=ids,
            attention_mask=self._layer_masks(mask, queries[None], keys[None]),
            position_ids=queries[None],
            cache=cache,
            use_cache=True,
            **({"grouped_masks": ForwardMasks()} if self._grouped else {}),
        ).last_hidden_state[0]
        return kv.narrow(KV_TOKEN_DIM, past_tokens, new_tokens), hidden

    def _logprobs(self, hidden: Sequence[torch.Tensor]) -> torch.Tensor:
        """Full-vocabulary log-softmax rows from final hidden states."""
        if not hidden:
            return torch.empty(0, self.vocab_size)
        with torch.inference_mode():
            logits = self._head(torch.stack(list(hidden))).float()
            if self._softcap:  # as the model's own forward does after its head (Gemma 2)
                logits = torch.tanh(logits / self._softcap) * self._softcap
            return torch.log_softmax(logits, dim=-1)

    def _layer_masks(
        self, mask: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """``mask`` for every layer, or with a sliding window, per layer type: sliding layers also
        hide keys ``sliding_window`` or more positions before the query (as transformers' own masks)."""
        if self._window is None:
            return mask
        near = (query_positions[:, :, None] - key_positions[:, None, :]) < self._window
        return {"full_attention": mask, "sliding_attention": mask & near[:, None]}


def _cut(
    chunks: list[list[tuple[Segment, int]]], limit: Callable[[], int] | None
) -> Iterator[list[tuple[Segment, int]]]:
    """``chunks`` as they are, or each cut into runs of at most ``limit()`` tokens, asked per run."""
    for chunk in chunks:
        at = 0
        while at < len(chunk):
            size = len(chunk) if limit is None else max(1, limit())
            yield chunk[at : at + size]
            at += size


class _Past:
    """One batch's chunks' keys and values, [layers, 2, kv heads, tokens, head dim], kept from chunk to
    chunk: consecutive chunks mostly attend to the same past (a long segment's next chunk to all the
    last one did and to the last one's own tokens; the trie reads under one state to the list and the
    state), so a chunk copies in only the keys after the longest run the last chunk left in place.
    Without it each chunk of a 3,700-token list copied its whole past again (~180 MB a chunk in
    bfloat16, a tenth of a 255-option question's first read)."""

    def __init__(self, shape: tuple[int, int, int, int], dtype: torch.dtype, longest: int) -> None:
        self._shape = shape
        self._dtype = dtype
        self._longest = longest  # tokens of the batch's longest prompt
        self._kv: torch.Tensor | None = None
        # What the tensor holds from its front: (segment, first offset, tokens) runs.
        self._runs: list[tuple[Segment, int, int]] = []
        self.copied_tokens = 0  # past tokens copied in, over the batch's chunks

    def hold(self, chunk: Chunk) -> torch.Tensor:
        """The chunk's past keys and values in order, then room for its own tokens (which its
        layers fill); a view of ``chunk.key_tokens + len(chunk.queries)`` tokens."""
        wanted = [(segment, 0, kv.shape[KV_TOKEN_DIM]) for segment, kv in chunk.keys]
        kept, at, partial = 0, 0, 0  # runs wholly in place, tokens in place, of them in a partial run
        for have, want in zip(self._runs, wanted):
            if have[:2] != want[:2]:
                break
            if have[2] != want[2]:  # more or less of the same segment: keep what both have
                partial = min(have[2], want[2])
                at += partial
                break
            at += want[2]
            kept += 1
        needed = chunk.key_tokens + len(chunk.queries)
        if self._kv is None or needed > self._kv.shape[KV_TOKEN_DIM]:
            layers, pair, kv_heads, head_dim = self._shape
            # Room for the batch's longest prompt and a chunk more: the chunks on one prompt's path
            # never need more (a long list's next chunks, then the state and trie reads after it);
            # half again for a chunk whose queries are on paths that share less.
            room = max(self._longest + len(chunk.queries), needed * 3 // 2)
            self._kv = torch.empty(layers, pair, kv_heads, room, head_dim, dtype=self._dtype)
            kept, at, partial = 0, 0, 0
        kept_tokens = at
        for index in range(kept, len(wanted)):
            skip = partial if index == kept else 0
            n = wanted[index][2] - skip
            self._kv.narrow(KV_TOKEN_DIM, at, n).copy_(chunk.keys[index][1].narrow(KV_TOKEN_DIM, skip, n))
            at += n
        self.copied_tokens += at - kept_tokens
        self._runs = wanted
        for segment, group in itertools.groupby(chunk.queries, key=lambda query: query[0]):
            offsets = [offset for _, offset in group]
            last = self._runs[-1] if self._runs else None
            if last is not None and last[0] is segment and last[1] + last[2] == offsets[0]:
                self._runs[-1] = (segment, last[1], last[2] + len(offsets))
            else:
                self._runs.append((segment, offsets[0], len(offsets)))
        return self._kv.narrow(KV_TOKEN_DIM, 0, needed)


class _FilledLayer(DynamicLayer):
    """One layer's keys and values [2, kv heads, past + new, head dim] with the past already in place:
    ``update`` writes the new tokens' after it and returns the whole, as views (no copy)."""

    def __init__(self, kv: torch.Tensor, past_tokens: int) -> None:
        super().__init__()
        self.kv = kv
        self.past_tokens = past_tokens
        self.keys, self.values = kv[0, :, :past_tokens][None], kv[1, :, :past_tokens][None]
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self.past_tokens + key_states.shape[-2]
        self.kv[0, :, self.past_tokens : end] = key_states[0]
        self.kv[1, :, self.past_tokens : end] = value_states[0]
        self.keys, self.values = self.kv[0, :, :end][None], self.kv[1, :, :end][None]
        return self.keys, self.values
