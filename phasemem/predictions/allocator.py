"""PyTorch's CUDA caching allocator replayed over a trace's allocations and frees: which segments it
would reserve, and whether it would run out of memory under a cap. What a capped card fails on is
the allocator's fragmentation at the new size, not the allocated peak (docs/what-if.md, capacity).

The rules are torch 2.11's ``c10/cuda/CUDACachingAllocator.cpp`` (``DeviceCachingAllocator``), with
its defaults: sizes rounded up to 512 B; requests of at most 1 MiB served from the small pool (2 MiB
segments), larger ones from the large pool (a 20 MiB segment under 10 MiB, else the size rounded up
to 2 MiB); the smallest free block of the same pool and stream that fits (ties: the lowest address);
the rest split off where more than 1 MiB (large pool) or at least 512 B (small pool) remains; a freed
block merged with its free neighbours. A new segment that would take the reserved bytes over the cap
(``set_per_process_memory_fraction``) first makes the allocator give back every cached segment with
no block in use, then try once more; an out-of-memory error when still over. What the driver would
refuse (other processes, the CUDA context) is not modelled: the cap is the budget.

Example:
    >>> r = replay_trace(trace, lifetimes)                  # the trace's own segments, replayed
    >>> r.segment_event, r.segment_size                      # where each was made (+) or freed (-)
    >>> replay_trace(trace, lifetimes, cap=8 << 30).oom_event  # None: it fits under 8 GiB
"""
from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field

import numpy as np

from ..read.trace import A, Trace

K_MIN_BLOCK = 512  # kMinBlockSize: every size is rounded up to a multiple of it
K_SMALL_SIZE = 1 << 20  # kSmallSize: the largest request the small pool serves
K_SMALL_BUFFER = 2 << 20  # kSmallBuffer: the small pool's segments
K_LARGE_BUFFER = 20 << 20  # kLargeBuffer: the segment of a large request under kMinLargeAlloc
K_MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
K_ROUND_LARGE = 2 << 20  # kRoundLarge: larger requests' segments are rounded up to it
NO_LIMIT = 1 << 62  # max_split_size when not set (torch: SIZE_MAX)
#: Where the replay's own segments are placed (cudaMalloc's addresses are the driver's to choose and
#: decide ties between free blocks of one size): each below the last, from here down. The driver's
#: rule is not known (most new segments of the fixtures' traces land between earlier ones); with this
#: one 273 of 312 fixture traces replay their segments exactly; ascending addresses did no better on
#: the capacity and plans traces (docs/accuracy.md, "What fits").
VA_TOP = 1 << 56

# op codes of a replay's event list
FREE, ALLOC, EMPTY_CACHE = 0, 1, 2


