"""A snapshot pickle's events decoded straight from its bytes with numpy: faster than unpickling.

Events of torch's fixed layout are read many at a time, the rest one opcode at a time; anything
unknown gives up to the slower readers, which give the same Trace (docs/performance.md, "How the
readers work")."""
from __future__ import annotations

import bisect
import ctypes
import io
import os
import pickle
import sys

import numpy as np

from ... import progress
from ..snapshot import _SnapshotUnpickler, open_snapshot
from ..trace import Trace, from_stand_in, no_gc
from .layout import Deframed, Unprofitable, find_event_list
from .machine import VM, Columns, Unsupported
from .memo import Memo
from .scan import PAD, Template, candidates, commit, scan, views

#: Bytes decoded at a time: the events' working arrays are ~40 bytes per byte of this.
CHUNK = 16 << 20
#: Memo entries filled at a time for the unpickler that reads what follows the events.
FILL_PIECE = 1 << 22
#: Bytes read first to find the event list (doubled until found; only ``segments`` come before it).
#: A file that ends within them is read by the unpickler: below ~10 MB the decoder's fixed costs
#: (the head walked opcode by opcode, each new traceback parsed in Python) lose to pickle.load and
#: the columnar pass: 143 of the 159 fixtures and wild snapshots (all under 4 MB) read 3.4 times
#: slower decoded (12.6 s in all, against 3.7 s); from 15 MB in torch's form it wins (1.75 times
#: faster at 100,000 events, benchmarks/bench_forms.py).
HEAD = 8 << 20
#: Events scanned at once: the first window after an event read one opcode at a time, and the
#: largest (a window doubles while every event in it is ordinary).
WINDOW = (64, 1 << 14)
PAD_BYTES = bytes(PAD)
#: Give up (the file is read the ordinary way) where a chunk creates more new dicts besides its
#: events than this many per event, and more than ``NEW_DICTS_MIN`` of them: each is a frame dict
#: seen for the first time, and an event holding one is parsed one opcode at a time (~0.1 ms
#: an event), 50 times the C unpickler's cost. Torch shares frame dicts, so its files create few:
#: 465 for the 1,398 events of fixtures/plain_gpt_torch_defaults, none in a later step; a snapshot
#: whose every event has its own frame dicts (rebuilt by another tool) creates 31 an event with C++
#: frames, 4 with Python frames only, and took 62 s (100,000 events) where pickle.load and the
#: columnar pass take 2.3 s (benchmarks/bench_forms.py). Only dicts between a chunk's first and last
#: event count: the annotations after the list are all in its last chunk (10M events of torch's form:
#: 257,926 of them beside 38,164 events, which gave way to pickle.load at 7 GiB).
NEW_DICTS_PER_EVENT = 0.5
NEW_DICTS_MIN = 5_000
#: Give up where the VM has read more than this many events and this share of all: the files
#: torch writes have at most 284 such events (h12_hf_static_generate, of 11,914); the integrations'
#: lightning fixtures, re-pickled by their recorder with every frame dict its own, have 98% (3,385 of
#: 3,447: 1.1 s, against 6 ms for pickle.load and the columnar pass).
VM_EVENTS_MIN = 500
VM_EVENTS_SHARE = 0.05
_DICT = int.from_bytes(b"}\x94(", "little")  # EMPTY_DICT MEMOIZE MARK: a dict with items begins


def decode_trace(path: str | os.PathLike, device: int | None = None, *, trusted: bool = False,
                 always: bool = False) -> Trace | None:
    """The Trace of a snapshot file, decoded without unpickling its events; None where this reader
    does not apply (the caller reads the file another way). Raises ``Unprofitable`` where it would
    apply but be slower than unpickling (the caller reads the file with ``pickle.load`` then);
    ``always``: decode whatever it costs (the tests check the decoder on small files).

    Example:
        >>> trace = decode_trace("snapshot.pickle") or read_trace("snapshot.pickle")
    """
    where = os.fspath(path)
    try:
        with open_snapshot(where) as f, no_gc():
            try:
                return _decode(f, where, device, trusted, always)
            except Unprofitable:
                raise
            except (Unsupported, IndexError, KeyError, TypeError, ValueError, OverflowError, pickle.UnpicklingError,
                    EOFError, AttributeError, UnicodeDecodeError):
                return None
    finally:
        _give_back(os.path.getsize(where) if os.path.isfile(where) else 0)


