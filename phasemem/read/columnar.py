"""The columnar trace saved to disk (.npz), and the step index that cuts some steps out of a trace.

Loads in a second where unpickling takes many, runs no code (``allow_pickle=False``), and lets
``--steps`` read only the steps asked for; why a slice's numbers equal the whole's: docs/performance.md,
"How the readers work"."""
from __future__ import annotations

import json
import mmap
import os
import struct
import zipfile
from dataclasses import dataclass

import numpy as np

from ..errors import PhasememError
from ..output import atomic_write
from .torch_labels import TorchLabels
from .trace import Markers, Trace

FORMAT = "phasemem-trace/1"
#: the per-event columns: what a slice of steps takes a range of (``step_index.cut``)
EVENTS = ("action", "addr", "size", "stream", "time_us", "stack")
_ARRAYS = EVENTS + ("live_blocks",)
_INDEX = ("first", "stop", "number", "complete", "t_end", "reserved_end", "cross")


@dataclass
class StepIndex:
    """Where each step of a trace lies, for one marker prefix, and what slicing needs besides events
    (``phasemem.analysis.step_index`` builds one and cuts steps by it; here it is stored and read back)."""

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
    if trace.segments is not None and trace.segment_blocks is not None:  # the allocator replay's first state
        arrays.update(segments=trace.segments, segment_blocks=trace.segment_blocks)
    doc["allocator_settings"] = trace.allocator_settings
    arrays.update(stack_offsets=offsets, stack_frames=flat, marker_start=trace.markers.start,
                  marker_time_us=trace.markers.time_us)
    if (labels := trace.torch_labels) is not None:  # the program's labels (user_metadata): few entries
        doc["label_texts"] = list(labels.texts)
        arrays.update(label_event=labels.event, label_text=labels.text)
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


def map_trace(path: str | os.PathLike) -> Trace:
    """The trace in the file with its event columns mapped from it, read-only, not read: the pages of
    the events a slice copies out (``step_index.cut``) are all of them that is ever read."""
    where = os.fspath(path)
    with _reading(where):
        with np.load(where, allow_pickle=False) as z:
            doc = _doc(z, where)
            with open(where, "rb") as f:
                whole = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                columns = {name: _mapped(f, whole, name) for name in EVENTS}
            return _trace(z, doc, {"live_blocks": z["live_blocks"], **columns})


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
    labels = TorchLabels(np.asarray(z["label_event"], np.int64), np.asarray(z["label_text"], np.int32),
                         tuple(map(str, doc["label_texts"]))) if "label_texts" in doc else None
    return Trace(
        device=int(doc["device"]), stacks=stacks, frames=[tuple(f) for f in doc["frames"]], markers=markers,
        oom_device_free={int(k): int(v) for k, v in doc["oom_device_free"].items()},
        reserved_at_snapshot=int(doc["reserved_at_snapshot"]), n_devices=int(doc["n_devices"]),
        meta=dict(doc["meta"]), first_event=int(doc.get("first_event", 0)),
        live_workspaces=np.array(doc.get("live_workspaces", []), dtype=np.int64), torch_labels=labels,
        segments=z["segments"] if "segments" in z.files else None,
        segment_blocks=z["segment_blocks"] if "segment_blocks" in z.files else None,
        allocator_settings=dict(doc.get("allocator_settings") or {}), **arrays,
    )


def _member(f, name: str) -> tuple[int, np.dtype, int]:
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
        return _member(f, name)[2]


def _mapped(f, whole: mmap.mmap, name: str) -> np.ndarray:
    start, dtype, n = _member(f, name)
    return np.frombuffer(whole, dtype=dtype, count=n, offset=start)
