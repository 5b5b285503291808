"""Read a snapshot pickle's trace without holding millions of event dicts at once.

The C unpickler hands the events over in batches that are columnarised at once, so memory stays
near 120 bytes an event; anything unexpected falls back to the ordinary read (docs/performance.md,
"How the readers work")."""
from __future__ import annotations

import array
import io
import pickle
import pickletools
from operator import itemgetter
from typing import Any

import numpy as np

from .. import progress
from ..errors import PhasememError
from .snapshot import UNPICKLE_ERRORS, _SnapshotUnpickler, open_snapshot
from .torch_labels import Interner, from_codes
from .trace import _CODES, A, Trace, _frame_key, _stack_table, from_stand_in, no_gc

_SENTINEL = ("phasemem.read.batched", "_Events")
_SUBSTITUTE = b"c" + "\n".join(_SENTINEL).encode() + b"\n)R"  # GLOBAL module\nname\n, EMPTY_TUPLE, REDUCE
_MEMO_OPS = {"MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT"}
_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"}
#: Opcodes walked before giving up on finding the trace (a few seconds of pickletools).
MAX_WALK = 3_000_000
_OOM = A["oom"]


class _Mark(int):
    """A stack id left in a frames list already read, so a later event sharing the list finds it."""


class _Events:
    """Stands in for one device's list of events: columns, filled a batch at a time."""

    def __init__(self):
        self.n = 0
        self.action = array.array("b")
        self.cols = {key: array.array("q") for key in ("addr", "size", "stream", "time_us")}
        self.stack = array.array("i")
        self.labels = array.array("i")  # user_metadata, numbered by ``interner`` (-1: none)
        self.interner = Interner()
        self.oom_device_free: dict[int, int] = {}
        self.by_ids: dict[tuple, int] = {}
        self.by_content: dict[tuple, int] = {}
        self.marks: list[_Mark] = []

    def __len__(self) -> int:
        return self.n

    def extend(self, batch: list) -> None:
        # Every conversion is the one Trace._columnarise makes; anything it would reject raises here
        # and sends the whole file to the ordinary reader.
        codes = list(map(_CODES.__getitem__, map(itemgetter("action"), batch)))
        try:
            metadata = list(map(itemgetter("user_metadata"), batch))
        except KeyError:
            metadata = [e.get("user_metadata", "") for e in batch]
        self.labels.frombytes(self.interner.codes(metadata).tobytes())
        for key, col in self.cols.items():
            try:
                col.extend(map(itemgetter(key), batch))
            except KeyError:
                del col[self.n:]
                col.extend(e.get(key) or 0 for e in batch)
        try:
            frames = list(map(itemgetter("frames"), batch))
        except KeyError:
            frames = [e.get("frames") for e in batch]
        stack_of = self._stack_of
        self.stack.extend([-1 if not fr else (fr[0] if fr[0].__class__ is _Mark else stack_of(fr)) for fr in frames])
        if _OOM in codes:
            for i, c in enumerate(codes):
                if c == _OOM:
                    self.oom_device_free[self.n + i] = int(batch[i].get("device_free", 0) or 0)
        self.action.extend(codes)
        self.n += len(batch)
        progress.count(self.n)
        # The unpickler's memo keeps every dict it made; emptied, one costs 64 bytes instead of ~400.
        for e in batch:
            e.clear()

    def _stack_of(self, fr: list) -> int:
        # As trace._intern_stacks: frame dicts are shared objects, so their identities name a stack
        # more cheaply than their contents.
        ids = tuple(map(id, fr))
        sid = self.by_ids.get(ids)
        if sid is None:
            sid = self.by_ids[ids] = self.by_content.setdefault(tuple(map(_frame_key, fr)), len(self.by_content))
        while len(self.marks) <= sid:
            self.marks.append(_Mark(len(self.marks)))
        fr[:] = (self.marks[sid],)  # the frame dicts stay (the memo has them); the list is done
        return sid

    def columns(self) -> dict:
        stacks, frames = _stack_table(self.by_content)
        return dict(
            action=np.frombuffer(self.action, dtype=np.int8) if self.n else np.zeros(0, np.int8),
            **{key: np.frombuffer(col, dtype=np.int64) if self.n else np.zeros(0, np.int64)
               for key, col in self.cols.items()},
            stack=np.frombuffer(self.stack, dtype=np.int32) if self.n else np.zeros(0, np.int32),
            stacks=stacks, frames=frames, oom_device_free=dict(self.oom_device_free),
            torch_labels=from_codes(np.frombuffer(self.labels, dtype=np.int32), self.interner.texts) if self.n else None,
        )


