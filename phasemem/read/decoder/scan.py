"""Events read from a pickle's bytes with numpy, many at a time (``phasemem.read.decoder`` says how):
``Template``, ``candidates``, ``scan`` and ``commit`` (each one's part: docs/performance.md).
"""
from __future__ import annotations

import struct

import numpy as np

from .machine import Columns, Unsupported
from .memo import FRAME, LIST, STR, VSTR, Memo

_H, _J4, _K, _M, _J, _LONG1, _SBU = 0x68, 0x6A, 0x4B, 0x4D, 0x4A, 0x8A, 0x8C
_SETITEMS, _APPENDS, _MARK, _APPEND, _EMPTY_LIST, _MEMOIZE = 0x75, 0x65, 0x28, 0x61, 0x5D, 0x94
# opcode → bytes taken, counting its length byte (LONG1, SHORT_BINUNICODE: plus that length) and
# the MEMOIZE that follows a new string; 0: not read here
OPLEN = np.zeros(256, np.int64)
for _op, _n in ((_K, 2), (_M, 3), (_J, 5), (_LONG1, 2), (_H, 2), (_J4, 5), (_SBU, 3),
                (0x4E, 1), (0x88, 1), (0x89, 1), (0x47, 9)):
    OPLEN[_op] = _n
VARLEN = np.zeros(256, bool)
VARLEN[[_LONG1, _SBU]] = True
INTS = ("addr", "size", "stream", "time_us", "device_free")
PAD = 4096  # bytes after the buffer: reads past a cut event (8 fields of at most 258 bytes) stay inside
_ONES, _1, _63 = np.uint64(0xFFFFFFFFFFFFFFFF), np.uint64(1), np.uint64(63)
_U32 = struct.Struct("<I").unpack_from


class Template:
    """The keys of an ordinary event, as the bytes that refer to them, and what each field is."""

    def __init__(self, ev: dict, memo: Memo):
        strs = np.flatnonzero(memo.kind[:memo.m] == STR).tolist()
        index = {id(memo.objs[memo.pay[i]]): i for i in strs}
        self.words = []  # (the key's reference, as an int, its mask, the field's role)
        for key in ev:
            idx = index.get(id(key))
            if idx is None or type(key) is not str:
                raise Unsupported("a key the memo does not hold")
            ref = bytes([_H, idx]) if idx < 256 else bytes([_J4]) + idx.to_bytes(4, "little")
            role = key if key in INTS or key in ("action", "frames") else "meta" if key == "user_metadata" else "other"
            self.words.append((ref, int.from_bytes(ref, "little"), (1 << 8 * len(ref)) - 1, role))
        roles = [r for *_, r in self.words]
        if not {"action", "addr", "size", "stream", "time_us"} <= set(roles) or (
                "frames" in roles and roles[-1] != "frames"):
            raise Unsupported("events of another form")  # older formats: the stream reader's rules apply
        self.prefix = b"}\x94(" + self.words[0][0]


def candidates(b: np.ndarray, w: np.ndarray, limit: int, prefix: bytes) -> np.ndarray:
    """Positions below ``limit`` where ``prefix`` (at most 8 bytes) starts; ``b``, ``w``: ``views``."""
    at = np.flatnonzero(b[:limit] == prefix[0])
    mask = np.uint64((1 << 8 * len(prefix)) - 1)
    return at[(w[at] & mask) == np.uint64(int.from_bytes(prefix, "little"))]


