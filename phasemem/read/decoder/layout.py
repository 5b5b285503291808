"""Pickle opcodes read by hand, for the fast snapshot decoder (``phasemem.read.decoder``): the
pickle without its FRAME headers (``Deframed``), and where the events' list starts
(``find_event_list``); anything unexpected raises ``Unsupported`` (docs/performance.md).
"""
from __future__ import annotations

import pickletools

FRAME = 0x95
PROTO_HEAD = b"\x80\x04"
#: Opcodes walked to find the event list before giving up (only ``segments`` come before it).
MAX_HEAD_OPS = 3_000_000
# What a pickler writes outside frames: a str/bytes payload of 64 KiB or more, its length in 4 or 8 bytes.
_UNFRAMED = {ord("X"): 4, ord("B"): 4, 0x8D: 8, 0x8E: 8, 0x96: 8}
_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"}


class Unsupported(Exception):
    """The bytes are not in the form the fast decoder reads."""


class Unprofitable(Unsupported):
    """The fast decoder would be slower here than ``pickle.load`` and the columnar pass: the file
    is small, or its events are not in torch's shared form (``phasemem.read.decoder`` says when)."""


class Deframed:
    """The opcodes of a protocol-4/5 pickle read from ``f``, FRAME headers removed.

    Example:
        >>> Deframed(open("snapshot.pickle", "rb")).read(1 << 20)[:2]
        b'\\x80\\x04'
    """

    def __init__(self, f):
        head = f.read(2)
        if len(head) < 2 or head[0] != 0x80 or head[1] < 4:
            raise Unsupported("not protocol 4 or 5")  # protocols 2-3 number the memo explicitly
        self.f, self.left, self.pending, self.eof = f, 0, [PROTO_HEAD], False
        first = f.read(1)
        if first[:1] != bytes([FRAME]):
            raise Unsupported("no frames")
        self._frame_header(first)

    def _frame_header(self, h: bytes) -> None:
        if h[0] == FRAME:
            size = self.f.read(8)
            if len(size) < 8:
                raise Unsupported("cut in a frame header")
            self.left = int.from_bytes(size, "little")
            return
        n = _UNFRAMED.get(h[0])
        if n is None:
            raise Unsupported(f"opcode {h[0]:#x} outside a frame")
        size = self.f.read(n)
        self.pending.append(h + size)  # the header is an opcode; its payload is read like a frame
        self.left = int.from_bytes(size, "little")

    def read(self, n: int) -> bytes:
        """About ``n`` bytes of opcodes (fewer only at the end)."""
        parts, want = self.pending, n - sum(map(len, self.pending))
        self.pending = []
        while want > 0 and not self.eof:
            if not self.left:
                h = self.f.read(1)
                if not h:
                    self.eof = True
                    break
                self._frame_header(h)
                want -= sum(map(len, self.pending))
                parts += self.pending
                self.pending = []
                continue
            data = self.f.read(min(self.left, want))
            if not data:
                raise Unsupported("cut inside a frame")  # the ordinary reader says so, in its words
            parts.append(data)
            self.left -= len(data)
            want -= len(data)
        return b"".join(parts)


def find_event_list(data: bytes) -> tuple[int, int] | None:
    """In de-framed ``data``, the position of the EMPTY_LIST that starts the first device list with
    events (inside the value of the key ``device_traces``) and the memo count there; None if
    ``data`` ends before it (read more); ``Unsupported`` if the layout is another."""
    m, state, where, m_where = 0, "key", None, 0
    try:
        for k, (op, arg, pos) in enumerate(pickletools.genops(data)):
            if k > MAX_HEAD_OPS:
                raise Unsupported("no device_traces near the start")
            name = op.name
            if name == "MEMOIZE":
                m += 1
                continue
            if name in ("PUT", "BINPUT", "LONG_BINPUT"):
                raise Unsupported("explicit memo indices")
            if state == "key":
                if name in _STRINGS and arg == "device_traces":
                    state = "outer"
            elif state == "outer":  # the string elsewhere (a frame's name, say) is followed by no list
                state = "devices" if name == "EMPTY_LIST" else "key"
            elif state == "devices":  # MARK, then one list per device
                if name == "MARK":
                    continue
                if name != "EMPTY_LIST":
                    raise Unsupported("device_traces holds something else")
                state, where, m_where = "list", pos, m
            elif state == "list":  # what follows a device's list tells whether it has events
                if name == "EMPTY_LIST":
                    where, m_where = pos, m
                elif name in ("APPEND", "APPENDS"):
                    raise Unsupported("every device list is empty")
                else:
                    assert where is not None  # set on entering "list"
                    return where, m_where
            if name == "STOP":
                raise Unsupported("no device_traces")
    except ValueError:  # the data ends inside an opcode or before STOP
        return None
    return None
