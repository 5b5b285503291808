"""The caching allocator's sizes and the settings a replay follows: torch 2.11's
``c10/cuda/CUDACachingAllocator.cpp`` with its defaults (docs/what-if.md, "What fits").

Example:
    >>> round_size(1000), allocation_size(3 << 20)   # 1024 B; a 20 MiB segment
    >>> Settings.of(trace)                             # or why the replay cannot follow the trace's
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...read.trace import A, Trace

K_MIN_BLOCK = 512  # kMinBlockSize: every size is rounded up to a multiple of it
K_SMALL_SIZE = 1 << 20  # kSmallSize: the largest request the small pool serves
K_SMALL_BUFFER = 2 << 20  # kSmallBuffer: the small pool's segments
K_LARGE_BUFFER = 20 << 20  # kLargeBuffer: the segment of a large request under kMinLargeAlloc
K_MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
K_ROUND_LARGE = 2 << 20  # kRoundLarge: larger requests' segments are rounded up to it
NO_LIMIT = 1 << 62  # max_split_size when not set (torch: SIZE_MAX)


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