def views(padded: bytes, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """``padded`` (``limit`` bytes of data, then PAD zero bytes) as bytes and as overlapping
    little-endian uint64s, one at every byte offset (``w[p]`` is bytes p..p+7; nothing copied)."""
    assert len(padded) >= limit + PAD
    return np.frombuffer(padded, np.uint8), np.ndarray((limit,), "<u8", buffer=padded, strides=(1,))


def _byte(v, k):
    """Byte ``k`` (an int or an array of them) of each uint64 in ``v``, as uint64."""
    shift = np.uint64(8 * k) if isinstance(k, int) else (k * 8).astype(np.uint64)
    return (v >> shift) & np.uint64(0xFF)


# By opcode × 256 + its next byte: the bytes a value takes, and for integers (BININT1/2, BININT,
# LONG1 of up to 8 bytes) the mask of its bytes and its sign bit (0 where the uint64 view signs it).
_IDX = np.arange(256 * 256)
_OP, _N1 = _IDX >> 8, _IDX & 0xFF
_WIDTH = np.select([_OP == _K, _OP == _M, _OP == _J, _OP == _LONG1], [1, 2, 4, _N1], 99)
_INTOK = _WIDTH <= 8
_MASKS = np.array([(1 << 8 * n) - 1 for n in range(9)], np.uint64)
_MASK = np.where(_INTOK, _MASKS[np.minimum(_WIDTH, 8)], 0).astype(np.uint64)
_TOP = np.where(((_OP == _J) | (_OP == _LONG1)) & (_WIDTH > 0) & (_WIDTH < 8),
                np.uint64(1) << (np.clip(_WIDTH, 1, 8) * 8 - 1).astype(np.uint64), 0).astype(np.uint64)
_LENGTH = (OPLEN[_OP] + VARLEN[_OP] * _N1).astype(np.int64)
_PAYLOAD = np.where(_OP == _LONG1, 2, 1)  # where an integer's bytes start, after its opcode


def _ints(w, p, idx):
    """Integer values at ``p`` (``idx``: opcode × 256 + next byte), and where they are one."""
    mask = _MASK[idx]
    v = w[p + _PAYLOAD[idx]] & mask
    return _INTOK[idx], np.where((v & _TOP[idx]) != 0, v | ~mask, v).view(np.int64)


def scan(b: np.ndarray, w: np.ndarray, data: bytes, c: np.ndarray, tpl: Template, memo: Memo,
         lists: dict) -> tuple[int, dict]:
    """How many of the events starting at ``c[:-1]`` (``c[-1]``: where the one after starts) are
    ordinary, from the first, and their fields. ``b``: the buffer (padded), ``w``: its words (``views``)."""
    m = len(c) - 1
    ok, out = np.ones(m, bool), {"nstr": np.zeros(m, np.int64), "strs": []}
    p, op = _fields(b, w, c[:-1] + 3, ok, out, tpl)
    end, lstart, full = _ends(b, w, p, op, c[1:], ok, out, tpl)
    t = int(np.argmin(ok)) if not ok.all() else m
    # the new lists' contents: one dict lookup per list, each distinct one checked once
    cids = np.full(m, -1, np.int64)
    rows = np.flatnonzero(full[:t])
    got = _list_ids(data, lstart[rows], end[rows] - 1, memo, lists)
    bad = np.flatnonzero(got < -1)
    if len(bad):  # a list of something other than references to frame dicts
        t = int(rows[bad[0]])
    cids[rows] = got
    out["cids"] = cids
    return t, out


def _fields(b, w, p, ok, out: dict, tpl: Template):
    """Each field but the frames: its key checked, its value read (integers, the action's and the
    label's memo reference) or stepped over (new short strings noted: they are memoized). Returns where the
    frames' value starts and its opcode."""
    nstr, op = out["nstr"], None
    for ref, value, mask, role in tpl.words:
        kl = len(ref)
        kw = w[p]  # the key's reference, the value's opcode and its next bytes
        ok &= (kw & np.uint64(mask)) == np.uint64(value)
        op, n1 = _byte(kw, kl), _byte(kw, kl + 1)
        p = p + kl  # the value's opcode (PAD keeps every read of a cut event inside the buffer)
        if role == "frames":
            break
        idx = (op << np.uint64(8)) | n1
        ln = _LENGTH[idx]
        ok &= ln > 0
        if role in INTS:
            good, out[role] = _ints(w, p, idx)
            ok &= good
        elif role == "action":
            ok &= (op == _H) | (op == _J4)
            out["action"] = _reference(w[p], op)
        else:
            s = op == _SBU
            if role == "meta":  # the label: a string seen before (a reference) or a new short one
                ok &= s | (op == _H) | (op == _J4)
                out.update(meta_ref=_reference(w[p], op), meta_new=s, meta_rank=nstr.copy())
            if s.any():  # a value not read; a new string among them is memoized
                ok &= ~s | ((n1 < 16) & (b[p + 2 + n1.astype(np.int64)] == _MEMOIZE))
                at = np.flatnonzero(s)
                n = n1[at].astype(np.int64)
                lo = w[p[at] + 2] & _MASKS[np.minimum(n, 8)]
                hi = (w[p[at] + 10] & _MASKS[np.clip(n - 8, 0, 7)]) | (n1[at] << np.uint64(56))
                out["strs"].append((at, nstr[at].copy(), lo, hi))
                nstr += s
        p = p + ln
    return p, op


def _reference(vw, op):
    """The memo index of BINGET / LONG_BINGET whose opcode is the first byte of ``vw``."""
    return np.where(op == _H, (vw >> np.uint64(8)) & np.uint64(0xFF),
                    (vw >> np.uint64(8)) & np.uint64(0xFFFFFFFF)).astype(np.int64)


def _ends(b, w, p, op, nxt, ok, out: dict, tpl: Template):
    """The frames' value (a reference, an empty list, or a new list whose end is where the next
    event begins) and where each event ends; ``ok`` keeps only events that end where the next one
    begins, or with APPENDS MARK (a batch of 1,000) between them."""
    m = len(nxt)
    if tpl.words[-1][3] == "frames":
        vw = w[p]
        get = (op == _H) | (op == _J4)
        glen = np.where(op == _H, 2, 5)
        newl = (op == _EMPTY_LIST) & (_byte(vw, 1) == _MEMOIZE)
        empty = newl & (_byte(vw, 2) == _SETITEMS)
        ok &= (get & (_byte(vw, glen) == _SETITEMS)) | newl
        end = np.where(get, p + glen + 1, np.where(empty, p + 3, -1))
        out["fref"] = _reference(vw, op)
    else:
        get = newl = empty = np.zeros(m, bool)
        ok &= b[p] == _SETITEMS
        end = p + 1
    full = newl & ~empty
    before = w[np.maximum(nxt - 3, 0)]  # the three bytes before the next event
    inferred = np.where(_byte(before, 2) == _SETITEMS, nxt,
                        np.where((_byte(before, 0) == _SETITEMS) & (_byte(before, 1) == _APPENDS)
                                 & (_byte(before, 2) == _MARK), nxt - 2, -1))
    end = np.where(full, inferred, end)
    lstart = p + 2
    ok &= ~full | (end - 1 > lstart)
    e = np.maximum(end, 0)
    gap = w[e]
    ok &= (end >= 0) & ((nxt == e) | ((nxt == e + 2) & (_byte(gap, 0) == _APPENDS) & (_byte(gap, 1) == _MARK)))
    out.update(newl=newl, get=get)
    return end, lstart, full


def _list_ids(data: bytes, a: np.ndarray, z: np.ndarray, memo: Memo, lists: dict) -> np.ndarray:
    """Content ids of the new lists whose bytes are ``data[a:z]`` (-2 where one is not a list of
    references to frame dicts the memo holds). Torch writes the same traceback again every step:
    a list is known by its bytes, each distinct one checked once (``_list_of_refs``). A bytes key
    and a dict lookup (~0.3 µs) cost less here than grouping them with numpy (~1 µs: every byte
    read twice)."""
    found = list(map(lists.get, map(data.__getitem__, map(slice, a.tolist(), z.tolist()))))  # no Python loop
    for i, cid in enumerate(found):
        if cid is None:
            key = data[int(a[i]):int(z[i])]
            cid = lists.get(key)  # an earlier list of this window may have brought it
            if cid is None:
                cid = _list_of_refs(key, memo)  # None may mean a frame dict not read yet: not kept
            if cid is None:
                found[i] = -2
            else:
                lists[key] = found[i] = cid
    return np.array(found, np.int64)


def _list_of_refs(key: bytes, memo: Memo) -> int | None:
    """The stack id of a new list written as MARK, references to frame dicts, APPENDS (or one
    reference and APPEND); None if it is anything else."""
    if key[:1] == b"(" and key[-1:] == b"e":
        body, one = key[1:-1], False
    elif key[-1:] == b"a":
        body, one = key[:-1], True
    else:
        return None
    frames, pos = [], 0
    while pos < len(body):
        if body[pos] == _H and pos + 2 <= len(body):
            idx, pos = body[pos + 1], pos + 2
        elif body[pos] == _J4 and pos + 5 <= len(body):
            idx, pos = _U32(body, pos + 1)[0], pos + 5
        else:
            return None
        if not idx < memo.m or memo.kind[idx] != FRAME:
            return None
        frames.append(memo.objs[memo.pay[idx]])
    if one and len(frames) != 1:
        return None
    return memo.list_cid(frames)


def commit(t: int, out: dict, memo: Memo, cols: Columns) -> None:
    """The first ``t`` scanned events: what they memoize, then their columns."""
    sl = slice(0, t)
    nstr, newl, get = out["nstr"][sl], out["newl"][sl], out["get"][sl]
    counts = 1 + nstr + newl
    base = memo.m + np.cumsum(counts) - counts
    memo.grow(memo.m + int(counts.sum()))
    at = (base + 1 + nstr)[newl]  # the dict, its new strings, then its frames list
    memo.kind[at], memo.pay[at] = LIST, out["cids"][sl][newl]
    for rows, rank, lo, hi in out["strs"]:
        mine = rows < t
        if mine.any():
            at = base[rows[mine]] + 1 + rank[mine]
            memo.kind[at], memo.pay[at] = VSTR, memo.strings(lo[mine], hi[mine])
    memo.m += int(counts.sum())
    a = out["action"][sl]
    if (a >= base).any() or ((memo.kind[a] != STR) & (memo.kind[a] != VSTR)).any():
        raise Unsupported("an action that is not a string the memo holds")
    codes = memo.code_table()[memo.pay[a]]
    labels = None
    if "meta_new" in out:  # the label's memo entry: its own new string, or the one it refers to
        new = out["meta_new"][sl]
        at = np.where(new, base + 1 + out["meta_rank"][sl], out["meta_ref"][sl])
        if ((at >= base) & ~new).any() or ((memo.kind[at] != STR) & (memo.kind[at] != VSTR)).any():
            raise Unsupported("user_metadata that is not a string the memo holds")
        u, inv = np.unique(memo.pay[at], return_inverse=True)
        labels = cols.labels_of([memo.objs[o] for o in u.tolist()])[inv.ravel()]
    cids = out["cids"][sl].copy()
    if get.any():
        f = out["fref"][sl][get]
        if (f >= base[get]).any() or (memo.kind[f] != LIST).any():
            raise Unsupported("frames that are not a list the memo holds")
        cids[get] = memo.pay[f]
    cols.add(codes, out["addr"][sl], out["size"][sl], out["stream"][sl], out["time_us"][sl], cids,
             out["device_free"][sl] if "device_free" in out else None, labels)
