"""Two Traces compared field by field: every reader must give the ordinary reader's Trace."""
from __future__ import annotations

import numpy as np

from phasemem.read.trace import Trace


def resolved(t: Trace) -> list:
    """Each event's stack as frames: stack ids are numbered in whatever order a reader met them."""
    st = [tuple(t.frames[f] for f in s) for s in t.stacks]
    return [st[i] if i >= 0 else None for i in t.stack.tolist()]


def assert_same_trace(a: Trace, b: Trace) -> None:
    for k in ("action", "addr", "size", "stream", "time_us", "live_blocks"):
        x, y = getattr(a, k), getattr(b, k)
        assert x.dtype == y.dtype and np.array_equal(x, y), k
    assert a.stack.dtype == b.stack.dtype
    for k in ("device", "n_devices", "reserved_at_snapshot", "meta", "oom_device_free", "first_event"):
        assert getattr(a, k) == getattr(b, k), k
    assert a.markers.name == b.markers.name
    assert np.array_equal(a.markers.start, b.markers.start) and np.array_equal(a.markers.time_us, b.markers.time_us)
    assert resolved(a) == resolved(b)
    assert sorted(a.frames) == sorted(b.frames) and len(a.stacks) == len(b.stacks)
    assert a.torch_labels == b.torch_labels
