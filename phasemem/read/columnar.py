"""The columnar trace saved to disk (.npz), and the step index that cuts some steps out of a trace.

Unpickling a 10-million-event snapshot takes seconds and a gigabyte or more; the columnar form of
the same trace is ~40 bytes an event and loads in a second. ``phasemem convert`` writes it;
``phasemem.analyze`` reads it like a snapshot. It holds only numbers and one JSON document, and is
read with ``allow_pickle=False``: loading it runs no code. The members are stored uncompressed, so
a range of one column is read straight from its offset in the file.

``phasemem analyze big.npz --steps 100-102`` should not read 10 million events to report three
steps. A step index (``StepIndex``), built once from the whole trace (``phasemem.step_index``;
``phasemem convert`` stores it in the file for the marker prefix it was converted with), says where
each step's events are. Only those events are read (``load_steps``; ``slice_in_memory`` cuts them
from a trace read whole); allocations alive when the first of them starts become allocations from
before the trace, as a trace already treats memory from before recording (frees without an alloc,
blocks in ``segments``): an allocation made earlier and freed inside the steps is a free without an
alloc, one alive through them is a block alive throughout. Markers are kept up to the end of the
last step: steps before the first read one then count as steps the trace lost, which numbers the
steps as the full trace does.

So every event's memory, phase and step, and every step's and phase's numbers, equal the full
analysis's (``tests/test_scale.py``), with event indices counted from ``Trace.first_event``.
Slicing is refused (``StepIndex.exact`` is False, and the whole trace is analysed) when phases are
inferred rather than marked — inference reads the whole trace — or when the trace has frees whose
size differs from their alloc's, or allocs that reuse a live address (a lost free): there a free
seen without its alloc would count a different size than the full trace does.
"""
from __future__ import annotations

import json
import os
import struct
import zipfile
from dataclasses import dataclass

import numpy as np

from ..errors import PhasememError
from ..output import atomic_write
from ..steps import StepsError, parse_steps
from ..trace import Markers, Trace

FORMAT = "phasemem-trace/1"
_ARRAYS = ("action", "addr", "size", "stream", "time_us", "stack", "live_blocks")
_EVENTS = ("action", "addr", "size", "stream", "time_us", "stack")
_INDEX = ("first", "stop", "number", "complete", "t_end", "reserved_end", "cross")


@dataclass
class StepIndex:
    """Where each step of a trace lies, for one marker prefix, and what slicing needs besides events."""

    prefix: str
    exact: bool  # slices give the full analysis's numbers
    reason: str  # why not, when not
    n_events: int
    first: np.ndarray  # int64 per step: first event
    stop: np.ndarray  # int64 per step: one past its last event
    number: np.ndarray  # int64 per step: Step.number
    complete: np.ndarray  # bool per step
    t_end: np.ndarray  # int64 per step: µs its optimizer ended (BIG when it did not)
    reserved_end: np.ndarray  # int64 per step: bytes reserved after its last event
    # (k, 4) int64: alloc event (-1: from before the trace), free event (n_events: never), address
    # and size of every allocation alive across some step's start: the only ones a slice can begin
    # inside of.
    cross: np.ndarray

    def __len__(self) -> int:
        return len(self.first)

    def positions(self, spec: str) -> tuple[int, int]:
        """The first and last position of the steps ``spec`` names ("3", "2-4", "2-", "-4"), by
        ``Step.number``; raises the StepsError the picture would for steps the trace lacks."""

        lo, hi = parse_steps(spec)
        num = self.number
        want = np.ones(len(num), dtype=bool)
        if lo is not None:
            want &= num >= lo
        if hi is not None:
            want &= num <= hi
        hit = np.flatnonzero(want)
        if not len(hit):
            asked = str(spec).strip()
            raise StepsError(f"steps={asked}: this report has steps {num[0]}..{num[-1]}" if len(num)
                             else f"steps={asked}: this report has no steps")
        return int(hit[0]), int(hit[-1])

    def bounds(self, k0: int, k1: int) -> tuple[int, int]:
        """Events [a, b) of the steps at positions k0..k1."""
        return int(self.first[k0]), int(self.stop[k1])


