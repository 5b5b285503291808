"""From bytes on disk to a ``Trace``: every form a snapshot comes in is read here, and nothing
outside this package knows which one it was.

    source ─┬─ a snapshot dict ─────────────── Trace.from_snapshot
            ├─ .npz (phasemem convert) ─────── columnar: only the steps asked for, by its step index
            └─ a pickle (plain, .gz, .xz, .bz2)
                 ├─ decoder/  torch's form, 8 MiB and more: events decoded from the bytes with numpy
                 ├─ batched   another layout: unpickled a batch of events at a time (less memory)
                 └─ snapshot  pickle.load (only a snapshot's types) + Trace.from_snapshot: small
                              files, and events that bring frame dicts of their own

The Trace is the same whichever path read it (tests/test_decode.py, test_scale.py); only the cost
differs (docs/performance.md, benchmarks/bench_forms.py).
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..errors import NoHistory, PhasememError
from ..live import live_memory
from ..trace import A, Trace, no_gc
from ..vocab import MARKER_PREFIX
from . import columnar
from .batched import read_batched
from . import decoder
from .decoder import decode_trace
from .decoder.layout import Unprofitable
from .snapshot import load_snapshot, read_snapshot_file
from .steps import Reading

#: A trace with fewer memory events than this is a legacy recording's single entry (an action
#: ``snapshot``, or one ``free_completed``: all seven such files in ../shared/wild), not a history.
MIN_HISTORY = 2


def read(source: Any, device: int | None = None, *, trusted: bool = False, steps: str | int | None = None,
         marker_prefix: str | None = None, live: bool = True) -> Reading:
    """Read a snapshot path (pickle, .gz, .xz, .bz2, or the .npz ``phasemem convert`` writes) or
    dict. ``live``: where the source has no allocation history, return what was alive when it was
    taken (``Reading.live``; else raise ``NoHistory``).

    Example:
        >>> got = read("snapshot.pickle")
        >>> got.trace.size[:3], got.prefix
    """
    if isinstance(source, (str, os.PathLike)) and columnar.is_columnar(source):
        got = columnar.reading(os.fspath(source), device, marker_prefix, steps)
    else:
        try:
            t = trace(source, device, trusted=trusted)
        except NoHistory:
            if not live:
                raise
            t = None
        prefix = marker_prefix or (str(t.meta.get("markers") or MARKER_PREFIX) if t is not None else MARKER_PREFIX)
        got = Reading(t, prefix, steps=steps)
    got.device = lambda d: read(source, d, trusted=trusted, marker_prefix=marker_prefix, live=False)
    if live and (got.trace is None or not has_history(got.trace)):
        snap = load_snapshot(source, trusted=trusted, history=False)
        return _live(snap, device, got.prefix)
    return got


def _live(snap: dict, device: int | None, prefix: str) -> Reading:
    """A snapshot without allocation history: what was alive when it was taken (phasemem.live)."""
    live = live_memory(snap, device)
    traces = snap.get("device_traces") or []
    mine = traces[live.device] if live.device < len(traces) else None
    meta = snap.get("phasemem") if isinstance(snap.get("phasemem"), dict) else {}
    return Reading(None, prefix, live=live, live_events=len(mine) if isinstance(mine, list) else 0, meta=meta)


def trace(source: Any, device: int | None = None, *, trusted: bool = False) -> Trace:
    """The Trace of one device (default: the busiest) of a snapshot path or dict, or of an .npz.

    Example:
        >>> trace("snapshot.pickle.xz").action[:5]
    """
    if not isinstance(source, (str, os.PathLike)):
        with no_gc():
            return Trace.from_snapshot(load_snapshot(source, trusted=trusted), device)
    if columnar.is_columnar(source):
        return columnar.reading(os.fspath(source), device, None, None).trace
    return _read_pickle(os.fspath(source), device, trusted)


def _read_pickle(where: str, device: int | None, trusted: bool) -> Trace:
    t = None
    if not _small(where):
        t = _read_pickle_fast(where, device, trusted)
    if t is None:
        with no_gc():
            snap = read_snapshot_file(where, trusted=trusted)
            t = Trace.from_snapshot(snap, device)
            del snap  # freed while the collector is paused: freeing millions of dicts triggers it
    return t


def _small(where: str) -> bool:
    """An uncompressed pickle smaller than the decoder's first read: it would give way (and the
    batched reader saves nothing there), so the file is read once, by pickle.load."""
    try:
        with open(where, "rb") as f:
            return f.read(1) == b"\x80" and os.fstat(f.fileno()).st_size < decoder.HEAD
    except OSError:
        return False  # the readers below say what is wrong


def _read_pickle_fast(where: str, device: int | None, trusted: bool) -> Trace | None:
    try:
        # decoded from the bytes where the file has torch's form and is large enough to pay, else
        # unpickled a batch at a time (what that saves is the events' dicts), or whole where every
        # event brings frame dicts of its own (the unpickler's memo keeps those anyway, and batches
        # cost 1.4 times more there)
        t = decode_trace(where, device, trusted=trusted) or read_batched(where, device, trusted)
    except Unprofitable:
        t = None
    except PhasememError:
        raise
    except Exception:  # noqa: BLE001 - the ordinary reader says what is wrong, or reads it
        t = None
    return t


def has_history(t: Trace) -> bool:
    """Whether a trace holds an allocation history (MIN_HISTORY memory events or more)."""
    memory = np.isin(t.action, [A["alloc"], A["free_requested"], A["free_completed"], A["free"]])
    return int(memory.sum()) >= MIN_HISTORY
