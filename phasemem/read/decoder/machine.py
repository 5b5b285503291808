"""The events the fast decoder (``phasemem.read.decoder``) has read (``Columns``), and those it parses
one opcode at a time (``VM``, which runs nothing); docs/performance.md says how.
"""
from __future__ import annotations

import array
import struct
from typing import Any, Callable

import numpy as np

from ..torch_labels import Interner, from_codes
from ..trace import _CODES, A, _stack_table
from .layout import Unsupported
from .memo import ListRef, Memo

_INT_FIELDS = ("addr", "size", "stream", "time_us")
_NAMES = ("action", "addr", "size", "stream", "time_us", "stack", "label")
_DTYPES = (np.int8, np.int64, np.int64, np.int64, np.int64, np.int32, np.int32)
#: Events the columns first make room for; they double when full. Each column is one array, not a
#: list of the 16,384-event windows joined at the end: those windows went to the C heap, and 10M
#: events left ~380 MB of it freed but held by the process (the analysis's peak RSS came on top).
#: Room not yet written is never touched (address space, not memory) and is given back at the end.
FIRST_ROOM = 1 << 20
_OOM = A["oom"]
_I64 = 1 << 63


class Columns:
    """The decoded events as columns; stands in for the device's list (``len`` is its length)."""

    def __init__(self, memo: Memo):
        self.memo, self.n = memo, 0
        self.cols = [np.empty(0, dt) for dt in _DTYPES]
        self.sid = np.full(1024, -1, np.int32)  # content id → stack id, by first use
        self.order: list[int] = []  # content ids in stack-id order
        self.oom_device_free: dict[int, int] = {}
        self.interner = Interner()  # user_metadata → its number among the labels (-1: none)
        self.one = self._one()  # events the VM read
        self.read_one = 0  # events the VM has read in all

    def __len__(self) -> int:
        return self.n

    @staticmethod
    def _one() -> list:
        return [array.array("b"), *(array.array("q") for _ in _INT_FIELDS), [], array.array("i")]

    def labels_of(self, texts: list) -> np.ndarray:
        """The label numbers of distinct ``user_metadata`` strings."""
        return self.interner.codes(texts)

    def stacks_of(self, cids: np.ndarray) -> np.ndarray:
        """Stack ids of content ids (-1 stays -1), numbering new stacks by first use."""
        if len(self.memo.contents) > len(self.sid):
            self.sid = np.concatenate([self.sid, np.full(len(self.memo.contents), -1, np.int32)])
        valid = cids >= 0
        fresh = cids[valid][self.sid[cids[valid]] < 0]
        if len(fresh):
            u, first = np.unique(fresh, return_index=True)
            new = u[np.argsort(first)]
            self.sid[new] = np.arange(len(self.order), len(self.order) + len(new), dtype=np.int32)
            self.order += new.tolist()
        return np.where(valid, self.sid[np.maximum(cids, 0)], -1).astype(np.int32)

    def add(self, action, addr, size, stream, time_us, cids, device_free=None, labels=None) -> None:
        """Events read by the vectorised path, in order (after any the VM read before them);
        ``labels``: their ``user_metadata`` numbered by ``labels_of`` (None: none carries one)."""
        self.flush()
        if device_free is not None:
            for i in np.flatnonzero(action == _OOM).tolist():
                self.oom_device_free[self.n + i] = int(device_free[i])
        self._put([action, addr, size, stream, time_us, self.stacks_of(cids),
                   np.full(len(action), -1, np.int32) if labels is None else labels])

    def _put(self, values: list) -> None:
        """Appends equal-length columns of values; a full column is copied once into one twice its size."""
        end = self.n + len(values[0])
        if end > len(self.cols[0]):
            room = max(end, 2 * len(self.cols[0]), FIRST_ROOM)
            for k, dt in enumerate(_DTYPES):
                grown = np.empty(room, dt)
                grown[:self.n] = self.cols[k][:self.n]
                self.cols[k] = grown  # one column at a time: the old one goes before the next grows
        for col, v in zip(self.cols, values):
            col[self.n:end] = v
        self.n = end

    def add_one(self, ev: dict) -> None:
        """One event the VM read, checked and converted as ``phasemem.read.batched._Events`` converts it."""
        act = ev["action"]
        if type(act) is not str:
            raise Unsupported("an action that is not a string")
        meta = ev.get("user_metadata", "")
        if type(meta) is not str:
            raise Unsupported("user_metadata that is not a string")
        vals = [ev[k] for k in _INT_FIELDS]
        if not all(type(v) is int and -_I64 <= v < _I64 for v in vals):
            raise Unsupported("a field that is not an int64")
        fr = ev.get("frames")
        if not fr:
            cid = -1
        elif type(fr) is ListRef:
            cid = fr.cid
        elif type(fr) is list:
            try:
                cid = self.memo.list_cid(fr)
            except (KeyError, TypeError):
                raise Unsupported("frames that are not frame dicts") from None
        else:
            raise Unsupported("frames that are not a list")
        code = _CODES[act]
        if code == _OOM:
            free = ev.get("device_free", 0) or 0
            if type(free) is not int:
                raise Unsupported("device_free")
            self.oom_device_free[self.n + len(self.one[0])] = free
        self.one[0].append(code)
        self.read_one += 1
        for col, v in zip(self.one[1:5], vals):
            col.append(v)
        self.one[5].append(cid)
        self.one[6].append(self.interner[meta])

    def flush(self) -> None:
        one = self.one
        if not len(one[0]):
            return
        cols = [np.frombuffer(c, dtype=np.int8 if i == 0 else np.int64) for i, c in enumerate(one[:5])]
        self._put([*cols, self.stacks_of(np.array(one[5], dtype=np.int32)), np.frombuffer(one[6], dtype=np.int32)])
        self.one = self._one()

    def columns(self) -> dict:
        self.flush()
        out = {}
        for name, col in zip(_NAMES, self.cols):
            col.resize(self.n, refcheck=False)  # the room not used given back (realloc: nothing copied); no views exist
            out[name] = col
        self.cols = [np.empty(0, dt) for dt in _DTYPES]
        stacks, frames = _stack_table({self.memo.contents[c]: s for s, c in enumerate(self.order)})
        labels = from_codes(out.pop("label"), self.interner.texts)
        return dict(out, stacks=stacks, frames=frames, oom_device_free=dict(self.oom_device_free), torch_labels=labels)


