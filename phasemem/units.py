"""Human-readable byte sizes, shared by the report table and the picture."""

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(n: float) -> str:
    """``format_bytes(3 * 2**30) == '3.00 GiB'``; negative sizes keep their sign."""
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in _UNITS:
        if n < 1024 or unit == _UNITS[-1]:
            if unit == "B":
                return f"{sign}{int(n)} B"
            return f"{sign}{n:.2f} {unit}" if n < 100 else f"{sign}{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def axis_unit(top: int) -> tuple[float, str]:
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
