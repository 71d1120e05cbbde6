"""The radix prefix cache: a compressed radix tree over token runs whose nodes own KV pages, so a
request that starts with a cached prefix reuses those pages instead of recomputing them
(SGLang's RadixAttention, at page granularity: only whole pages are shared, since a page is the
unit a block table points at).

Each edge holds a run of tokens (a multiple of page_size long) and the pages that hold their
keys and values. The tree owns one reference to every page in it (PageAllocator.share), and each
request using a node owns another; a node no running request uses is evictable, least recently
used leaves first, which gives its pages back to the allocator.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from jaxscale.serve.pages import PageAllocator


@dataclass(eq=False)
class Node:
    tokens: tuple[int, ...] = ()  # the edge from the parent
    pages: list[int] = field(default_factory=list)
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)  # by first page's tokens
    parent: Node | None = None
    users: int = 0  # running requests holding this node's pages
    last_used: int = 0


class RadixCache:
    def __init__(self, allocator: PageAllocator):
        self.allocator, self.ps = allocator, allocator.page_size
        self.root = Node()
        self.clock = itertools.count(1)
        self.hit_tokens = self.query_tokens = 0

    def _key(self, tokens) -> tuple[int, ...]:
        return tuple(tokens[: self.ps])

    def match(self, tokens: list[int]) -> tuple[list[int], list[Node]]:
        """The pages of the longest cached prefix of `tokens` (whole pages, leaving at least one
        token to compute, whose logits the request needs) and the nodes on its path, each now
        used once more (hand them back with `unlock`)."""
        limit = (len(tokens) - 1) // self.ps * self.ps
        node, pos, pages, path = self.root, 0, [], []
        now = next(self.clock)
        while pos < limit:
            child = node.children.get(self._key(tokens[pos:]))
            if child is None:
                break
            n = self._common(child.tokens, tokens, pos, limit)
            if n == 0:
                break
            if n < len(child.tokens):
                child = self._split(child, n)
            pages += child.pages
            path.append(child)
            pos += n
            node = child
        for nd in path:
            nd.users += 1
            nd.last_used = now
        self.allocator.share(pages)  # the request's own reference
        return pages, path

    def record(self, hit: int, queried: int) -> None:
        """Count one admitted request's lookup in the hit rate (the scheduler calls this once
        per admission, not for lookups whose admission failed and is retried)."""
        self.hit_tokens += hit
        self.query_tokens += queried

    def _common(self, edge: tuple[int, ...], tokens, pos: int, limit: int) -> int:
        """Tokens (whole pages) that `edge` shares with tokens[pos:limit]."""
        n, ps = 0, self.ps
        while (
            n + ps <= len(edge)
            and pos + n + ps <= limit
            and edge[n : n + ps] == tuple(tokens[pos + n : pos + n + ps])
        ):
            n += ps
        return n

    def _split(self, child: Node, n: int) -> Node:
        """Cut `child`'s edge after n tokens; returns the new upper node."""
        upper = Node(
            child.tokens[:n],
            child.pages[: n // self.ps],
            {},
            child.parent,
            child.users,
            child.last_used,
        )
        child.parent.children[self._key(child.tokens)] = upper
        child.tokens, child.pages = child.tokens[n:], child.pages[n // self.ps :]
        child.parent = upper
        upper.children[self._key(child.tokens)] = child
        return upper

    def unlock(self, path: list[Node]) -> None:
        """Hand back the nodes `match` returned. An edge split since then put a new node above
        one of them that holds the same use, so the whole chain from the deepest node up to the
        root is released, not just the nodes in `path`."""
        nd = path[-1] if path else None
        while nd is not None and nd is not self.root:
            nd.users -= 1
            nd = nd.parent

    def insert(self, tokens: list[int], pages: list[int]) -> None:
        """Cache the whole pages of `tokens` (held in `pages`, position order); pages of a
        prefix already cached stay the tree's, the new ones gain the tree's reference."""
        n_full = min(len(tokens) // self.ps, len(pages))
        node, pos, now = self.root, 0, next(self.clock)
        while pos < n_full * self.ps:
            child = node.children.get(self._key(tokens[pos:]))
            if child is None:
                rest = tuple(tokens[pos : n_full * self.ps])
                new = Node(rest, pages[pos // self.ps : n_full], {}, node, 0, now)
                self.allocator.share(new.pages)
                node.children[self._key(rest)] = new
                return
            n = self._common(child.tokens, tokens, pos, n_full * self.ps)
            if n < len(child.tokens):
                child = self._split(child, n)
            child.last_used = now
            node, pos = child, pos + n

    def pages_held(self) -> int:
        """KV pages the tree holds (each cached token once, however many requests share it)."""
        return sum(len(nd.pages) for nd in self._nodes())

    def evictable_pages(self) -> int:
        return sum(len(nd.pages) for nd in self._nodes() if nd.users == 0)

    def evict(self, n_pages: int) -> int:
        """Free at least n_pages (if the tree can): least recently used unused leaves first.
        Returns the pages given back."""
        freed = 0
        while freed < n_pages:
            leaves = [nd for nd in self._nodes() if not nd.children and nd.users == 0]
            if not leaves:
                break
            leaf = min(leaves, key=lambda nd: nd.last_used)
            del leaf.parent.children[self._key(leaf.tokens)]
            self.allocator.release(leaf.pages)
            freed += len(leaf.pages)
        return freed

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            nd = stack.pop()
            yield nd
            stack.extend(nd.children.values())

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0