#: Files from this size on hand the C heap's free pages back after decoding (``_give_back``): the
#: heap a file leaves grows with its events (~40 bytes an event at 10M); every fixture and wild
#: snapshot is under 4 MiB, the 1M-event torch-form replication 150 MiB.
GIVE_BACK_BYTES = 64 << 20


def _give_back(size: int) -> None:
    """The C heap's free pages returned to the system (glibc's ``malloc_trim``; elsewhere nothing).
    The decoder's per-window arrays (~100 kB each, thousands of them) are freed into the heap, and
    glibc keeps what it cannot release from the top: with 10M events, `phasemem analyze` held 757 MiB
    after reading, 635 with them returned (its peak: 2,037 and 2,004 MiB). Skipped for small files."""
    if size < GIVE_BACK_BYTES:
        return
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _decode(f, where: str, device: int | None, trusted: bool, always: bool) -> Trace | None:
    df = Deframed(f)
    buf = df.read(HEAD)
    if df.eof and not always:
        raise Unprofitable(f"{len(buf):,} bytes")
    while (found := find_event_list(buf)) is None:
        if df.eof:
            raise Unsupported("no event list")
        buf += df.read(len(buf))
    at, m_head = found
    head = buf[:at]
    memo = Memo(_head_memo(head, where, trusted))
    if memo.m != m_head:
        raise Unsupported("the head's memo is not what its MEMOIZEs say")
    region = Region(memo, always)
    rest = region.decode(buf[at:], df.read)
    del buf
    tail = rest + b"".join(iter(lambda: df.read(CHUNK), b""))
    # the strings the events made go to the unpickler only if what follows them uses one (rarely)
    obj = _finish(head, region, tail, where, trusted, False)
    if obj is None:
        obj = _finish(head, region, tail, where, trusted, True)
    if obj is None:
        raise Unsupported("what follows the events refers to an event or a traceback")
    return from_stand_in(obj, region.stand_in, device)


class _Trusting(pickle.Unpickler):
    """Any global, for files the user trusts (a subclass: it takes the ``where`` attribute)."""

    where: str


def _unpickler(trusted: bool):
    return _Trusting if trusted else _SnapshotUnpickler


def _head_memo(head: bytes, where: str, trusted: bool) -> dict:
    """The objects the memo holds where the events start: the head unpickled, then stopped."""
    up = _unpickler(trusted)(io.BufferedReader(io.BytesIO(head + b"N."), 1 << 20))  # N.: stop there
    up.where = where
    up.load()
    return up.memo.copy()


def _finish(head: bytes, region: Region, tail: bytes, where: str, trusted: bool, strings: bool):
    """The whole snapshot, with the events' list as ``region.stand_in``: the head unpickled again, the
    memo given what the events put in it, in their order, then the tail; None where the tail refers to a
    filler (how, and why: docs/performance.md)."""
    filler = _Filler()
    objs = [region.stand_in, filler]
    inject = [_persistent(0) + b"\x94", _persistent(1)]  # the list stays where the head's EMPTY_LIST left it
    inject += _memo_fill(region.memo, objs, strings)
    inject.append(b"0")  # the filler off the stack
    base = _unpickler(trusted)
    given = iter(range(len(objs)))

    class Finish(base):  # type: ignore[valid-type, misc]  # the base is chosen at run time
        def persistent_load(self, pid):
            # only the ids injected here, in order: a BINPERSID of the file's own is refused as usual
            if pid != next(given, None):
                raise pickle.UnpicklingError("A load persistent id instruction was encountered")
            return objs[pid]

    up = Finish(io.BufferedReader(io.BytesIO(b"".join([head] + inject + [tail])), 1 << 20))  # peek: no read() call per opcode
    up.where = where
    before = sys.getrefcount(filler)
    obj = up.load()
    del up, Finish
    if sys.getrefcount(filler) != before:
        return None
    return obj


