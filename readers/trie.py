"""A token trie of label sequences: which tokens to read after which prefix.

A node is a prefix of one or more labels' token ids (the root is the empty prefix); its children are
the distinct next tokens of the labels under it. Reading every node once gives each label's
probability by the chain rule; nodes of one depth are independent, so they are read together.
"""

from __future__ import annotations

from collections.abc import Sequence


class Trie:
    """The trie of ``sequences`` (distinct, non-empty token-id tuples, none a prefix of another)."""

    def __init__(self, sequences: Sequence[tuple[int, ...]]) -> None:
        if not sequences or any(not ids for ids in sequences):
            raise ValueError("a trie needs at least one non-empty sequence")
        if len(set(sequences)) != len(sequences):
            raise ValueError("trie sequences must be distinct")
        self.sequences = tuple(tuple(ids) for ids in sequences)
        self._children: dict[tuple[int, ...], list[int]] = {}
        for ids in self.sequences:
            for depth, token in enumerate(ids):
                children = self._children.setdefault(ids[:depth], [])
                if token not in children:
                    children.append(token)
        if any(ids in self._children for ids in self.sequences):
            raise ValueError("a trie sequence is a prefix of another")
        self.depth = max(len(ids) for ids in self.sequences)

    def nodes_at(self, depth: int) -> list[tuple[int, ...]]:
        """The nodes (prefixes) of ``depth`` tokens that have children, in first-seen order."""
        return [node for node in self._children if len(node) == depth]

    def children(self, node: tuple[int, ...]) -> tuple[int, ...]:
        """The distinct next tokens after ``node``, in first-seen order."""
        return tuple(self._children[node])

    def path(self, index: int) -> list[tuple[tuple[int, ...], int]]:
        """Sequence ``index``'s steps as (node, index of its token among that node's children)."""
        ids = self.sequences[index]
        return [(ids[:depth], self._children[ids[:depth]].index(token)) for depth, token in enumerate(ids)]

    @property
    def node_count(self) -> int:
        return len(self._children)
