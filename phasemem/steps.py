"""Step ranges as users write them ("3", "2-4", "2-", "-4"): parsed in one place, for the CLI, the
steps slicer and the picture; one message for a range that names nothing. No matplotlib here."""
from __future__ import annotations

import re
from typing import overload

from .errors import PhasememError


class StepsError(PhasememError, ValueError):
    """A ``steps`` range or ``events`` window that names nothing this report has."""


@overload
def parse_steps(spec: None) -> None: ...
@overload
def parse_steps(spec: str | int) -> tuple[int | None, int | None]: ...
def parse_steps(spec) -> tuple[int | None, int | None] | None:
    """A ``--steps`` text as (first, last) step numbers, either end open (None); bad text raises.

    Example:
        >>> parse_steps("2-4"), parse_steps("3"), parse_steps("2-")
        ((2, 4), (3, 3), (2, None))
    """
    if spec is None:
        return None
    text = str(spec).strip()
    m = re.fullmatch(r"(\d+)?\s*(-)?\s*(\d+)?", text)
    if not text or m is None or (m.group(2) is None and m.group(3) is not None) or (m.group(1) is None and m.group(3) is None):
        raise StepsError(f"steps={text!r}: give a step number or a range of them: 3, 2-4, 2- or -4")
    lo = int(m.group(1)) if m.group(1) is not None else None
    hi = (int(m.group(3)) if m.group(3) is not None else None) if m.group(2) else lo
    if lo is not None and hi is not None and lo > hi:
        raise StepsError(f"steps={text!r}: the range runs backwards; write {hi}-{lo}")
    return lo, hi
