"""The columnar trace saved to disk (.npz): analyse a huge snapshot again without unpickling it.

Unpickling a 10-million-event snapshot takes tens of seconds and gigabytes of dicts; the columnar
form of the same trace is ~50 bytes an event and loads in a second. ``phasemem convert`` writes it;
``phasemem.analyze`` reads it like a snapshot. It holds only numbers and one JSON document, and is
read with ``allow_pickle=False``: loading it runs no code.
"""
from __future__ import annotations

import json
import os
import zipfile

import numpy as np

from .errors import PhasememError
from .output import atomic_write
from .trace import Markers, Trace

FORMAT = "phasemem-trace/1"
_ARRAYS = ("action", "addr", "size", "stream", "time_us", "stack", "live_blocks")


def is_columnar(path: str | os.PathLike) -> bool:
    """An .npz written by ``save_trace`` (a zip, not a pickle)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def save_trace(trace: Trace, path: str | os.PathLike) -> None:
    """Write ``trace`` as an .npz, atomically.

    Example:
        >>> save_trace(Trace.from_snapshot(snapshot), "trace.npz")
    """
    offsets = np.cumsum([0] + [len(s) for s in trace.stacks], dtype=np.int64)
    flat = np.fromiter((f for s in trace.stacks for f in s), dtype=np.int32, count=int(offsets[-1]))
    doc = {
        "format": FORMAT, "device": trace.device, "n_devices": trace.n_devices,
        "reserved_at_snapshot": trace.reserved_at_snapshot, "meta": trace.meta,
        "frames": trace.frames, "marker_names": trace.markers.name,
        "oom_device_free": {str(k): v for k, v in trace.oom_device_free.items()},
    }
    arrays = {name: getattr(trace, name) for name in _ARRAYS}
    arrays.update(stack_offsets=offsets, stack_frames=flat, marker_start=trace.markers.start,
                  marker_time_us=trace.markers.time_us,
                  doc=np.frombuffer(json.dumps(doc, default=str).encode(), dtype=np.uint8))

    def write(tmp):
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)

    atomic_write(path, write)


def load_trace(path: str | os.PathLike) -> Trace:
    """Read an .npz written by ``save_trace``."""
    where = os.fspath(path)
    try:
        with np.load(where, allow_pickle=False) as z:
            doc = json.loads(bytes(z["doc"]).decode())
            if doc.get("format") != FORMAT:
                raise PhasememError(f"{where}: a {doc.get('format')!r} file, not {FORMAT}; convert the snapshot again "
                                    f"with this phasemem (phasemem convert)")
            arrays = {name: z[name] for name in _ARRAYS}
            offsets, flat = z["stack_offsets"], z["stack_frames"].tolist()
            markers = Markers(name=list(doc["marker_names"]), start=z["marker_start"], time_us=z["marker_time_us"])
    except PhasememError:
        raise
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError, json.JSONDecodeError) as e:
        raise PhasememError(f"{where}: not a readable phasemem trace file ({type(e).__name__}); "
                            "convert the snapshot again with phasemem convert") from None
    stacks = [tuple(flat[a:b]) for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
    return Trace(
        device=int(doc["device"]), stacks=stacks, frames=[tuple(f) for f in doc["frames"]], markers=markers,
        oom_device_free={int(k): int(v) for k, v in doc["oom_device_free"].items()},
        reserved_at_snapshot=int(doc["reserved_at_snapshot"]), n_devices=int(doc["n_devices"]),
        meta=dict(doc["meta"]), **arrays,
    )
