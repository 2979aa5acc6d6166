"""Token-level prefix reuse: a radix tree of prompt tokens whose nodes keep their tokens' keys and values.

The local engine computes each distinct prompt token of a batch once, and none whose keys and values
the tree already holds: across the reads of one request (the state, the question above a token
trie's deeper reads), across its content-free prior reads, and across requests. This module plans
that work; the engine runs it (``readers/engines/chunked.py``).

A plan is a forest of *segments*, runs of consecutive prompt tokens: a segment either brings keys and
values from the tree (a snapshot: later changes to the tree do not touch a running batch) or is to
be computed. Every prompt is a path from a root; a read needs the final hidden state of its last
token, so the tree keeps that state where a read ended (``_Node.hidden``): a prompt read again is
answered from the tree with nothing computed, and a prompt that ends at a token the tree holds
without its state computes that one token again. Segments to compute are visited in
depth-first order, so a token comes after every token it attends to; the engine computes them in
chunks, each chunk attending to the keys of its tokens' ancestors (``Chunk.visible``).

Caches per salt: every prompt is planned under its read's ``cache_salt`` (``ReadRequest``), one tree
per salt, so a read reuses only tokens computed for reads of its own salt: a tenant's (or a cache
group's), never another's. Otherwise one tenant could learn another's text a token at a time from
``tokens_reused`` or latency (issue 40: a 4-digit PIN in 40 requests). The byte bound is shared.

Concurrency: plans are made and finished under one lock, computed outside it. A batch whose prompts
run into tokens another batch of the same tenant is computing waits for that batch to finish, then
plans again, so a shared state arriving in two batches at once is computed once. A prompt that runs
into tokens another tenant's batch is computing (tenants of one cache group share a salt) is computed
on its own instead (no reuse): one tenant never waits out another's batch, which may be forty long states (issue 39; the cost is that prompt's
shared prefix, the system prompt and what follows, computed twice). A batch that fails takes its
uncomputed nodes out of the tree.

Memory: the tree keeps at most ``max_bytes`` of keys, values and kept hidden states, for all salts
together; once a batch is done, the salt holding the most bytes gives back its least recently used
leaves first (as ``opendecide.tenant_cache`` does), so a tenant streaming new states evicts its own
tokens, never those of a tenant holding less. A running batch holds its own snapshot and chunks on top
of that. Tokens only reads marked not to keep computed (``ReadRequest.keep``: content-free prior
reads) are shared within their batch and leave the tree after it.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from opendecide.extras import needs_extra

with needs_extra("local", "the local engine"):
    import torch

# A node's or segment's keys and values: [layers, 2 (keys, values), kv heads, tokens, head dim].
KV_TOKEN_DIM = 3


@dataclass(eq=False)
class _Node:
    """A run of prompt tokens at positions ``start``… in the tree; ``kv`` is None while a batch
    (``batch``) computes it."""

    tokens: tuple[int, ...]
    start: int
    parent: _Node | None
    kv: torch.Tensor | None = None
    batch: object | None = None
    children: dict[int, _Node] = field(default_factory=dict)
    used: int = 0
    keep: bool = True  # False while only reads that need not be kept (ReadRequest.keep) pass through it
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    """Offset in ``tokens`` → the final hidden state there, kept where a read ended: a read of the same
    prompt again needs no forward at all (a repeated request of 255 options is 262 such reads)."""

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    @property
    def nbytes(self) -> int:
        kv = 0 if self.kv is None else self.kv.nbytes
        return kv + sum(state.nbytes for state in self.hidden.values())


@dataclass(eq=False)
class Segment:
    """Consecutive tokens of a plan: from the tree (``kv``), or computed by this batch (``add_keys``
    gathers the keys and values chunk by chunk; ``node`` is the tree node they fill, if any)."""

    tokens: tuple[int, ...]
    start: int
    parent: Segment | None
    kv: torch.Tensor | None = None
    node: _Node | None = None
    owner: int = -1
    """The read charged with computing it (the first of the batch that needs it); -1: from the tree."""
    order: int = 0  # depth-first position in the plan
    last: int = 0  # the last depth-first position in its subtree
    computed_kv: torch.Tensor | None = None
    """The keys and values this batch computed, in a tensor of the whole segment's length filled from
    the front (``filled`` tokens): a chunk's keys are copied in once, where gathering them by
    concatenation would copy everything before them again at every chunk of a long segment."""
    filled: int = 0

    @property
    def computed(self) -> bool:
        return self.kv is None

    def add_keys(self, kv: torch.Tensor) -> None:
        """The keys and values of this segment's next computed tokens."""
        if self.computed_kv is None:
            shape = list(kv.shape)
            shape[KV_TOKEN_DIM] = len(self.tokens)
            self.computed_kv = kv.new_empty(shape)
        n = kv.shape[KV_TOKEN_DIM]
        self.computed_kv.narrow(KV_TOKEN_DIM, self.filled, n).copy_(kv)
        self.filled += n

    def keys_so_far(self) -> torch.Tensor | None:
        """Its keys and values available now: all of a tree segment's, the computed part of the others'."""
        if self.kv is not None:
            return self.kv
        if not self.filled:
            return None
        if self.filled == len(self.tokens):
            return self.computed_kv
        return self.computed_kv.narrow(KV_TOKEN_DIM, 0, self.filled)


