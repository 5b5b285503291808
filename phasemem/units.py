"""Human-readable byte sizes, shared by the report table and the picture, and sizes read from text."""

import functools
import re

from .errors import PhasememError

#: Units a size may carry: binary (KiB = 1024 B, as torch and the report count) and decimal (KB = 1000 B).
UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
         "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
#: A size or a relative limit: an optional sign, a number, and % or a unit.
SIZE_VALUE = re.compile(r"([+-])?\s*((?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(%|[A-Za-z]*)")

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
#: How many formatted integer sizes are kept for the next call (a lookup is a fifth of formatting).
FORMATTED_KEPT = 4096


def format_bytes(n: float) -> str:
    """``format_bytes(3 * 2**30) == '3.00 GiB'``; negative sizes keep their sign."""
    if type(n) is int:  # most calls, and few sizes among them: 19,600 calls of 8 sizes in big1m's shapes
        return _format_int(n)
    return _format(n)


@functools.lru_cache(maxsize=FORMATTED_KEPT)
def _format_int(n: int) -> str:
    return _format(n)


def _format(n: float) -> str:
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in _UNITS:
        if n < 1024 or unit == _UNITS[-1]:
            if unit == "B":
                return f"{sign}{int(n)} B"
            return f"{sign}{n:.2f} {unit}" if n < 100 else f"{sign}{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def axis_unit(top: float) -> tuple[float, str]:
    """The binary unit an axis reaching ``top`` bytes is labelled in: (divisor, name)."""
    for div, name in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if top >= div:
            return float(div), name
    return 1.0, "B"


def signed(n: int) -> str:
    """``+250.0 MiB`` / ``-1.41 GiB`` / ``0 B``."""
    return ("+" if n > 0 else "") + format_bytes(n)


def pct(delta: int | None, base: int | None) -> str:
    """``+12.5 %`` of ``base``; ``—`` where there is no base to compare with."""
    if delta is None or not base:
        return "—"
    return f"{100.0 * delta / base:+.1f} %"


def parse_size(text) -> int:
    """Bytes from ``"2 GiB"``, ``"512MiB"``, ``"1.5e9"``, ``"3 GB"`` or an int.

    Example:
        >>> parse_size("1.5 GiB"), parse_size("2GB"), parse_size(4096)
        (1610612736, 2000000000, 4096)
    """
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    m = SIZE_VALUE.fullmatch(str(text).strip())
    if m is None or m.group(1) or m.group(3) == "%":
        raise PhasememError(f"{text!r}: give a size such as 2GiB, 512MiB, 3GB or a number of bytes")
    return int(float(m.group(2)) * unit_bytes(m.group(3), text))


def unit_bytes(unit: str, text) -> int:
    if unit.lower() not in UNITS and unit:
        raise PhasememError(f"{text!r}: unknown unit {unit!r}; use B, KiB, MiB, GiB, TiB (1024) or KB, MB, GB, TB (1000)")
    return UNITS.get(unit.lower(), 1)