def slice_trace(skeleton: Trace, index: StepIndex, k0: int, k1: int, columns: dict) -> Trace:
    """The trace of steps k0..k1 (positions in ``index``).

    ``skeleton`` gives what is not per event (stacks, frames, markers, meta; its event columns are
    not read), ``columns`` the six event columns of events [a, b) only.
    """
    a, b = index.bounds(k0, k1)
    cross = index.cross
    alive = cross[(cross[:, 0] < a) & (cross[:, 1] >= b)]
    m = skeleton.markers
    keep = int(np.searchsorted(m.time_us, index.t_end[k1], "right"))
    return Trace(
        device=skeleton.device,
        stacks=skeleton.stacks,
        frames=skeleton.frames,
        markers=Markers(name=m.name[:keep], start=m.start[:keep], time_us=m.time_us[:keep]),
        live_blocks=np.ascontiguousarray(alive[:, 2:4]),
        live_workspaces=skeleton.live_workspaces,
        oom_device_free={e - a: v for e, v in skeleton.oom_device_free.items() if a <= e < b},
        reserved_at_snapshot=int(index.reserved_end[k1]),
        n_devices=skeleton.n_devices,
        meta=dict(skeleton.meta),
        first_event=skeleton.first_event + a,
        **columns,
    )


def slice_in_memory(trace: Trace, index: StepIndex, k0: int, k1: int) -> Trace:
    a, b = index.bounds(k0, k1)
    cols = {name: getattr(trace, name)[a:b] for name in ("action", "addr", "size", "stream", "time_us", "stack")}
    return slice_trace(trace, index, k0, k1, cols)


def save_trace(trace: Trace, path: str | os.PathLike, index: StepIndex | None = None) -> None:
    """Write ``trace`` (and its step index, if given) as an .npz, atomically.

    Example:
        >>> save_trace(trace, "trace.npz", build_index(trace, "phasemem::"))
    """
    offsets = np.cumsum([0] + [len(s) for s in trace.stacks], dtype=np.int64)
    flat = np.fromiter((f for s in trace.stacks for f in s), dtype=np.int32, count=int(offsets[-1]))
    doc = {
        "format": FORMAT, "device": trace.device, "n_devices": trace.n_devices,
        "reserved_at_snapshot": trace.reserved_at_snapshot, "meta": trace.meta,
        "frames": trace.frames, "marker_names": trace.markers.name,
        "oom_device_free": {str(k): v for k, v in trace.oom_device_free.items()},
        "first_event": trace.first_event, "live_workspaces": trace.live_workspaces.tolist(),
    }
    arrays = {name: getattr(trace, name) for name in _ARRAYS}
    arrays.update(stack_offsets=offsets, stack_frames=flat, marker_start=trace.markers.start,
                  marker_time_us=trace.markers.time_us)
    if index is not None:
        doc["steps"] = {"prefix": index.prefix, "exact": index.exact, "reason": index.reason}
        arrays.update({f"steps_{name}": getattr(index, name) for name in _INDEX})
    arrays["doc"] = np.frombuffer(json.dumps(doc, default=str).encode(), dtype=np.uint8)

    def write(tmp):
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)

    atomic_write(path, write)


def load_trace(path: str | os.PathLike) -> Trace:
    """Read an .npz written by ``save_trace``."""
    where = os.fspath(path)
    with _reading(where):
        with np.load(where, allow_pickle=False) as z:
            doc = _doc(z, where)
            arrays = {name: z[name] for name in _ARRAYS}
            return _trace(z, doc, arrays)


def read_doc(path: str | os.PathLike) -> dict:
    """The file's JSON document (device, meta, the step index's prefix), without its columns."""
    where = os.fspath(path)
    with _reading(where):
        with np.load(where, allow_pickle=False) as z:
            return _doc(z, where)