class _Short(Exception):
    """The buffer ends inside an event: read more."""


_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
_U16 = struct.Struct("<H").unpack_from
_F64 = struct.Struct(">d").unpack_from
_U64 = struct.Struct("<Q").unpack_from


class VM:
    """Events parsed one opcode at a time from a buffer; the list's batches (MARK … APPENDS, or one
    event and APPEND) tracked so that it can stop at any event boundary.

    ``run`` returns where it stopped and why: "resume" (at a candidate event start, after at least
    one event), "end" (the list is complete: what follows is the rest of the snapshot) or "short"
    (the buffer ends inside an event; the position is the last boundary, nothing after it counted)."""

    def __init__(self, memo: Memo, cols: Columns):
        self.memo, self.cols, self.in_batch = memo, cols, False
        self.on_first: Callable[[dict], None] | None = None
        self.stop = False  # stop at the next boundary whatever follows (the decoder has no template yet)

    def start(self, buf: bytes) -> int:
        """The list's own EMPTY_LIST and MEMOIZE; returns where its items start."""
        if buf[:2] != b"]\x94":
            raise Unsupported("the event list is not EMPTY_LIST MEMOIZE")
        self.memo.list_idx = self.memo.m
        self.memo.put(self.memo.m, None)
        self.memo.m += 1
        return 2

    def run(self, buf: bytes, pos: int, limit: int, starts: list, ci: int) -> tuple[int, int, str]:
        new: list = []
        stack, marks = [None], ([1] if self.in_batch else [])
        boundary, in_batch, done = pos, self.in_batch, 0
        try:
            while True:
                if pos >= limit:
                    raise _Short
                c = buf[pos]
                if marks == [1] and (c == 0x7D or c == 0x65):  # '}' or APPENDS in the list's batch
                    if len(stack) > 1:
                        done += self._emit(stack, new)
                        new = []
                    boundary, in_batch = pos, True
                    if c == 0x65:
                        marks.pop()
                        pos += 1
                        boundary, in_batch = pos, False
                        continue
                    while ci < len(starts) and starts[ci] < pos:
                        ci += 1
                    if done and (self.stop or ci < len(starts) and starts[ci] == pos):
                        self.in_batch = True
                        return pos, ci, "resume"
                elif not marks and len(stack) == 1 and c != 0x7D:
                    if c != 0x28:  # not MARK, not an event: the list is complete
                        self.in_batch = False
                        return pos, ci, "end"
                pos = self._op(buf, pos, limit, c, stack, marks, new)
                if c == 0x61 and len(stack) == 1 and not marks:  # APPEND of one event to the list
                    done += self._emit(stack, new, one=(self._last,))
                    new = []
                    boundary, in_batch = pos, False
        except _Short:
            self.in_batch = in_batch
            return boundary, ci, "short"

    def _emit(self, stack: list, new: list, one=None) -> int:
        memo = self.memo
        memo.grow(memo.m + len(new))
        for k, obj in enumerate(new):
            memo.put(memo.m + k, obj)
        memo.m += len(new)
        events = list(one) if one is not None else stack[1:]
        del stack[1:]
        for ev in events:
            if type(ev) is not dict:
                raise Unsupported("an event that is not a dict")
            if self.on_first is not None:
                self.on_first(ev)
                self.on_first = None
            self.cols.add_one(ev)
        return len(events)

    def _op(self, buf, pos, limit, c, stack, marks, new) -> int:
        """Execute the opcode at ``pos``; returns the next position."""
        memo = self.memo
        if c == 0x68 or c == 0x6A:  # BINGET, LONG_BINGET
            nxt = pos + (2 if c == 0x68 else 5)
            if nxt > limit:
                raise _Short
            idx = buf[pos + 1] if c == 0x68 else _U32(buf, pos + 1)[0]
            base = memo.m
            stack.append(new[idx - base] if idx >= base and idx - base < len(new) else memo.resolve(idx))
            return nxt
        if c == 0x94:  # MEMOIZE
            new.append(stack[-1])
            return pos + 1
        if c == 0x8C or c == 0x58:  # SHORT_BINUNICODE, BINUNICODE
            w = 1 if c == 0x8C else 4
            if pos + 1 + w > limit:
                raise _Short
            n = buf[pos + 1] if w == 1 else _U32(buf, pos + 1)[0]
            nxt = pos + 1 + w + n
            if nxt > limit:
                raise _Short
            stack.append(buf[pos + 1 + w:nxt].decode("utf-8", "surrogatepass"))
            return nxt
        if c in _INTS:
            return self._int(buf, pos, limit, c, stack)
        if c in _CONSTS:
            stack.append(_CONSTS[c]() if callable(_CONSTS[c]) else _CONSTS[c])
            return pos + 1
        return self._container(pos, c, stack, marks)

    def _container(self, pos, c, stack, marks) -> int:
        """MARK and the opcodes that fill a dict, a list or a tuple."""
        if c == 0x28:  # MARK
            marks.append(len(stack))
            return pos + 1
        if c == 0x75 or c == 0x65 or c == 0x74:  # SETITEMS, APPENDS, TUPLE
            if not marks:
                raise Unsupported("no MARK")
            k = marks.pop()
            items = stack[k:]
            del stack[k:]
            if c == 0x74:
                stack.append(tuple(items))
                return pos + 1
            target = stack[-1]
            if c == 0x75 and type(target) is dict and len(items) % 2 == 0:
                for i in range(0, len(items), 2):
                    target[items[i]] = items[i + 1]
            elif c == 0x65 and type(target) is list:
                target.extend(items)
            else:
                raise Unsupported("SETITEMS or APPENDS into something else")
            return pos + 1
        if c == 0x73:  # SETITEM
            v, k = stack.pop(), stack.pop()
            if type(stack[-1]) is not dict:
                raise Unsupported("SETITEM into something else")
            stack[-1][k] = v
            return pos + 1
        if c == 0x61:  # APPEND
            v = stack.pop()
            if len(stack) == 1 and not marks:
                self._last = v  # one event appended to the list itself
            elif type(stack[-1]) is list:
                stack[-1].append(v)
            else:
                raise Unsupported("APPEND into something else")
            return pos + 1
        if 0x85 <= c <= 0x87:  # TUPLE1..3
            n = c - 0x84
            items = stack[-n:]
            del stack[-n:]
            stack.append(tuple(items))
            return pos + 1
        raise Unsupported(f"opcode {c:#x} among the events")

    @staticmethod
    def _int(buf, pos, limit, c, stack) -> int:
        if c == 0x4B:  # BININT1
            nxt, fn = pos + 2, (lambda: buf[pos + 1])
        elif c == 0x4D:  # BININT2
            nxt, fn = pos + 3, (lambda: _U16(buf, pos + 1)[0])
        elif c == 0x4A:  # BININT
            nxt, fn = pos + 5, (lambda: _I32(buf, pos + 1)[0])
        elif c == 0x47:  # BINFLOAT
            nxt, fn = pos + 9, (lambda: _F64(buf, pos + 1)[0])
        else:  # LONG1
            if pos + 2 > limit:
                raise _Short
            nxt = pos + 2 + buf[pos + 1]
            fn = (lambda: int.from_bytes(buf[pos + 2:nxt], "little", signed=True))  # noqa: E731
        if nxt > limit:
            raise _Short
        stack.append(fn())
        return nxt


_INTS = {0x4B, 0x4D, 0x4A, 0x47, 0x8A}
_CONSTS: dict[int, Any] = {0x4E: None, 0x88: True, 0x89: False, 0x7D: dict, 0x5D: list, 0x29: ()}
