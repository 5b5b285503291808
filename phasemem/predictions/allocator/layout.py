"""What the trace tells a replay of the allocator: the segments and blocks in use at an event (from
the snapshot's segments and the trace's segment events), each block's stream, and where the cache was
emptied.

Example:
    >>> lay = layout_at(trace, lifetimes, at=steps[1][0])   # the state the second step started from
    >>> lay.seg_addr, lay.block, lay.unplaced
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...read.trace import A, Trace
from .rules import K_SMALL_BUFFER, K_SMALL_SIZE, round_size


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
