"""From bytes on disk to a ``Trace``: every form a snapshot comes in is read here, and nothing
outside this package knows which one it was; the Trace is the same whichever path read it, only the
cost differs (which path reads what, and why: docs/performance.md, "How the readers work").
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from .. import progress
from ..errors import NoHistory, PhasememError
from ..vocab import MARKER_PREFIX
from . import columnar, decoder
from .batched import read_batched
from .columnar import StepIndex
from .decoder import decode_trace
from .decoder.layout import Unprofitable
from .live import LiveMemory
from .snapshot import has_history, load_live, load_snapshot, read_snapshot_file
from .trace import Trace, no_gc

_ZIP = b"PK\x03\x04"  # the .npz save_trace writes is a zip, never a pickle


@dataclass
class Reading:
    """What a source holds. ``trace``: its events (None without allocation history: then ``live``
    is what was alive when it was taken, and ``live_events`` the entries of its device). ``prefix``:
    the marker prefix its phases are read with; ``meta``: phasemem's metadata of a snapshot without
    history. ``steps``: the steps still to cut (``phasemem.analysis.step_index.cut``), by ``index`` where the
    source has its own (an .npz's: ``trace`` is then mapped, and ``whole`` reads it), else by one
    built from the trace. ``window``: (step index, first, last position) where ``trace`` holds those
    steps alone (``whole`` gives all).
    ``device(d)``: another device of the same source, read the same way."""

    trace: Trace | None
    prefix: str = MARKER_PREFIX
    live: LiveMemory | None = None
    live_events: int = 0
    window: tuple[StepIndex, int, int] | None = None
    whole: Callable[[], Trace] | None = None
    steps: str | int | None = None
    index: StepIndex | None = None
    device: Callable[[int], "Reading"] | None = None
    #: the snapshot's ``phasemem`` metadata, where the trace does not carry it (no history)
    meta: dict | None = None


def read(source: Any, device: int | None = None, *, trusted: bool = False, steps: str | int | None = None,
         marker_prefix: str | None = None, live: bool = True) -> Reading:
    """Read a snapshot path (pickle, .gz, .xz, .bz2, or the .npz ``phasemem convert`` writes) or
    dict. ``live``: where the source has no allocation history, return what was alive when it was
    taken (``Reading.live``; else raise ``NoHistory``).

    Example:
        >>> got = read("snapshot.pickle")
        >>> got.trace.size[:3], got.prefix
    """
    other = lambda d: read(source, d, trusted=trusted, marker_prefix=marker_prefix, live=False)  # noqa: E731
    if is_columnar(source):
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
    if live and (got.trace is None or not has_history(got.trace)):  # what was alive when it was taken
        mem, n_events, meta = load_live(source, device, trusted=trusted)
        return Reading(None, got.prefix, live=mem, live_events=n_events, meta=meta)
    got.device = other
    assert got.trace is not None  # without history: NoHistory was raised, or the live reading returned
    progress.stage(f"analysing {len(got.trace):,} events")  # what follows a read
    return got


def is_columnar(source: Any) -> bool:
    """A path to the .npz ``columnar.save_trace`` writes (a zip, not a pickle)."""
    if not isinstance(source, (str, os.PathLike)):
        return False
    try:
        with open(source, "rb") as f:
            return f.read(4) == _ZIP
    except OSError:
        return False


def _read_columnar(path: str, device: int | None, marker_prefix: str | None, steps) -> Reading:
    """An .npz: with ``steps`` and the file's exact step index for the prefix, its events mapped, not
    read (``cut`` copies out only the steps' by that index); else read whole."""
    doc = columnar.read_doc(path)  # phasemem convert's output: no unpickling
    if device is not None and device != int(doc["device"]):
        raise PhasememError(f"{path} holds device {doc['device']} only; convert the snapshot "
                            f"again with --device {device}")
    index_prefix = (doc.get("steps") or {}).get("prefix")
    # the prefix the file was converted with is the one its step index knows
    prefix = marker_prefix or index_prefix or str((doc.get("meta") or {}).get("markers") or MARKER_PREFIX)
    if steps is not None and index_prefix == prefix and doc["steps"]["exact"]:
        with no_gc():
            mapped = columnar.map_trace(path)
        return Reading(mapped, prefix, steps=steps, index=columnar.read_index(path),
                       whole=lambda: columnar.load_trace(path))
    with no_gc():
        t = columnar.load_trace(path)
    # the file's index says these steps cannot be sliced: no use building it again
    return Reading(t, prefix, steps=None if index_prefix == prefix else steps)


def trace(source: Any, device: int | None = None, *, trusted: bool = False) -> Trace:
    """The Trace of one device (default: the busiest) of a snapshot path or dict, or of an .npz.

    Example:
        >>> trace("snapshot.pickle.xz").action[:5]
    """
    if not isinstance(source, (str, os.PathLike)):
        with no_gc():
            return Trace.from_snapshot(load_snapshot(source, trusted=trusted), device)
    progress.stage(f"reading {os.path.basename(os.fspath(source))}")
    if is_columnar(source):
        got = _read_columnar(os.fspath(source), device, None, None)
        assert got.trace is not None  # an .npz always holds its events
        return got.trace
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
