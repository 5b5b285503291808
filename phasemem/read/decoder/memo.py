"""What each memo index of a snapshot pickle holds, as far as its events need to know, for the
fast decoder (``phasemem.read.decoder``): MEMOIZE numbers objects by count, so every later
reference depends on it (what ``Memo`` keeps, and why: docs/performance.md).
"""
from __future__ import annotations

import numpy as np

from ..trace import _CODES, _frame_key
from .layout import Unsupported

OTHER, STR, FRAME, LIST, OBJ, VSTR = range(6)  # memo kinds; VSTR: a string read by scan.py


class ListRef:
    """A reference to a list of frames the memo holds: its stack's content id (-1: empty)."""

    __slots__ = ("cid",)

    def __init__(self, cid: int):
        self.cid = cid


OPAQUE = object()  # a memo entry whose value the events never need (an event, a compile_context string)


class Memo:
    """Kinds and payloads of memo indices, and the distinct stacks (by frame content)."""

    def __init__(self, head: dict):
        self.head_size = len(head)
        self.kind = np.zeros(max(1 << 16, 2 * len(head)), np.int8)
        self.pay = np.zeros(len(self.kind), np.int32)
        self.objs: list = []
        # per object: its action code if a str, else -1; grown in place (rebuilding it whenever an
        # object was added cost 28 s for 100,000 events that each bring their own frame dicts)
        self._codes = np.zeros(1024, np.int16)
        self.contents: list[tuple] = []
        self._cid: dict[tuple, int] = {}
        self._short: dict[tuple, int] = {}  # short strings events create, by their bytes: one object each
        self.m = self.list_idx = 0
        for i in range(len(head)):
            self.put(i, head[i], region=False)
        self.m = len(head)

    def grow(self, need: int) -> None:
        if need > len(self.kind):
            size = max(need, 2 * len(self.kind))
            self.kind = np.concatenate([self.kind, np.zeros(size - len(self.kind), np.int8)])
            self.pay = np.concatenate([self.pay, np.zeros(size - len(self.pay), np.int32)])

    def put(self, idx: int, obj, region: bool = True) -> None:
        t = type(obj)
        if t is list:
            try:
                kind, pay = LIST, self.list_cid(obj)
            except (KeyError, TypeError):
                kind, pay = (OTHER if region else OBJ), 0
        elif t is str:
            kind, pay = STR, self._keep(obj, _CODES[obj])
        elif t is dict and "filename" in obj and "line" in obj and "name" in obj:
            kind, pay = FRAME, self._keep(obj, -1)
        elif region:
            kind, pay = OTHER, 0
        else:
            kind, pay = OBJ, self._keep(obj, -1)
        self.kind[idx], self.pay[idx] = kind, pay

    def _keep(self, obj, code: int) -> int:
        k = len(self.objs)
        self.objs.append(obj)
        if k == len(self._codes):
            self._codes = np.concatenate([self._codes, np.zeros(k, np.int16)])
        self._codes[k] = code
        return k

    def code_table(self) -> np.ndarray:
        return self._codes

    def list_cid(self, frames) -> int:
        """The content id of a list of frame dicts (-1 if empty), as ``_intern_stacks`` keys it."""
        if not frames:
            return -1
        content = tuple(map(_frame_key, frames))
        cid = self._cid.get(content)
        if cid is None:
            cid = self._cid[content] = len(self.contents)
            self.contents.append(content)
        return cid

    def resolve(self, idx: int):
        """The value of a memo reference, for the VM."""
        if not 0 <= idx < self.m:
            raise Unsupported("a reference to nothing")
        k = self.kind[idx]
        if k == LIST:
            return ListRef(int(self.pay[idx]))
        if k == OTHER:
            return OPAQUE
        return self.objs[self.pay[idx]]

    def object(self, idx: int):
        """The object at a memo index, for the unpickler that reads what follows the events."""
        if self.kind[idx] not in (STR, FRAME, OBJ, VSTR):
            raise Unsupported("what follows the events refers to an event or a traceback")
        return self.objs[self.pay[idx]]

    @staticmethod
    def kept_mask(kind: np.ndarray, strings: bool) -> np.ndarray:
        """Which entries' objects go to the unpickler that reads the rest: strings and frame dicts
        the VM made, and with ``strings`` the (many) strings scan.py read too."""
        keep = (kind == STR) | (kind == FRAME)
        return keep | (kind == VSTR) if strings else keep

    def strings(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Object ids of short strings given as two uint64 each: bytes 0-7, and bytes 8-14 with the
        length in the top byte (zeros past the end). One object per distinct string."""
        if (lo == lo[0]).all() and (hi == hi[0]).all():  # the usual case: all one string ('N/A')
            return np.full(len(lo), self._short_id(int(lo[0]), int(hi[0])), np.int32)
        pairs = np.stack([lo, hi], axis=1)
        u, inv = np.unique(pairs, axis=0, return_inverse=True)
        ids = np.array([self._short_id(int(a), int(z)) for a, z in u.tolist()], np.int32)
        return ids[inv.ravel()]

    def _short_id(self, lo: int, hi: int) -> int:
        oid = self._short.get((lo, hi))
        if oid is None:
            raw = lo.to_bytes(8, "little") + hi.to_bytes(8, "little")
            s = raw[:raw[15]].decode("utf-8", "surrogatepass")
            oid = self._short[(lo, hi)] = self._keep(s, _CODES[s])
        return oid