def read_index(path: str | os.PathLike) -> StepIndex | None:
    """The step index stored with the trace, or None (a file converted before there was one)."""
    where = os.fspath(path)
    with _reading(where):
        with np.load(where, allow_pickle=False) as z:
            doc = _doc(z, where)
            if "steps" not in doc:
                return None
            s = doc["steps"]
            return StepIndex(prefix=str(s["prefix"]), exact=bool(s["exact"]), reason=str(s["reason"]),
                             n_events=_length(where, "action"),
                             **{name: z[f"steps_{name}"] for name in _INDEX})


def load_steps(path: str | os.PathLike, index: StepIndex, k0: int, k1: int) -> Trace:
    """The trace of steps k0..k1 (positions in ``index``), reading only their events."""
    where = os.fspath(path)
    a, b = index.bounds(k0, k1)
    with _reading(where):
        with np.load(where, allow_pickle=False) as z:
            doc = _doc(z, where)
            skeleton = _trace(z, doc, {name: np.zeros(0, np.int64) for name in _ARRAYS})
        with open(where, "rb") as f:
            columns = {name: _read_range(f, where, name, a, b) for name in _EVENTS}
    return slice_trace(skeleton, index, k0, k1, columns)


class _reading:
    """Turns what a damaged or foreign file raises into one PhasememError."""

    def __init__(self, where: str):
        self.where = where

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if kind is None or issubclass(kind, PhasememError):
            return False
        if issubclass(kind, (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError, json.JSONDecodeError,
                             TypeError, struct.error)):
            raise PhasememError(f"{self.where}: not a readable phasemem trace file ({kind.__name__}); "
                                "convert the snapshot again with phasemem convert") from None
        return False


def _doc(z, where: str) -> dict:
    doc = json.loads(bytes(z["doc"]).decode())
    if doc.get("format") != FORMAT:
        raise PhasememError(f"{where}: a {doc.get('format')!r} file, not {FORMAT}; convert the snapshot again "
                            f"with this phasemem (phasemem convert)")
    return doc


def _trace(z, doc: dict, arrays: dict) -> Trace:
    offsets, flat = z["stack_offsets"], z["stack_frames"].tolist()
    markers = Markers(name=list(doc["marker_names"]), start=z["marker_start"], time_us=z["marker_time_us"])
    stacks = [tuple(flat[a:b]) for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
    return Trace(
        device=int(doc["device"]), stacks=stacks, frames=[tuple(f) for f in doc["frames"]], markers=markers,
        oom_device_free={int(k): int(v) for k, v in doc["oom_device_free"].items()},
        reserved_at_snapshot=int(doc["reserved_at_snapshot"]), n_devices=int(doc["n_devices"]),
        meta=dict(doc["meta"]), first_event=int(doc.get("first_event", 0)),
        live_workspaces=np.array(doc.get("live_workspaces", []), dtype=np.int64), **arrays,
    )


def _member(f, where: str, name: str) -> tuple[int, np.dtype, int]:
    """Where column ``name``'s data starts in the file, its dtype and its length."""
    with zipfile.ZipFile(f) as zf:
        info = zf.getinfo(name + ".npy")
    if info.compress_type != zipfile.ZIP_STORED:
        raise ValueError(f"{name} is compressed")
    # The local header repeats the name and has an extra field of its own length (zip64 sizes).
    f.seek(info.header_offset)
    local = f.read(30)
    if local[:4] != b"PK\x03\x04":
        raise ValueError("bad local header")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    f.seek(info.header_offset + 30 + name_len + extra_len)
    version = np.lib.format.read_magic(f)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read_header(f)
    if fortran or len(shape) != 1:
        raise ValueError(f"{name} is not one column")
    return f.tell(), dtype, int(shape[0])


def _length(where: str, name: str) -> int:
    with open(where, "rb") as f:
        return _member(f, where, name)[2]


def _read_range(f, where: str, name: str, a: int, b: int) -> np.ndarray:
    start, dtype, n = _member(f, where, name)
    if not 0 <= a <= b <= n:
        raise ValueError(f"events {a}..{b} are outside {name}'s {n}")
    out = np.empty(b - a, dtype=dtype)
    f.seek(start + a * dtype.itemsize)
    if f.readinto(memoryview(out).cast("B")) != out.nbytes:
        raise EOFError(f"{name} is cut short")
    return out