class _StreamUnpickler(_SnapshotUnpickler):
    def __init__(self, f, where: str, trusted: bool):
        super().__init__(f)
        self.where, self.trusted = where, trusted
        self.events: _Events | None = None

    def find_class(self, module: str, name: str):
        if (module, name) == _SENTINEL and self.events is None:
            return self._new_events
        if self.trusted:
            return pickle.Unpickler.find_class(self, module, name)
        return super().find_class(module, name)

    def _new_events(self) -> _Events:
        self.events = _Events()
        return self.events


class _Tee:
    """Reads through to ``f`` and keeps every byte read, so the walked head can be replayed."""

    def __init__(self, f):
        self.f, self.seen = f, bytearray()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.seen += data
        return data

    def readline(self) -> bytes:
        data = self.f.readline()
        self.seen += data
        return data

    def tell(self) -> int:
        return len(self.seen)


class _Chain(io.RawIOBase):
    """Bytes in memory, then the rest of a file."""

    def __init__(self, head: bytes, f):
        self.head, self.f = memoryview(head), f

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if len(self.head):
            n = min(len(b), len(self.head))
            b[:n] = self.head[:n]
            self.head = self.head[n:]
            return n
        return self.f.readinto(b)


def _find_events(f) -> tuple[bytearray, int, tuple[int, int] | None] | None:
    """Walk to the first device list with events: (bytes walked, its EMPTY_LIST's position, the
    protocol-4 frame around it as (position, length)); None when the layout is not the expected one."""
    tee = _Tee(f)
    frame: tuple[int, Any] | None = None
    framed: tuple[int, Any] | None = None
    state, where = "key", 0
    for k, (op, arg, pos) in enumerate(pickletools.genops(tee)):  # type: ignore[arg-type]  # file-like enough
        if k > MAX_WALK:
            return None
        assert pos is not None  # _Tee has tell()
        name = op.name
        if name == "FRAME":
            frame = (pos, arg)
            continue
        if state == "key":  # the string "device_traces", then the outer list
            if name in _STRINGS and arg == "device_traces":
                state = "outer"
        elif name in _MEMO_OPS:
            continue
        elif state == "outer":
            # a string "device_traces" elsewhere (a frame's name, say) is not followed by a list
            state = "devices" if name == "EMPTY_LIST" else "key"
        elif state == "devices":  # MARK, then one list per device
            if name == "MARK":
                continue
            if name != "EMPTY_LIST":
                return None
            state, where, framed = "list", pos, frame
        elif state == "list":  # what follows a device's list tells whether it has events
            if name == "EMPTY_LIST":  # the next device's: this one is empty
                where, framed = pos, frame
            elif name in ("APPEND", "APPENDS"):  # the end of device_traces: every list was empty
                return None
            else:
                # the frame the list starts in (a new one may have begun since)
                if framed is not None and not framed[0] < where < framed[0] + 9 + framed[1]:
                    framed = None
                return tee.seen, where, framed
    return None


def read_batched(where: str, device: int | None, trusted: bool) -> Trace | None:
    """The Trace of a pickle whose busiest device's events are columnarised a batch at a time as
    they are unpickled; None where the layout is not the expected one (the caller reads it whole)."""
    with open_snapshot(where) as f:
        found = _find_events(f)
        if found is None:
            return None
        seen, pos, frame = found
        head = seen[:pos] + _SUBSTITUTE + seen[pos + 1:]
        del found
        if frame is not None:  # the frame now holds the substitute's extra bytes
            at, length = frame
            head[at + 1:at + 9] = (length + len(_SUBSTITUTE) - 1).to_bytes(8, "little")
        up = _StreamUnpickler(io.BufferedReader(_Chain(bytes(head), f), 1 << 20), where, trusted)
        del seen, head
        with no_gc():
            try:
                obj = up.load()
            except PhasememError:
                raise
            except (UNPICKLE_ERRORS + (OSError,)):
                return None
            events = up.events
            try:
                return _trace(obj, events, device)
            finally:
                # The emptied dicts go while the collector is still paused (see phasemem.analyze).
                del obj, up


def _trace(obj, events: _Events | None, device: int | None) -> Trace | None:
    if events is None or _marked(obj):
        return None
    return from_stand_in(obj, events, device)


def _marked(obj) -> bool:
    """Whether the snapshot's ``phasemem`` meta (which the Trace copies) holds a frames list this
    reader emptied: it refers to an event's traceback. The segments' blocks share them too (a
    live block's traceback is its alloc's), but nothing reads their frames."""
    meta = obj.get("phasemem") if isinstance(obj, dict) else None
    todo = [meta]
    while todo:
        x = todo.pop()
        if isinstance(x, dict):
            todo += x.values()
        elif isinstance(x, (list, tuple)):
            if x and x[0].__class__ is _Mark:
                return True
            todo += x
    return False
