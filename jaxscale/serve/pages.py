"""The page allocator of the paged KV cache (jaxscale/model/kv_cache.py): a free list of page
ids with reference counts, so a shared prefix's pages can belong to several requests and return
to the free list when the last one lets go. Page 0 is never handed out: unused block-table
entries point at it, and it is only ever read there, under the causal mask."""

from __future__ import annotations

import math
from collections import deque

NULL_PAGE = 0


class OutOfPages(RuntimeError):
    """Fewer free pages than asked for; the scheduler preempts a request and retries."""


class PageAllocator:
    def __init__(self, n_pages: int, page_size: int):
        if n_pages < 2 or page_size < 1:
            raise ValueError(
                f"need n_pages >= 2 (page 0 is reserved) and page_size >= 1, got "
                f"{n_pages}, {page_size}"
            )
        self.n_pages, self.page_size = n_pages, page_size
        self.free_ids: deque[int] = deque(range(1, n_pages))
        self.refs = [0] * n_pages

    @property
    def n_free(self) -> int:
        return len(self.free_ids)

    def pages_for(self, tokens: int) -> int:
        """Pages that hold `tokens` positions."""
        return math.ceil(tokens / self.page_size)

    def allocate(self, n: int) -> list[int]:
        """n fresh pages (reference count 1), or OutOfPages with nothing taken."""
        if n > len(self.free_ids):
            raise OutOfPages(f"asked for {n} pages, {len(self.free_ids)} free")
        ids = [self.free_ids.popleft() for _ in range(n)]
        for i in ids:
            self.refs[i] = 1
        return ids

    def share(self, ids: list[int]) -> None:
        """One more owner of each page (a request reusing a cached prefix)."""
        for i in ids:
            if self.refs[i] < 1:
                raise ValueError(f"page {i} is free; only pages in use can be shared")
            self.refs[i] += 1

    def release(self, ids: list[int]) -> None:
        """One owner fewer; a page nobody owns goes back to the free list."""
        for i in ids:
            if self.refs[i] < 1:
                raise ValueError(f"page {i} released more often than it was taken")
            self.refs[i] -= 1
            if self.refs[i] == 0:
                self.free_ids.append(i)
