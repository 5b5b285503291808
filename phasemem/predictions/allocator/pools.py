"""One device's caching allocator (``DeviceCachingAllocator``): its pools of free blocks, the blocks
split from and merged back into segments, and the cap that makes it give cached segments back or fail."""
from __future__ import annotations

from bisect import bisect_left, insort

from .rules import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    NO_LIMIT,
    Settings,
)

#: Where the replay's own segments are placed (cudaMalloc's addresses are the driver's to choose and
#: decide ties between free blocks of one size): each below the last, from here down. The driver's
#: rule is not known (most new segments of the fixtures' traces land between earlier ones); with this
#: one 273 of 312 fixture traces replay their segments exactly; ascending addresses did no better on
#: the capacity and plans traces (docs/accuracy.md, "What fits").
VA_TOP = 1 << 56


class _Block:
    __slots__ = ("addr", "size", "stream", "small", "prev", "next", "allocated")

    def __init__(self, addr, size, stream, small, prev=None, nxt=None, allocated=False):
        self.addr, self.size, self.stream, self.small = addr, size, stream, small
        self.prev, self.next, self.allocated = prev, nxt, allocated


class CachingAllocator:
    """One device's DeviceCachingAllocator, default pools only (no CUDA graph pools, no expandable
    segments), over block ids instead of pointers.

        >>> a = CachingAllocator(cap=1 << 30)
        >>> a.malloc(0, 3 << 20, stream=0), a.reserved   # (True, 20 MiB): a 20 MiB segment, split
    """

    def __init__(self, cap: int | None = None, settings: Settings = Settings(), va_top: int = VA_TOP,
                 addresses: list[tuple[int, int]] | None = None):
        self.cap = NO_LIMIT if cap is None else int(cap)
        # the trace's own segments (size, address) in the order it made them: used while the replay
        # makes the same ones (a check of the rules, with the driver's ties as they were)
        self._planned = list(reversed(addresses or []))
        self.max_split = settings.max_split_size
        self.reserved = 0
        self.allocated = 0  # bytes of the blocks in use (rounded sizes)
        self._pools: dict[tuple, list] = {}  # (small, stream) -> sorted [(size, addr)] of free blocks
        self._free: dict[int, _Block] = {}  # addr -> free block
        self._live: dict[int, _Block] = {}  # block id -> its block
        self._va = va_top
        self.log: list[int] = []  # +size: a segment made, -size: one given back
        self.log_addr: list[int] = []  # its address
        self.oom_size = 0  # the segment the failed request asked for
        self.last_addr = 0  # the address the last malloc served

    # -- the pools
    def _insert(self, b: _Block) -> None:
        self._free[b.addr] = b
        insort(self._pools.setdefault((b.small, b.stream), []), (b.size, b.addr))

    def _remove(self, b: _Block) -> None:
        del self._free[b.addr]
        lst = self._pools[(b.small, b.stream)]
        del lst[bisect_left(lst, (b.size, b.addr))]

    # -- the state at the start of a replay
    def add_segment(self, addr: int, size: int, stream: int, blocks=()) -> None:
        """A segment already reserved, with its blocks in use: ``blocks`` is (block id, address,
        size) in address order, inside [addr, addr + size); the gaps are free blocks."""
        small = size <= K_SMALL_BUFFER
        pieces, at = [], addr
        for bid, b_addr, b_size in blocks:
            if b_addr > at:
                pieces.append((None, at, b_addr - at))
            pieces.append((bid, b_addr, b_size))
            at = b_addr + b_size
        if at < addr + size:
            pieces.append((None, at, addr + size - at))
        prev = None
        for bid, b_addr, b_size in pieces:
            b = _Block(b_addr, b_size, stream, small, prev, None, bid is not None)
            if prev is not None:
                prev.next = b
            prev = b
            if bid is None:
                self._insert(b)
            else:
                self._live[bid] = b
                self.allocated += b_size
        self.reserved += size
        self._va = min(self._va, addr)

    # -- malloc and free, as DeviceCachingAllocator's
    def malloc(self, bid: int, requested: int, stream: int) -> bool:
        """Serve a request; False where it runs out of memory (``oom_size``: the segment it asked for)."""
        return self.malloc_rounded(bid, max(K_MIN_BLOCK, -(-int(requested) // K_MIN_BLOCK) * K_MIN_BLOCK), stream)

    def malloc_rounded(self, bid: int, size: int, stream: int) -> bool:
        """``malloc`` of a size already rounded (``round_size``)."""
        small = size <= K_SMALL_SIZE
        b = self._get_free_block(small, stream, size)
        if b is None:
            seg = K_SMALL_BUFFER if small else K_LARGE_BUFFER if size < K_MIN_LARGE_ALLOC else \
                -(-size // K_ROUND_LARGE) * K_ROUND_LARGE
            b = self._alloc_block(small, stream, seg)
            if b is None and self.max_split < NO_LIMIT and self._release_available(small, stream, size):
                b = self._alloc_block(small, stream, seg)
            if b is None:
                self.release_cached()
                b = self._alloc_block(small, stream, seg)
            if b is None:
                self.oom_size = seg
                return False
        remaining = b.size - size
        if (remaining >= K_MIN_BLOCK) if small else (size < self.max_split and remaining > K_SMALL_SIZE):
            rest = _Block(b.addr + size, remaining, stream, small, b, b.next)
            if b.next is not None:
                b.next.prev = rest
            b.next, b.size = rest, size
            self._insert(rest)
        b.allocated = True
        self._live[bid] = b
        self.allocated += b.size
        self.last_addr = b.addr
        return True

    def free(self, bid: int) -> None:
        b = self._live.pop(bid, None)
        if b is None:
            return
        b.allocated = False
        self.allocated -= b.size
        p = b.prev
        if p is not None and not p.allocated:
            self._remove(p)
            b.addr, b.size, b.prev = p.addr, p.size + b.size, p.prev
            if p.prev is not None:
                p.prev.next = b
        n = b.next
        if n is not None and not n.allocated:
            self._remove(n)
            b.size, b.next = b.size + n.size, n.next
            if n.next is not None:
                n.next.prev = b
        self._insert(b)

    def release_cached(self) -> None:
        """``release_cached_blocks`` (also ``torch.cuda.empty_cache()``): every cached segment with no
        block in use goes back to the driver."""
        whole = [b for b in self._free.values() if b.prev is None and b.next is None]
        for b in sorted(whole, key=lambda b: (b.small, b.stream, b.size, b.addr)):
            self._release(b)

    def _release(self, b: _Block) -> None:
        self._remove(b)
        self.reserved -= b.size
        self.log.append(-b.size)
        self.log_addr.append(b.addr)

    def _get_free_block(self, small: bool, stream: int, size: int) -> _Block | None:
        lst = self._pools.get((small, stream))
        if not lst:
            return None
        i = bisect_left(lst, (size, -1))
        if i == len(lst):
            return None
        b_size, addr = lst[i]
        if self.max_split < NO_LIMIT:
            if size < self.max_split and b_size >= self.max_split:
                return None  # an oversize block is not split for a smaller request
            if size >= self.max_split and b_size >= size + K_LARGE_BUFFER:
                return None
        del lst[i]
        return self._free.pop(addr)

    def _alloc_block(self, small: bool, stream: int, seg: int) -> _Block | None:
        if self.reserved + seg > self.cap:
            return None
        if self._planned and self._planned[-1][0] == seg:
            addr = self._planned.pop()[1]
        else:
            self._planned = []  # the replay went its own way: its own addresses from here
            self._va -= seg
            addr = self._va
        self.reserved += seg
        self.log.append(seg)
        self.log_addr.append(addr)
        return _Block(addr, seg, stream, small)

    def _release_available(self, small: bool, stream: int, size: int) -> bool:
        """``release_available_cached_blocks`` (only where max_split_size is set): the smallest whole
        oversize block that covers the request, else oversize ones from the largest down."""
        lst = self._pools.get((small, stream)) or []
        key = max(size, self.max_split)
        whole = [self._free[a] for s, a in lst if s >= self.max_split and self._free[a].prev is None
                 and self._free[a].next is None]
        big = [b for b in whole if b.size >= key]
        if big:
            self._release(min(big, key=lambda b: (b.size, b.addr)))
            return True
        freed = 0
        for b in sorted(whole, key=lambda b: (b.size, b.addr), reverse=True):
            if freed >= key:
                break
            freed += b.size
            self._release(b)
        return freed >= key
