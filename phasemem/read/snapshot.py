"""Read a memory snapshot from a path or a dict, without trusting the file; what it holds: an
allocation history (``has_history``), or only what was alive when it was taken (``load_live``).

A snapshot is the dict ``torch.cuda.memory._snapshot()`` returns; ``_dump_snapshot`` pickles it.
Unpickling runs code named in the file, so by default only the types a snapshot contains are
accepted (``trusted=True`` lifts that for files you made yourself).
"""
from __future__ import annotations

import bz2
import collections
import gzip
import io
import lzma
import os
import pickle
import zlib
from typing import Any, Callable

import numpy as np

from ..errors import RECORD_HINT, NoHistory, PhasememError
from .live import LiveMemory, live_memory
from .trace import A, Trace, no_gc

#: A trace with fewer memory events than this is a legacy recording's single entry (an action
#: ``snapshot``, or one ``free_completed``: all seven such files in ../shared/wild), not a history.
MIN_HISTORY = 2
#: ... counted this many events at a time, stopping once there are enough: a history shows in the
#: first chunk, and the columns of an .npz mapped for ``--steps`` (10M events: ~100 MiB of
#: temporaries counted at once) are not read whole to see it.
HISTORY_CHUNK = 1 << 16


class _Version(str):
    """Stands in for ``torch.torch_version.TorchVersion`` (a str subclass) so loading needs no torch."""


_SAFE_GLOBALS = {
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "dict"): dict,
    ("builtins", "list"): list,
    ("builtins", "tuple"): tuple,
    ("builtins", "str"): str,
    ("builtins", "int"): int,
    ("builtins", "float"): float,
    ("builtins", "bytes"): bytes,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch.torch_version", "TorchVersion"): _Version,
}


class _SnapshotUnpickler(pickle.Unpickler):
    where: str  # the file's name for errors, set before load()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _SAFE_GLOBALS[(module, name)]
        except KeyError:
            raise PhasememError(
                f"{self.where}: the pickle names {module}.{name}, which a memory snapshot never contains; "
                "if you made this file yourself and trust it, load it with trusted=True (CLI: --trust)"
            ) from None


_MAGIC: dict[bytes, Callable[[Any], io.BufferedIOBase]] = {b"\x1f\x8b": lambda f: gzip.GzipFile(fileobj=f), b"\xfd7zXZ\x00": lzma.LZMAFile, b"BZh": bz2.BZ2File}


class _Decompressed(io.RawIOBase):
    """A decompressing reader whose failures say so: the unpickler that reads it would otherwise
    report a cut .xz as a corrupt pickle."""

    def __init__(self, inner, file, where: str):
        self.inner, self.file, self.where = inner, file, where

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        try:
            return self.inner.readinto(b)
        except (OSError, EOFError, lzma.LZMAError, zlib.error, ValueError) as e:
            raise PhasememError(f"{self.where}: the compressed stream is truncated or corrupt ({e}); "
                                "copy the file again") from None

    def close(self) -> None:
        try:
            self.inner.close()
            self.file.close()  # the decompressors leave a file object they were given open
        finally:
            super().close()


def open_snapshot(path: str | os.PathLike) -> io.BufferedReader:
    """Open a snapshot file for reading, decompressed, after checking that it holds a pickle.

    The file is streamed rather than read whole: holding a 10-million-event pickle's bytes next to
    what it unpickles to would add its whole size (0.8 GB) to the peak.
    """
    where = os.fspath(path)
    try:
        f = open(where, "rb")
    except FileNotFoundError:
        raise PhasememError(f"{where}: no such file; {RECORD_HINT}") from None
    except IsADirectoryError:
        raise PhasememError(f"{where}: is a directory, not a snapshot file") from None
    except OSError as e:
        raise PhasememError(f"{where}: cannot be read ({e.strerror})") from None
    try:
        head = _peek(f, 6, where)
        if not head:
            raise PhasememError(f"{where}: the file is empty; {RECORD_HINT}")
        # Sniff the content rather than trust the extension: users rename files.
        for magic, kind in _MAGIC.items():
            if head.startswith(magic):
                f = io.BufferedReader(_Decompressed(kind(f), f, where), 1 << 20)
                head = _peek(f, 1, where)
                break
        if head[:1] != b"\x80" and head[:1] not in (b"(", b"}", b"]"):
            raise PhasememError(f"{where}: not a pickle (a snapshot is the file torch.cuda.memory._dump_snapshot "
                                f"writes); {RECORD_HINT}")
    except BaseException:
        f.close()
        raise
    return f