@dataclass
class Chunk:
    """Tokens computed in one forward: ``queries`` (segment, offset) in depth-first order, against
    ``keys`` — the keys and values (segment, first offset, tensor) already known of their ancestors
    and of their own segments."""

    queries: list[tuple[Segment, int]]
    keys: list[tuple[Segment, torch.Tensor]]

    @property
    def key_tokens(self) -> int:
        return sum(kv.shape[KV_TOKEN_DIM] for _, kv in self.keys)

    def positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Query positions and key positions (past keys, then the queries' own)."""
        queries = torch.tensor([segment.start + offset for segment, offset in self.queries])
        past = [torch.arange(s.start, s.start + kv.shape[KV_TOKEN_DIM]) for s, kv in self.keys]
        return queries, torch.cat([*past, queries])

    def visible(self) -> torch.Tensor:
        """[queries, past keys + queries]: a query sees a key of an ancestor segment, and the keys of
        its own segment up to itself — exactly the tokens before it in its own prompt."""
        key_order, key_last, key_offset = [], [], []
        for segment, kv in self.keys:
            n = kv.shape[KV_TOKEN_DIM]
            key_order += [segment.order] * n
            key_last += [segment.last] * n
            key_offset += range(n)
        for segment, offset in self.queries:
            key_order.append(segment.order)
            key_last.append(segment.last)
            key_offset.append(offset)
        k_order, k_last, k_offset = map(torch.tensor, (key_order, key_last, key_offset))
        q_order = k_order[-len(self.queries) :, None]
        q_offset = k_offset[-len(self.queries) :, None]
        ancestor = (k_order[None] <= q_order) & (q_order <= k_last[None])
        return ancestor & ((k_order[None] != q_order) | (k_offset[None] <= q_offset))


@dataclass
class Plan:
    """One batch's work: its segments in depth-first order, where each prompt's last token is, and
    what each read computed and reused."""

    segments: list[Segment]
    outputs: list[tuple[Segment, int] | None]
    """Per read, the token whose hidden state it needs; None: the tree kept that state (``kept``)."""
    computed_tokens: list[int]
    cached_tokens: list[int]
    batch: object
    kept: dict[int, torch.Tensor] = field(default_factory=dict)
    """Read index → its final hidden state, from the tree."""
    paths: list[tuple[str | None, tuple[int, ...]] | None] = field(default_factory=list)
    """Per read, its salt and prompt where it goes into the tree (None: computed alone), so ``finish``
    can keep the state it ends in wherever the tree has split or evicted meanwhile."""

    @property
    def tokens_to_compute(self) -> int:
        return sum(len(s.tokens) for s in self.segments if s.computed)

    def chunks(self, max_queries: int, max_scores: int) -> list[list[tuple[Segment, int]]]:
        """The tokens to compute, depth first, cut so that no forward holds more than ``max_queries``
        tokens, nor more than ``max_scores`` query × key scores per head (bounded working memory;
        the keys are counted from above: every ancestor's tokens and the computed part of its own)."""
        chunks: list[list[tuple[Segment, int]]] = []
        chunk: list[tuple[Segment, int]] = []
        ancestors: set[int] = set()
        members: set[int] = set()
        keys = 0
        for segment in self.segments:
            if not segment.computed:
                continue
            chain = _strict_ancestors(segment)
            for offset in range(len(segment.tokens)):
                added = 0
                if id(segment) not in members:
                    added = sum(len(a.tokens) for a in chain if id(a) not in ancestors) + offset
                if chunk and (
                    len(chunk) >= max_queries or (len(chunk) + 1) * (keys + added + 1) > max_scores
                ):
                    chunks.append(chunk)
                    chunk, ancestors, members, keys = [], set(), set(), 0
                    added = sum(len(a.tokens) for a in chain) + offset
                if id(segment) not in members:
                    members.add(id(segment))
                    ancestors.update(id(a) for a in chain)
                    keys += added
                chunk.append((segment, offset))
                keys += 1
        if chunk:
            chunks.append(chunk)
        return chunks

    def chunk_keys(self, queries: list[tuple[Segment, int]]) -> Chunk:
        """The keys ``queries`` attend to that earlier chunks or the tree hold."""
        keys: dict[int, tuple[Segment, torch.Tensor]] = {}
        for segment, _ in queries:
            for ancestor in (*_strict_ancestors(segment), segment):
                if id(ancestor) in keys:
                    continue
                kv = ancestor.keys_so_far()
                if kv is not None:
                    keys[id(ancestor)] = (ancestor, kv)
        ordered = sorted(keys.values(), key=lambda item: item[0].order)
        return Chunk(queries, ordered)


def _strict_ancestors(segment: Segment) -> list[Segment]:
    chain = []
    parent = segment.parent
    while parent is not None:
        chain.append(parent)
        parent = parent.parent
    return chain[::-1]


@dataclass(eq=False)
class _Batch:
    """The batch computing a node: whose, so another tenant's batch need not wait for it."""

    tenant: str | None


class KVTree:
    """Prompt tokens' keys and values in a radix tree, at most ``max_bytes`` of them (0: keep none;
    tokens are still shared between the reads of one batch)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("prefix_cache_mib must be 0 (off) or positive")
        self.max_bytes = max_bytes
        self.bytes = 0
        self.reused_tokens = 0  # prompt tokens whose keys and values were not computed again
        self.computed_tokens = 0
        self.evicted_nodes = 0
        self._roots: dict[str | None, _Node] = {}  # cache salt → its tree's root
        self._clock = itertools.count(1)
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)

    # Planning ---------------------------------------------------------------------------------

    def plan(
        self,
        prompts: Sequence[Sequence[int]],
        reuse: Sequence[bool],
        keep: Sequence[bool] | None = None,
        *,
        wait: bool = True,
        tenant: str | None = None,
        salts: Sequence[str | None] | None = None,
    ) -> Plan | None:
        """The work of reading ``prompts``; a prompt with ``reuse`` False is computed whole, on its
        own (the per-question path, kept to measure what reuse gains). Tokens only prompts with
        ``keep`` False compute leave the tree when the batch is done (they are still shared in it).
        Where prompts run into tokens another batch of ``tenant`` is computing: wait for it, or with
        ``wait`` False return None at once (the engine's compute thread runs that batch meanwhile).
        Prompts that run into another tenant's are computed on their own. ``salts``: each prompt's
        cache salt (default None for all): a prompt reuses only tokens of its own salt's tree."""
        prompts = [tuple(ids) for ids in prompts]
        if any(not ids for ids in prompts):
            raise ValueError("a read needs at least one prompt token")
        keep = [True] * len(prompts) if keep is None else list(keep)
        salts = [None] * len(prompts) if salts is None else list(salts)
        if len(salts) != len(prompts):
            raise ValueError("plan needs one salt per prompt")
        batch = _Batch(tenant)
        with self._lock:
            trees = [self._root(salt) for salt in salts]
            while True:
                blockers = [
                    self._blocked(root, ids) if shared else None
                    for root, ids, shared in zip(trees, prompts, reuse)
                ]
                if not any(b is not None and b.tenant == tenant for b in blockers):
                    break
                if not wait:
                    return None
                self._done.wait()
            reuse = [shared and blocker is None for shared, blocker in zip(reuse, blockers)]
            for root, ids, shared, kept in zip(trees, prompts, reuse, keep):
                if shared:
                    self._insert(root, ids, batch, kept)
            plan = self._segments(trees, prompts, reuse, batch)
            plan.paths = [(salt, ids) if shared else None for salt, ids, shared in zip(salts, prompts, reuse)]
        return plan

    def _root(self, salt: str | None) -> _Node:
        root = self._roots.get(salt)
        if root is None:
            root = self._roots[salt] = _Node((), 0, None)
        return root

    def _blocked(self, root: _Node, ids: tuple[int, ...]) -> _Batch | None:
        """The batch computing tokens ``ids`` runs into, or None."""
        node, at = root, 0
        while at < len(ids):
            child = node.children.get(ids[at])
            if child is None:
                return None
            if child.kv is None:
                return child.batch
            matched = _common(child.tokens, ids, at)
            if matched < len(child.tokens):
                return None
            node, at = child, at + matched
        return None

    def _insert(self, root: _Node, ids: tuple[int, ...], batch: object, keep: bool) -> None:
        """Makes ``ids`` a path of ``root``'s tree: splits a node where ``ids`` leaves it, adds the
        rest as a node this batch computes."""
        node, at = root, 0
        tick = next(self._clock)
        while at < len(ids):
            child = node.children.get(ids[at])
            if child is None:
                node.children[ids[at]] = _Node(ids[at:], at, node, batch=batch, used=tick, keep=keep)
                return
            child.used = tick
            matched = _common(child.tokens, ids, at)
            if matched < len(child.tokens) and at + matched < len(ids):
                self._split(child, matched)
            if keep:
                child.keep = True
            node, at = child, at + matched

    def _split(self, node: _Node, at: int) -> None:
        """``node`` keeps its first ``at`` tokens; a new child takes the rest and the children."""
        tail = _Node(
            node.tokens[at:], node.start + at, node, batch=node.batch, used=node.used, keep=node.keep
        )
        tail.children, node.children = node.children, {tail.tokens[0]: tail}
        for child in tail.children.values():
            child.parent = tail
        tail.hidden = {offset - at: state for offset, state in node.hidden.items() if offset >= at}
        node.hidden = {offset: state for offset, state in node.hidden.items() if offset < at}
        node.tokens = node.tokens[:at]
        if node.kv is not None:
            # Copies, not views: each node then owns exactly the bytes it is charged for.
            tail.kv = node.kv[:, :, :, at:].clone()
            node.kv = node.kv[:, :, :, :at].clone()

    def _segments(
        self, trees: list[_Node], prompts: list[tuple[int, ...]], reuse: Sequence[bool], batch: object
    ) -> Plan:
        by_key: dict[object, Segment] = {}
        children: dict[int, list[Segment]] = {}
        roots: list[Segment] = []
        outputs: list[tuple[Segment, int] | None] = []
        kept: dict[int, torch.Tensor] = {}
        computed = [0] * len(prompts)

        def segment(key: object, **fields) -> Segment:
            """The plan's one segment for ``key``, made from ``fields`` the first time."""
            found = by_key.get(key)
            if found is None:
                found = by_key[key] = Segment(**fields)
                (roots if found.parent is None else children.setdefault(id(found.parent), [])).append(found)
                if found.computed:
                    computed[found.owner] += len(found.tokens)
            return found

        for i, (root, ids, shared) in enumerate(zip(trees, prompts, reuse)):
            if not shared:
                whole = segment(("alone", i), tokens=ids, start=0, parent=None, owner=i)
                outputs.append((whole, len(ids) - 1))
                continue
            parent: Segment | None = None
            node, at = root, 0
            while at < len(ids):
                node = node.children[ids[at]]
                used = min(len(node.tokens), len(ids) - at)
                at += used
                if node.kv is None:  # this batch's own node (others' were waited for, or computed alone)
                    parent = segment(
                        id(node), tokens=node.tokens, start=node.start, parent=parent, node=node, owner=i
                    )
                    if at == len(ids):
                        outputs.append((parent, used - 1))
                elif at < len(ids):
                    parent = segment(
                        id(node), tokens=node.tokens, start=node.start, parent=parent, kv=node.kv
                    )
                elif (state := node.hidden.get(used - 1)) is not None:  # read before: nothing to compute
                    outputs.append(None)
                    kept[i] = state
                else:  # the prompt ends in tokens the tree holds without its state: the last is read again
                    if used > 1:
                        parent = segment(
                            (id(node), used - 1),
                            tokens=node.tokens[: used - 1],
                            start=node.start,
                            parent=parent,
                            kv=node.kv[:, :, :, : used - 1],
                        )
                    again = segment(
                        ("again", id(parent), ids[-1]),
                        tokens=(ids[-1],),
                        start=len(ids) - 1,
                        parent=parent,
                        owner=i,
                    )
                    outputs.append((again, 0))
        # Depth first (iteratively: a path may pass through many nodes), numbering each segment and
        # the last number in its subtree: the ancestor test of ``Chunk.visible``.
        ordered: list[Segment] = []
        stack: list[tuple[Segment, bool]] = [(root, False) for root in reversed(roots)]
        while stack:
            current, leaving = stack.pop()
            if leaving:
                current.last = len(ordered) - 1
                continue
            current.order = len(ordered)
            ordered.append(current)
            stack.append((current, True))
            stack.extend((child, False) for child in reversed(children.get(id(current), ())))
        cached = [len(ids) - n for ids, n in zip(prompts, computed)]
        return Plan(ordered, outputs, computed, cached, batch, kept)

    # Finishing --------------------------------------------------------------------------------

    def finish(self, plan: Plan, hidden: Sequence[torch.Tensor] | None = None) -> None:
        """Keeps what ``plan`` computed, and ``hidden`` (each read's final hidden state, in read
        order) where the read ended, then evicts down to the bound."""
        with self._lock:
            for s in plan.segments:
                if s.node is not None:
                    kv = s.keys_so_far()
                    assert kv is not None and kv.shape[KV_TOKEN_DIM] == len(s.tokens), "segment not computed"
                    s.node.batch = None
                    if not s.node.keep:
                        continue
                    # A slice of a chunk's tensor would keep the whole chunk alive: own the bytes.
                    s.node.kv = kv if kv._base is None else kv.clone()
                    self.bytes += s.node.kv.nbytes
            if hidden is not None:
                for path, state in zip(plan.paths, hidden):
                    if path is not None:
                        self._keep_hidden(*path, state)
            # Not to keep: leave the tree, deepest first (a node's descendants are not kept either).
            for s in reversed(plan.segments):
                node = s.node
                if node is not None and not node.keep and node.parent is not None:
                    if node.parent.children.get(node.tokens[0]) is node:
                        del node.parent.children[node.tokens[0]]
            self.computed_tokens += sum(plan.computed_tokens)
            self.reused_tokens += sum(plan.cached_tokens)
            self._evict()
            self._drop_empty_roots()
            self._done.notify_all()

    def _keep_hidden(self, salt: str | None, ids: tuple[int, ...], state: torch.Tensor) -> None:
        """Keeps ``state`` at the token that ends ``ids``, if the tree holds it (kept, not evicted)."""
        node, at = self._roots.get(salt), 0
        while node is not None and at < len(ids):
            child = node.children.get(ids[at])
            if child is None or child.kv is None or not child.keep:
                return
            matched = _common(child.tokens, ids, at)
            if at + matched == len(ids):
                if matched - 1 not in child.hidden:
                    child.hidden[matched - 1] = state
                    self.bytes += state.nbytes
                return
            if matched < len(child.tokens):
                return
            node, at = child, at + matched

    def abandon(self, plan: Plan) -> None:
        """Takes the nodes ``plan`` was to compute out of the tree (its batch failed)."""
        with self._lock:
            for s in plan.segments:
                node = s.node
                if node is not None and node.kv is None and node.parent is not None:
                    if node.parent.children.get(node.tokens[0]) is node:
                        del node.parent.children[node.tokens[0]]
            self._drop_empty_roots()
            self._done.notify_all()

    def wait_for_change(self, timeout_s: float) -> None:
        """Until a batch finishes or is abandoned, at most ``timeout_s``."""
        with self._lock:
            self._done.wait(timeout_s)

    def clear(self) -> None:
        """Forgets every kept token (tokens a batch is computing stay until it is done): the next
        reads start cold, as after a restart."""
        with self._lock:
            self._evict(0)
            self._drop_empty_roots()

    def _drop_empty_roots(self) -> None:
        """A salt whose every token left the tree: its root goes too (salts come and go with tenants)."""
        for salt in [salt for salt, root in self._roots.items() if not root.children]:
            del self._roots[salt]

    def _evict(self, limit: int | None = None) -> None:
        """Until the tree holds at most ``limit`` bytes (default ``max_bytes``): the least recently
        used leaf of the salt holding the most bytes first. A node being computed is never a
        candidate, nor an ancestor of one (it is not a leaf)."""
        limit = self.max_bytes if limit is None else limit
        if self.bytes <= limit:
            return
        held, heaps = {}, {}
        for salt, root in self._roots.items():
            held[salt] = sum(node.nbytes for node in _descendants(root))
            heaps[salt] = [(node.used, id(node), node) for node in _leaves(root)]
            heapq.heapify(heaps[salt])
        while self.bytes > limit:
            candidates = [salt for salt, heap in heaps.items() if heap]
            if not candidates:
                return
            salt = max(candidates, key=held.__getitem__)
            _, _, node = heapq.heappop(heaps[salt])
            parent = node.parent
            if parent is None or node.children or node.kv is None:
                continue
            del parent.children[node.tokens[0]]
            self.bytes -= node.nbytes
            held[salt] -= node.nbytes
            node.kv, node.hidden = None, {}
            self.evicted_nodes += 1
            if parent.parent is not None and not parent.children and parent.kv is not None:
                heapq.heappush(heaps[salt], (parent.used, id(parent), parent))

    def stats(self) -> dict[str, int]:
        with self._lock:
            computed = [
                node for root in self._roots.values() for node in _descendants(root) if node.kv is not None
            ]
            nodes, tokens = len(computed), sum(len(node.tokens) for node in computed)
            return {
                "salts": len(self._roots),
                "nodes": nodes,
                "tokens": tokens,
                "bytes": self.bytes,
                "max_bytes": self.max_bytes,
                "computed_tokens": self.computed_tokens,
                "reused_tokens": self.reused_tokens,
                "evicted_nodes": self.evicted_nodes,
            }


def _descendants(root: _Node):
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        yield node


def _leaves(root: _Node):
    """``root``'s computed leaves: what eviction may take."""
    return (node for node in _descendants(root) if not node.children and node.kv is not None)


def _common(tokens: tuple[int, ...], ids: tuple[int, ...], at: int) -> int:
    """How many of ``tokens`` match ``ids`` from ``at`` on. Runs are compared as tuples (in C), and a
    mismatch is found by halving: a node of a many-option list holds thousands of tokens, which every
    prompt through it is compared with, up to three times per batch (``_blocked``, ``_insert``,
    ``_keep_hidden``)."""
    other = ids[at : at + len(tokens)]
    if tokens[: len(other)] == other:
        return len(other)
    matched, unmatched = 0, len(other)  # tokens[:matched] == other[:matched]; not so at unmatched
    while unmatched - matched > 1:
        middle = (matched + unmatched) // 2
        if tokens[matched:middle] == other[matched:middle]:
            matched = middle
        else:
            unmatched = middle
    return matched