def round_size(size: np.ndarray | int) -> np.ndarray:
    """``round_size``: the block a request gets, at least 512 B and a multiple of it (the default
    configuration: no roundup_power2_divisions)."""
    s = np.asarray(size, np.int64)
    return np.maximum(K_MIN_BLOCK, (s + K_MIN_BLOCK - 1) // K_MIN_BLOCK * K_MIN_BLOCK)


def allocation_size(size: np.ndarray | int) -> np.ndarray:
    """``get_allocation_size``: the segment cudaMalloc is asked for when no cached block fits a
    (rounded) request."""
    s = np.asarray(size, np.int64)
    return np.where(s <= K_SMALL_SIZE, K_SMALL_BUFFER,
                    np.where(s < K_MIN_LARGE_ALLOC, K_LARGE_BUFFER, (s + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE))


@dataclass(frozen=True)
class Settings:
    """What of ``PYTORCH_CUDA_ALLOC_CONF`` the replay follows (the snapshot's ``allocator_settings``)."""

    max_split_size: int = NO_LIMIT

    @classmethod
    def of(cls, trace: Trace) -> "Settings | str":
        """The trace's settings, or why the replay cannot follow them."""
        s = trace.allocator_settings or {}
        if s.get("expandable_segments") or np.isin(trace.action, [A["segment_map"], A["segment_unmap"]]).any():
            return "expandable segments (the allocator maps pages into one segment per stream): not replayed"
        if _in_private_pools(trace):
            return "the trace allocates in CUDA graphs' private memory pools (a captured graph's): not replayed"
        if float(s.get("garbage_collection_threshold") or 0) > 0:
            return "garbage_collection_threshold is set: the allocator's collection of old cached blocks is not replayed"
        if any(int(v or 0) > 1 for v in (s.get("roundup_power2_divisions") or {}).values()):
            return "roundup_power2_divisions is set: its rounding is not replayed"
        mss = int(s.get("max_split_size", -1) or -1)
        return cls(NO_LIMIT if mss <= 0 or mss >= NO_LIMIT else mss)


def _in_private_pools(trace: Trace) -> bool:
    """Whether an allocation of the trace lies in a segment of a CUDA graph's private pool (the
    snapshot's ``segment_pool_id``). Such segments that the trace does not allocate in are kept as
    they are, reserved, neither used nor given back."""
    seg = trace.segments
    if seg is None or not len(seg) or not seg[:, 3].any():
        return False
    priv = seg[seg[:, 3] != 0]
    priv = priv[np.argsort(priv[:, 0])]
    addr = trace.addr[trace.action == A["alloc"]]
    k = np.searchsorted(priv[:, 0], addr, "right") - 1
    return bool(((k >= 0) & (addr < priv[np.maximum(k, 0), 0] + priv[np.maximum(k, 0), 1])).any())


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


# -- over a trace ------------------------------------------------------------------------------------
@dataclass
class Layout:
    """The segments reserved just before event ``at`` and the blocks in use inside them, as the trace
    and its snapshot say (``layout_at``)."""

    at: int
    seg_addr: np.ndarray  # int64, sorted
    seg_size: np.ndarray
    seg_stream: np.ndarray
    block: np.ndarray  # Lifetimes index of each block placed in them, by address
    block_addr: np.ndarray
    block_size: np.ndarray  # the block's extent (rounded, with what was not split off)
    unplaced: np.ndarray  # Lifetimes index of the blocks alive at ``at`` in no known segment
    known: bool  # False: the snapshot has no segments (every block alive at ``at`` is unplaced)
    seg_private: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # a CUDA graph's pool: kept as is


def layout_at(trace: Trace, life, at: int = 0) -> Layout:
    """The allocator's segments and blocks just before event ``at``: the snapshot's segments (the
    state at its end) with the trace's segment events after ``at`` undone; the blocks alive then
    (``life``: the trace's Lifetimes) at their recorded addresses, each as large as the snapshot
    says, else its request rounded up plus, in the large pool, the remainder of 1 MiB or less after
    it that the allocator does not split off."""
    n = len(trace)
    alive = np.flatnonzero((life.alloc_event < at) & (life.free_event >= at))
    alive = alive[np.argsort(life.addr[alive], kind="stable")]
    if trace.segments is None:
        z = np.zeros(0, np.int64)
        return Layout(at, z, z, z, z, z, z, alive, False, np.zeros(0, bool))
    segs = {int(a): (int(s), int(st), int(pv)) for a, s, st, pv in trace.segments.tolist()}
    ev = np.flatnonzero(np.isin(trace.action[at:], [A["segment_alloc"], A["segment_free"]])) + at
    for e in ev[::-1].tolist():  # undo, last first
        if trace.action[e] == A["segment_alloc"]:
            segs.pop(int(trace.addr[e]), None)
        else:
            segs[int(trace.addr[e])] = (int(trace.size[e]), int(trace.stream[e]), 0)
    seg_addr = np.array(sorted(segs), np.int64)
    seg_size = np.array([segs[a][0] for a in seg_addr.tolist()], np.int64)
    seg_stream = np.array([segs[a][1] for a in seg_addr.tolist()], np.int64)
    seg_private = np.array([segs[a][2] for a in seg_addr.tolist()], bool)
    addr = life.addr[alive]
    k = np.searchsorted(seg_addr, addr, "right") - 1
    inside = (k >= 0) & (addr < seg_addr[np.maximum(k, 0)] + seg_size[np.maximum(k, 0)])
    unplaced = alive[~inside]
    blk, k, addr = alive[inside], k[inside], addr[inside]
    ext = round_size(life.size[blk])
    # the snapshot's own block sizes, for blocks still in use at its end
    sb = trace.segment_blocks
    if sb is not None and len(sb):
        at_end = {a: s for a, s, used in sb.tolist() if used}
        known = np.array([life.free_event[b] == n and int(a) in at_end for b, a in zip(blk.tolist(), addr.tolist())], bool)
        ext[known] = [at_end[int(a)] for a in addr[known].tolist()]
    else:
        known = np.zeros(len(blk), bool)
    end = seg_addr[k] + seg_size[k]
    nxt = np.append(addr[1:], 0)
    same = np.append(k[1:] == k[:-1], False)
    limit = np.where(same, nxt, end)
    # an allocation the trace makes while the block lives, starting within 1 MiB after its rounded
    # end, starts a free block there: the bytes between were the block's (a large free block is
    # always over 1 MiB: nothing smaller is split off)
    made = np.flatnonzero(trace.action[at:] == A["alloc"]) + at
    by_addr = made[np.argsort(trace.addr[made], kind="stable")]
    m_addr = trace.addr[by_addr]
    large = seg_size[k] > K_SMALL_BUFFER
    for i in np.flatnonzero(~known & large).tolist():
        lo = int(np.searchsorted(m_addr, addr[i] + ext[i], "left"))
        hi = int(np.searchsorted(m_addr, addr[i] + ext[i] + K_SMALL_SIZE, "right"))
        hit = by_addr[lo:hi][by_addr[lo:hi] < life.free_event[blk[i]]]
        if len(hit):
            limit[i] = min(limit[i], int(trace.addr[hit].min()))
    gap = limit - (addr + ext)
    ext = np.where(~known & large & (gap > 0) & (gap <= K_SMALL_SIZE), limit - addr, ext)
    ext = np.minimum(ext, limit - addr)  # never over the next block (a damaged trace)
    return Layout(at, seg_addr, seg_size, seg_stream, blk, addr, ext, unplaced, True, seg_private)


def outside_segments(trace: Trace, layout: Layout) -> int:
    """How many of the trace's allocations from ``layout.at`` on lie in no segment it knows of (the
    layout's, or one the trace makes): none in a trace of PyTorch's CUDA allocator; a hand-built trace,
    or one from the CPU profiler, has no segments to replay."""
    made = np.flatnonzero(trace.action[layout.at:] == A["segment_alloc"]) + layout.at
    lo = np.concatenate([layout.seg_addr, trace.addr[made]])
    hi = np.concatenate([layout.seg_addr + layout.seg_size, trace.addr[made] + trace.size[made]])
    addr = trace.addr[np.flatnonzero(trace.action[layout.at:] == A["alloc"]) + layout.at]
    if not len(lo):
        return len(addr)
    order = np.argsort(lo, kind="stable")
    lo, reach = lo[order], np.maximum.accumulate(hi[order])  # the furthest end of any range starting below
    k = np.searchsorted(lo, addr, "right") - 1
    return int(((k < 0) | (addr >= reach[np.maximum(k, 0)])).sum())


def block_streams(trace: Trace, life) -> np.ndarray:
    """The stream each block (Lifetimes order) was allocated on: its alloc event's, else its free
    event's, else the trace's most common."""
    n = len(trace)
    common = int(np.bincount(np.unique(trace.stream, return_inverse=True)[1]).argmax()) if n else 0
    common = int(np.unique(trace.stream)[common]) if n else 0
    out = np.full(len(life.size), common, np.int64)
    a, f = life.alloc_event >= 0, (life.alloc_event < 0) & (life.free_event < n)
    out[a] = trace.stream[life.alloc_event[a]]
    out[f] = trace.stream[life.free_event[f]]
    return out


def empty_cache_events(trace: Trace) -> np.ndarray:
    """Where the trace gave cached segments back (the first of each run of ``segment_free``):
    ``torch.cuda.empty_cache()`` or an out-of-memory retry. A replay does the same there."""
    sf = trace.action == A["segment_free"]
    first = sf & ~np.concatenate([[False], sf[:-1]])
    return np.flatnonzero(first)


@dataclass
class Replay:
    """What the allocator did over the events replayed."""

    start: int
    stop: int  # one past the last event replayed (the out-of-memory event where there was one)
    oom_event: int | None  # the event whose allocation ran out of memory
    oom_size: int  # the segment it asked for ("Tried to allocate")
    segment_event: np.ndarray  # the event at which each segment was made or given back
    segment_size: np.ndarray  # + made, - given back
    segment_addr: np.ndarray
    reserved_start: int
    reserved_peak: int
    allocated_peak: int  # rounded block sizes
    alloc_addr: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per alloc replayed (see replay)
    alloc_event: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def reserved_after(self, n: int | None = None) -> np.ndarray:
        """Reserved bytes after each event start..stop-1 (or of ``n`` events from start)."""
        n = self.stop - self.start if n is None else n
        d = np.zeros(n, np.int64)
        np.add.at(d, self.segment_event - self.start, self.segment_size)
        return self.reserved_start + np.cumsum(d)


def replay(alloc: np.ndarray, free: np.ndarray, size: np.ndarray, stream: np.ndarray, layout: Layout,
           cap: int | None = None, settings: Settings = Settings(), start: int | None = None,
           stop: int | None = None, kept: np.ndarray | None = None, empty_cache_at: np.ndarray | None = None,
           addresses: list | None = None, record_addresses: bool = False) -> Replay:
    """Replay blocks ``alloc``..``free`` (event indices; -1 before the trace, n never freed) of
    ``size`` requested bytes on ``stream`` through the allocator, from ``layout`` (the state at event
    ``start``, default ``layout.at``) to event ``stop``, under ``cap``. Blocks placed in the layout
    stay where they are while ``kept`` (default: all); blocks alive at ``start`` that are not are
    allocated first, in the order they were made. At one event, frees come before allocations (as
    ``replay.points`` counts them)."""
    start = layout.at if start is None else start
    n = int(max(int(free.max(initial=0)), int(alloc.max(initial=0)) + 1)) if stop is None else stop
    stop = n if stop is None else stop
    a = CachingAllocator(cap, settings, addresses=addresses)
    kept = np.ones(len(size), bool) if kept is None else kept
    placed = np.zeros(len(size), bool)
    if layout.known:
        ok = kept[layout.block] & (size[layout.block] > 0)
        placed[layout.block[ok]] = True
        k = np.searchsorted(layout.seg_addr, layout.block_addr[ok], "right") - 1
        by_seg: dict[int, list] = {}
        for i, bid, addr, ext in zip(k.tolist(), layout.block[ok].tolist(), layout.block_addr[ok].tolist(),
                                     layout.block_size[ok].tolist()):
            by_seg.setdefault(i, []).append((bid, addr, ext))
        private = layout.seg_private if len(layout.seg_private) == len(layout.seg_addr) else \
            np.zeros(len(layout.seg_addr), bool)
        for i, (addr, ssz, sst, pv) in enumerate(zip(layout.seg_addr.tolist(), layout.seg_size.tolist(),
                                                     layout.seg_stream.tolist(), private.tolist())):
            if pv:  # a graph's pool: reserved, never used nor given back by the default pools
                a.reserved += ssz
            else:
                a.add_segment(addr, ssz, sst, by_seg.get(i, ()))
    reserved_start = a.reserved
    alive = np.flatnonzero((alloc < start) & (free >= start) & ~placed & (size > 0))
    alive = alive[np.lexsort((alive, alloc[alive]))]
    rounded = round_size(size)
    for bid in alive.tolist():  # blocks to lay out afresh: made before the replay, in their order
        if not a.malloc_rounded(bid, int(rounded[bid]), int(stream[bid])):
            return Replay(start, start, start, a.oom_size, np.full(len(a.log), start, np.int64),
                          np.array(a.log, np.int64), np.array(a.log_addr, np.int64), reserved_start,
                          max(a.reserved, reserved_start), a.allocated)
    # the events: frees (key 4e+1), allocations (4e+2), frees of blocks made at the same event (4e+3),
    # empty_cache before all (4e)
    live = size > 0
    ia = np.flatnonzero(live & (alloc >= start) & (alloc < stop))
    jf = np.flatnonzero(live & (free >= start) & (free < stop) & (free >= alloc) & (alloc < stop))
    ec = np.asarray(empty_cache_at if empty_cache_at is not None else [], np.int64)
    ec = ec[(ec >= start) & (ec < stop)]
    key = np.concatenate([alloc[ia] * 4 + 2, free[jf] * 4 + np.where(free[jf] == alloc[jf], 3, 1), ec * 4])
    op = np.concatenate([np.full(len(ia), ALLOC, np.int8), np.full(len(jf), FREE, np.int8),
                         np.full(len(ec), EMPTY_CACHE, np.int8)])
    who = np.concatenate([ia, jf, np.zeros(len(ec), np.int64)])
    order = np.argsort(key, kind="stable")
    key, op, who = key[order], op[order], who[order]
    ev_of = (key // 4).tolist()
    sizes, streams = rounded.tolist(), stream.tolist()
    seg_ev = [start] * len(a.log)
    logged = len(a.log)
    peak_res, peak_alloc = a.reserved, a.allocated
    oom = None
    addrs, aevs = [], []
    malloc, free_, log = a.malloc_rounded, a.free, a.log
    for o, bid, e in zip(op.tolist(), who.tolist(), ev_of):
        if o == ALLOC:
            if not malloc(bid, sizes[bid], streams[bid]):
                oom = e
                break
            if record_addresses:
                addrs.append(a.last_addr)
                aevs.append(e)
            if a.allocated > peak_alloc:
                peak_alloc = a.allocated
        elif o == FREE:
            free_(bid)
        else:
            a.release_cached()
        if len(log) != logged:
            seg_ev.extend([e] * (len(log) - logged))
            logged = len(log)
            if a.reserved > peak_res:
                peak_res = a.reserved
    if oom is not None and len(log) != logged:
        seg_ev.extend([oom] * (len(log) - logged))
    return Replay(start, stop if oom is None else oom, oom, a.oom_size if oom is not None else 0,
                  np.array(seg_ev, np.int64), np.array(log, np.int64), np.array(a.log_addr, np.int64),
                  reserved_start, peak_res, peak_alloc, np.array(addrs, np.int64), np.array(aevs, np.int64))


def replay_trace(trace: Trace, life, cap: int | None = None, recorded_addresses: bool = False,
                 record_addresses: bool = False) -> Replay | str:
    """The whole trace replayed as recorded (factor 1), from its first state; or why it cannot be.
    ``recorded_addresses``: new segments get the trace's own addresses while the replay makes the
    segments the trace made, in its order."""
    settings = Settings.of(trace)
    if isinstance(settings, str):
        return settings
    lay = layout_at(trace, life, 0)
    made = np.flatnonzero(trace.action == A["segment_alloc"])
    addresses = list(zip(trace.size[made].tolist(), trace.addr[made].tolist())) if recorded_addresses else None
    return replay(life.alloc_event, life.free_event, life.size, block_streams(trace, life), lay, cap, settings,
                  0, len(trace), empty_cache_at=empty_cache_events(trace), addresses=addresses,
                  record_addresses=record_addresses)
