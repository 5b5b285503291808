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
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import NoHistory, PhasememError
from ..trace import A, Trace, no_gc
from ..vocab import MARKER_PREFIX
from . import columnar
from .batched import read_batched
from .decoder import decode_trace
from .decoder.layout import Unprofitable
from .snapshot import load_snapshot, read_snapshot_file
from .steps import StepIndex

#: A trace with fewer memory events than this is a legacy recording's single entry (an action
#: ``snapshot``, or one ``free_completed``: all seven such files in ../shared/wild), not a history.
MIN_HISTORY = 2


@dataclass
class Reading:
    """What a source holds. ``trace``: its events (None without allocation history: then
    ``snapshot`` holds the segments, what was alive when it was taken). ``prefix``: the marker
    prefix its phases are read with. ``window``: (step index, first, last position) where only
    those steps were read (``whole`` reads the rest); ``steps``: the steps still to cut from a
    trace read whole."""

    trace: Trace | None
    prefix: str = MARKER_PREFIX
    snapshot: dict | None = None
    window: tuple[StepIndex, int, int] | None = None
    whole: Callable[[], Trace] | None = None
    steps: str | int | None = None


def read(source: Any, device: int | None = None, *, trusted: bool = False, steps: str | int | None = None,
         marker_prefix: str | None = None, live: bool = True) -> Reading:
    """Read a snapshot path (pickle, .gz, .xz, .bz2, or the .npz ``phasemem convert`` writes) or
    dict. ``live``: where the source has no allocation history, return its snapshot (else raise).

    Example:
        >>> got = read("snapshot.pickle")
        >>> got.trace.size[:3], got.prefix
    """
    if isinstance(source, (str, os.PathLike)) and columnar.is_columnar(source):
        got = _read_columnar(os.fspath(source), device, marker_prefix, steps)
    else:
        try:
            t = trace(source, device, trusted=trusted)
        except NoHistory:
            if not live:
                raise
            t = None
        prefix = marker_prefix or (str(t.meta.get("markers") or MARKER_PREFIX) if t is not None else MARKER_PREFIX)
        got = Reading(t, prefix, steps=steps)
    if live and (got.trace is None or not has_history(got.trace)):
        return Reading(None, got.prefix, snapshot=load_snapshot(source, trusted=trusted, history=False))
    return got


def trace(source: Any, device: int | None = None, *, trusted: bool = False) -> Trace:
    """The Trace of one device (default: the busiest) of a snapshot path or dict, or of an .npz.

    Example:
        >>> trace("snapshot.pickle.xz").action[:5]
    """
    if not isinstance(source, (str, os.PathLike)):
        with no_gc():
            return Trace.from_snapshot(load_snapshot(source, trusted=trusted), device)
    if columnar.is_columnar(source):
        return _read_columnar(os.fspath(source), device, None, None).trace
    return _read_pickle(os.fspath(source), device, trusted)


def _read_pickle(where: str, device: int | None, trusted: bool) -> Trace:
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
    except Exception:  # noqa: BLE001 - the ordinary reader below says what is wrong, or reads it
        t = None
    if t is None:
        with no_gc():
            snap = read_snapshot_file(where, trusted=trusted)
            t = Trace.from_snapshot(snap, device)
            del snap  # freed while the collector is paused: freeing millions of dicts triggers it
    return t


def _read_columnar(path: str, device: int | None, marker_prefix: str | None, steps) -> Reading:
    doc = columnar.read_doc(path)  # phasemem convert's output: no unpickling
    if device is not None and device != int(doc["device"]):
        raise PhasememError(f"{path} holds device {doc['device']} only; convert the snapshot "
                            f"again with --device {device}")
    index_prefix = (doc.get("steps") or {}).get("prefix")
    # the prefix the file was converted with is the one its step index knows
    prefix = marker_prefix or index_prefix or str((doc.get("meta") or {}).get("markers") or MARKER_PREFIX)
    whole = lambda: columnar.load_trace(path)  # noqa: E731
    if steps is not None and index_prefix == prefix and doc["steps"]["exact"]:
        index = columnar.read_index(path)
        k0, k1 = index.positions(steps)
        a, b = index.bounds(k0, k1)
        if b > a:
            with no_gc():
                part = columnar.load_steps(path, index, k0, k1)
            return Reading(part, prefix, window=(index, k0, k1), whole=whole)
    with no_gc():
        t = whole()
    # the file's index says these steps cannot be sliced: no use building it again
    return Reading(t, prefix, steps=None if index_prefix == prefix else steps)


def has_history(t: Trace) -> bool:
    """Whether a trace holds an allocation history (MIN_HISTORY memory events or more)."""
    memory = np.isin(t.action, [A["alloc"], A["free_requested"], A["free_completed"], A["free"]])
    return int(memory.sum()) >= MIN_HISTORY