def _peek(f, n: int, where: str) -> bytes:
    try:
        return f.peek(n)[:n]
    except OSError as e:
        raise PhasememError(f"{where}: cannot be read ({e.strerror or e})") from None


#: What unpickling a truncated or garbled file raises, besides UnpicklingError.
UNPICKLE_ERRORS = (EOFError, pickle.UnpicklingError, ValueError, TypeError, KeyError, IndexError, AttributeError,
                   ModuleNotFoundError, MemoryError, OverflowError)


def read_snapshot_file(path: str | os.PathLike, *, trusted: bool = False, history: bool = True) -> dict:
    """Load a pickled snapshot (plain, ``.gz``, ``.xz`` or ``.bz2``) and return the snapshot dict."""
    where = os.fspath(path)
    with open_snapshot(where) as f:
        try:
            with no_gc():
                if trusted:
                    obj = pickle.load(f)
                else:
                    up = _SnapshotUnpickler(f)
                    up.where = where
                    obj = up.load()
        except PhasememError:
            raise
        except UNPICKLE_ERRORS as e:
            raise PhasememError(f"{where}: the pickle is truncated or corrupt ({type(e).__name__}); "
                                "copy the file again or re-record it") from None
        except OSError as e:
            raise PhasememError(f"{where}: cannot be read ({e.strerror or e})") from None
    return as_snapshot(obj, where, history=history)


def as_snapshot(obj: Any, where: str = "input", *, history: bool = True) -> dict:
    """Check that ``obj`` is a snapshot dict (or a dict wrapping one under ``"snapshot"``) and return it.
    A bare list of segments (``torch.cuda.memory_snapshot()``) becomes ``{"segments": [...]}``.
    ``history``: require an allocator trace (else ``NoHistory``, when there are segments to read)."""
    if isinstance(obj, dict) and "device_traces" not in obj and isinstance(obj.get("snapshot"), dict):
        obj = obj["snapshot"]
    if isinstance(obj, list) and obj and all(isinstance(s, dict) and "blocks" in s for s in obj):
        obj = {"segments": obj, "device_traces": []}
    if not isinstance(obj, dict) or not ("device_traces" in obj or "segments" in obj):
        raise PhasememError(f"{where}: holds a {type(obj).__name__}, not a memory snapshot; {RECORD_HINT}")
    traces = obj.get("device_traces")
    if history and (not isinstance(traces, list) or not any(isinstance(t, list) and t for t in traces)):
        if obj.get("segments"):
            raise NoHistory(f"{where}: the snapshot holds no allocation history, only its segments; {RECORD_HINT}")
        raise PhasememError(f"{where}: the snapshot is empty: no allocator trace and no segments (nothing was "
                            f"allocated, or history recording was off); {RECORD_HINT}")
    return obj


def load_snapshot(source: Any, *, trusted: bool = False, history: bool = True) -> dict:
    """A path (str or PathLike) or an in-memory snapshot dict → the snapshot dict (``history``: see
    ``as_snapshot``)."""
    if isinstance(source, (str, os.PathLike)):
        return read_snapshot_file(source, trusted=trusted, history=history)
    return as_snapshot(source, history=history)


_MEMORY = [A["alloc"], A["free_requested"], A["free_completed"], A["free"]]


def has_history(t: Trace) -> bool:
    """Whether a trace holds an allocation history (MIN_HISTORY memory events or more)."""
    seen = 0
    for a in range(0, len(t.action), HISTORY_CHUNK):
        seen += int(np.isin(t.action[a:a + HISTORY_CHUNK], _MEMORY).sum())
        if seen >= MIN_HISTORY:
            return True
    return False


def load_live(source: Any, device: int | None, *, trusted: bool = False) -> tuple[LiveMemory, int, dict]:
    """A snapshot without allocation history: what was alive when it was taken (``phasemem.read.live``),
    how many entries its device's trace holds, and phasemem's metadata ({} if none).

    Example:
        >>> live, n_events, meta = load_live("segments_only.pickle", None)
    """
    snap = load_snapshot(source, trusted=trusted, history=False)
    try:
        live = live_memory(snap, device)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as e:
        where = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "input"
        raise PhasememError(f"{where}: the snapshot's segments are malformed ({type(e).__name__}); is this a torch "
                            "memory snapshot? copy it again or re-record it") from None
    traces = snap.get("device_traces") or []
    mine = traces[live.device] if live.device < len(traces) else None
    meta = snap.get("phasemem")
    meta = meta if isinstance(meta, dict) else {}
    return live, len(mine) if isinstance(mine, list) else 0, meta
