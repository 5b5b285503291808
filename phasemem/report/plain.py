"""The model's dataclasses as JSON-ready Python values (``Report.to_dict``; the JSON reporter writes them).

At 1M events a report holds 60,000 of them (every step's phases and their largest allocations),
with half a million fields: each value's type is looked up once, not tried against every kind in
turn, each class's fields are listed once, not by ``dataclasses.fields`` per object, and objects
of leaves alone are copied in C (``to_dict`` at 1M events, 2,179 steps: 0.39 s to 0.13 s)."""
from __future__ import annotations

from dataclasses import fields
from operator import attrgetter

import numpy as np

from ..model import Allocation, DeviceSummary, OutOfMemory, Pattern, PeakBreakdown, Phase, Step, WhatIf

__all__ = ["plain"]

_MODEL = (Phase, Step, Allocation, Pattern, OutOfMemory, DeviceSummary, PeakBreakdown, WhatIf)
#: Values kept as they are, by exact type (a subclass, numpy's float64 say, goes the general way).
_LEAF = frozenset({int, float, str, bool, type(None)})
#: Each model class's fields in order, less ``members`` (a Pattern's allocations, not in JSON), and
#: a getter of all of them at once.
_FIELDS = {cls: (names, attrgetter(*names))
           for cls in _MODEL for names in [tuple(f.name for f in fields(cls) if f.name != "members")]}


def plain(obj):
    """``obj`` with every model dataclass a dict of its fields, tuples lists and numpy integers ints.

    Example:
        >>> plain(Allocation(event=3, size=np.int64(512)))
        {'event': 3, 'size': 512, 'free_event': None, 'stack': None}
    """
    t = type(obj)
    if t in _LEAF:
        return obj
    # all leaves (an Allocation, a by_category): copied in C, their types checked in one pass too
    if t in _FIELDS:
        names, get = _FIELDS[t]
        vals = get(obj)
        if _LEAF.issuperset(map(type, vals)):
            return dict(zip(names, vals))
        return {k: v if type(v) in _LEAF else plain(v) for k, v in zip(names, vals)}
    if t is dict:
        if _LEAF.issuperset(map(type, obj.values())):
            return dict(obj)
        return {k: v if type(v) in _LEAF else plain(v) for k, v in obj.items()}
    if t is list:
        if _LEAF.issuperset(map(type, obj)):
            return list(obj)
        return [v if type(v) in _LEAF else plain(v) for v in obj]
    return _general(obj)


def _general(obj):
    """The same for a subclass of any of those types (what ``plain`` did for every value before)."""
    if isinstance(obj, _MODEL):
        return {f.name: plain(getattr(obj, f.name)) for f in fields(obj) if f.name != "members"}
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, np.integer):
        return int(obj)
    return obj