class _Filler:
    """Stands in the unpickler's memo for an object the events made and nothing after them uses."""


def _memo_fill(memo, objs: list, strings: bool) -> list[bytes]:
    """The opcodes that give the unpickler's memo, from the list's index on, what the events put
    there: MEMOIZE of the filler on top of the stack, or for a kept object its first occurrence
    by persistent id (then MEMOIZE, POP) and later ones by reference to that (LONG_BINGET, MEMOIZE, POP)."""
    out: list[bytes] = []
    first_of: dict = {}
    lo, hi = memo.list_idx + 1, memo.m
    for a in range(lo, hi, FILL_PIECE):
        z = min(hi, a + FILL_PIECE)
        kept = np.flatnonzero(memo.kept_mask(memo.kind[a:z], strings))
        if len(kept) * SPARSE_KEPT < z - a:  # torch's form: 819 kept of 2.7M at 1M events
            ops = _kept_ops(memo, objs, first_of, a, kept)
            gaps = np.diff(np.concatenate([[-1], kept, [z - a]])) - 1
            out.append(b"".join(b"\x94" * g + op for g, op in zip(gaps.tolist(), ops + [b""])))
            continue
        rows = np.zeros((z - a, 8), np.uint8)
        rows[:, 0] = 0x94
        lens = np.ones(z - a, np.int64)
        if len(kept):
            u, where, inv = np.unique(memo.pay[a:z][kept], return_index=True, return_inverse=True)
            first = np.empty(len(u), np.int64)
            pid = np.zeros(len(u), np.int64)
            for k, (oid, at) in enumerate(zip(u.tolist(), (a + kept[where]).tolist())):
                if oid not in first_of:
                    objs.append(memo.objs[oid])
                    first_of[oid] = (at, len(objs) - 1)
                first[k], pid[k] = first_of[oid]
            at = a + kept
            new = at == first[inv.ravel()]
            arg = np.where(new, pid[inv.ravel()], first[inv.ravel()]).astype("<u4").view(np.uint8).reshape(-1, 4)
            r = rows[kept]
            r[:, 0] = np.where(new, ord("J"), ord("j"))  # BININT pid, BINPERSID  |  LONG_BINGET first
            r[:, 1:5] = arg
            r[:, 5] = np.where(new, ord("Q"), 0x94)
            r[:, 6] = np.where(new, 0x94, ord("0"))
            r[:, 7] = ord("0")
            rows[kept] = r
            lens[kept] = np.where(new, 8, 7)
        out.append(rows[np.arange(8) < lens[:, None]].tobytes())
    return out


#: Where fewer than one memo entry in this many is a kept object, the fill is written as runs of
#: MEMOIZE between the kept ones' opcodes (a join), not as one 8-byte row per entry.
SPARSE_KEPT = 64


def _kept_ops(memo, objs: list, first_of: dict, a: int, kept: np.ndarray) -> list[bytes]:
    """The sparse fill's opcodes, the same bytes as the rows above: each kept entry's opcodes (memo index ``a + kept``): at the object's first occurrence BININT pid,
    BINPERSID, MEMOIZE, POP (the object appended to ``objs``); later, LONG_BINGET of that first, MEMOIZE, POP."""
    ops = []
    for oid, at in zip(memo.pay[a + kept].tolist(), (a + kept).tolist()):
        if oid not in first_of:
            objs.append(memo.objs[oid])
            first_of[oid] = (at, len(objs) - 1)
            ops.append(b"J" + (len(objs) - 1).to_bytes(4, "little") + b"Q\x940")
        else:
            ops.append(b"j" + first_of[oid][0].to_bytes(4, "little") + b"\x940")
    return ops


