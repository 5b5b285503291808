"""A trace's allocations and frees (each block at the size a what-if gives it) driven through the
caching allocator from the state at an event: the segments it makes and gives back, and whether it
runs out of memory under a cap.

Example:
    >>> r = replay_trace(trace, lifetimes)                  # the trace's own segments, replayed
    >>> r.segment_event, r.segment_size                      # where each was made (+) or freed (-)
    >>> replay_trace(trace, lifetimes, cap=8 << 30).oom_event  # None: it fits under 8 GiB
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...read.trace import A, Trace
from .layout import Layout, block_streams, empty_cache_events, layout_at
from .pools import CachingAllocator
from .rules import Settings, round_size

# op codes of a replay's event list
FREE, ALLOC, EMPTY_CACHE = 0, 1, 2


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
    ``size`` requested bytes on ``stream`` through the allocator, from ``layout`` (default at
    ``layout.at``) to event ``stop``, under ``cap`` (which blocks stay where they are, and the order at
    one event: docs/what-if.md).

        >>> lay = layout_at(trace, life, first)
        >>> replay(life.alloc_event, life.free_event, life.size, block_streams(trace, life), lay, 8 << 30).oom_event
    """
    start = layout.at if start is None else start
    n = int(max(int(free.max(initial=0)), int(alloc.max(initial=0)) + 1)) if stop is None else stop
    stop = n if stop is None else stop
    a = CachingAllocator(cap, settings, addresses=addresses)
    kept = np.ones(len(size), bool) if kept is None else kept
    placed = _lay_out(a, layout, kept, size)
    reserved_start = a.reserved
    alive = np.flatnonzero((alloc < start) & (free >= start) & ~placed & (size > 0))
    alive = alive[np.lexsort((alive, alloc[alive]))]
    rounded = round_size(size)
    for bid in alive.tolist():  # blocks to lay out afresh: made before the replay, in their order
        if not a.malloc_rounded(bid, int(rounded[bid]), int(stream[bid])):
            return Replay(start, start, start, a.oom_size, np.full(len(a.log), start, np.int64),
                          np.array(a.log, np.int64), np.array(a.log_addr, np.int64), reserved_start,
                          max(a.reserved, reserved_start), a.allocated)
    op, who, ev_of = _event_list(alloc, free, size, start, stop, empty_cache_at)
    return _drive(a, op, who, ev_of, rounded, stream, start, stop, reserved_start, record_addresses)


def _lay_out(a: CachingAllocator, layout: Layout, kept: np.ndarray, size: np.ndarray) -> np.ndarray:
    """The layout's segments given to the allocator, with the blocks in them that stay where they are
    (``kept``, not empty); which blocks those are."""
    placed = np.zeros(len(size), bool)
    if not layout.known:
        return placed
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
    return placed


def _event_list(alloc: np.ndarray, free: np.ndarray, size: np.ndarray, start: int, stop: int,
                empty_cache_at: np.ndarray | None) -> tuple[list, list, list]:
    """(op codes, block ids, events) in the order the allocator sees them: at one event, empty_cache
    before all (key 4e), then frees (4e+1), allocations (4e+2), frees of blocks made at the same event
    (4e+3)."""
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
    return op.tolist(), who.tolist(), (key // 4).tolist()


def _drive(a: CachingAllocator, op: list, who: list, ev_of: list, rounded: np.ndarray, stream: np.ndarray,
           start: int, stop: int, reserved_start: int, record_addresses: bool) -> Replay:
    """The event list through the allocator, up to the first request it cannot serve."""
    sizes, streams = rounded.tolist(), stream.tolist()
    seg_ev = [start] * len(a.log)
    logged = len(a.log)
    peak_res, peak_alloc = a.reserved, a.allocated
    oom = None
    addrs, aevs = [], []
    malloc, free_, log = a.malloc_rounded, a.free, a.log
    for o, bid, e in zip(op, who, ev_of):
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