def _persistent(pid: int) -> bytes:
    return (b"K" + bytes([pid]) if pid < 256 else b"J" + pid.to_bytes(4, "little")) + b"Q"


class Region:
    """The device's event list: from its EMPTY_LIST to what follows it."""

    def __init__(self, memo: Memo, always: bool = False):
        self.memo, self.stand_in, self.always = memo, Columns(memo), always
        self.vm = VM(memo, self.stand_in)
        self.template: Template | None = None
        self.lists: dict = {}
        self.vm.on_first = self._first
        self.vm.stop = True

    def _first(self, ev: dict) -> None:
        self.template = Template(ev, self.memo)

    def decode(self, data: bytes, read) -> bytes:
        """The events from ``data`` (starting at the list) on, reading more with ``read(n)``;
        returns the bytes after the list."""
        pos = self.vm.start(data)
        limit, data = len(data), data + PAD_BYTES  # one copy a chunk: the carried part, the new, the padding
        while True:
            rest = self._chunk(data, limit, pos)
            progress.count(len(self.stand_in))
            if isinstance(rest, bytes):
                return rest
            more = read(CHUNK)
            if not more:
                raise Unsupported("the file ends inside the events")
            limit, data, pos = limit - rest + len(more), b"".join([data[rest:limit], more, PAD_BYTES]), 0

    def _chunk(self, data: bytes, limit: int, pos: int):
        """Decode what ``data[:limit]`` holds from ``pos`` (``data`` is padded): the bytes after the
        list if it ends here, else the position of the first event not complete in it."""
        b, w = views(data, limit)
        c = self._candidates(b, w, limit)
        starts, window = c.tolist(), WINDOW[0]
        ci = bisect.bisect_left(starts, pos)
        while True:
            if ci + 1 < len(starts) and starts[ci] == pos:
                hi = min(len(starts), ci + window + 1)
                assert self.template is not None  # no candidates without it
                t, out = scan(b, w, data, c[ci:hi], self.template, self.memo, self.lists)
                if t:
                    commit(t, out, self.memo, self.stand_in)
                    window = min(2 * window, WINDOW[1]) if t == hi - ci - 1 else WINDOW[0]
                    ci += t
                    pos = starts[ci]
                    continue
                window = WINDOW[0]
            had = self.template
            pos, ci, why = self.vm.run(data, pos, limit, starts, ci)
            vm, n = self.stand_in.read_one, len(self.stand_in) + len(self.stand_in.one[0])
            if vm > max(VM_EVENTS_MIN, VM_EVENTS_SHARE * n) and not self.always:
                raise Unprofitable(f"{vm:,} of {n:,} events read one opcode at a time")
            if why == "end":
                return data[pos:limit]
            if why == "short":
                return pos
            if had is None and self.template is not None:  # the first event read: now events can be found
                self.vm.stop = False
                c = self._candidates(b, w, limit)
                starts = c.tolist()
                ci = bisect.bisect_left(starts, pos)

    def _candidates(self, b: np.ndarray, w: np.ndarray, limit: int) -> np.ndarray:
        if self.template is None:
            return np.zeros(0, np.int64)
        c = candidates(b, w, limit, self.template.prefix).astype(np.int64)
        if len(c) < 2:
            return c
        # only the dicts among the events: those after the last (the annotations, other devices'
        # events) are the unpickler's, and the tail of a long run holds all of its annotations
        at = np.flatnonzero(b[c[0]:c[-1]] == 0x7D) + c[0]
        new_dicts = int(np.count_nonzero((w[at] & np.uint64(0xFFFFFF)) == np.uint64(_DICT))) - (len(c) - 1)
        if new_dicts > max(NEW_DICTS_MIN, NEW_DICTS_PER_EVENT * len(c)) and not self.always:
            raise Unprofitable(f"{new_dicts:,} new dicts for {len(c):,} events")
        return c
