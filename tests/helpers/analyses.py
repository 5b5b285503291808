"""Each analysis made once a session: ``analyzed(path, form, **options)`` keyed by (path, form,
options), so the same trace is not analysed again by every file that checks something of it.

A cached Report is shared by every test that asks for it: read it, never change it. A test that
changes what ``phasemem.analyze`` does (a knocked-out detector) runs inside ``fresh_analyses()``, so
that it neither reads the session's reports nor leaves its own among them.
"""
from __future__ import annotations

import contextlib
import copy
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

import phasemem
from helpers.paths import heldout_path
from helpers.snapshots import as_handed_over, bare, read
from phasemem.vocab import C


def _no_frames(snap: dict) -> dict:
    for e in snap["device_traces"][0]:
        e["frames"] = []
    return snap


#: How the recording is handed to ``phasemem.analyze``: the file itself (its readers), or the snapshot
#: read with pickle and then left as recorded, as a user hands it over, bare, or without its events'
#: stack frames (annotations kept).
FORMS = {
    "recorded": lambda s: s,
    "handed_over": as_handed_over,
    "bare": bare,
    "no_frames": _no_frames,
}

#: The most trace events the cached reports may hold together, least recently used dropped first: a
#: Report keeps ~290 B an event (40 of fixtures/heldout1x: 383,177 events, +105 MiB), so about 1.7 GiB;
#: the suite's analyses that more than one file reads (fixtures/: 2.15 M events) fit in it a few times.
MAX_CACHED_EVENTS = 6_000_000

_reports: OrderedDict = OrderedDict()


def analyzed(path, form: str = "recorded", **options):
    """The Report of ``path`` in ``form`` ("file", or one of FORMS) with ``phasemem.analyze``'s
    ``options``; made on first use, shared afterwards. A held-out name (``h9_ppo``) stands for its file.
    Skips the test where the file is missing."""
    path = Path(path) if ("/" in str(path) or str(path).endswith(".xz")) else heldout_path(str(path))
    key = (path, form, tuple(sorted(options.items())))
    if key in _reports:
        _reports.move_to_end(key)
        return _reports[key]
    if not path.exists():
        pytest.skip(f"{path} is missing")
    if form == "file":
        report = phasemem.analyze(path, **options)
    else:
        report = phasemem.analyze(FORMS[form](read(path)), **options)
    _reports[key] = report
    while len(_reports) > 1 and sum(r.n_events for r in _reports.values()) > MAX_CACHED_EVENTS:
        _reports.popitem(last=False)
    return report


def marked_and_plain(recording) -> list:
    """[("marked", the report with the gt:: ranges as markers), ("plain", the report as handed over)].

    ``recording``: a held-out name or a path (both analyses cached), or a snapshot dict (analysed
    here, each call)."""
    if isinstance(recording, dict):
        return [("marked", phasemem.analyze(copy.deepcopy(recording), marker_prefix="gt::")),
                ("plain", phasemem.analyze(as_handed_over(recording)))]
    return [("marked", analyzed(recording, marker_prefix="gt::")), ("plain", analyzed(recording, "handed_over"))]


@contextlib.contextmanager
def fresh_analyses():
    """Inside: an empty cache of its own, dropped on leaving (for tests that patch phasemem)."""
    global _reports
    kept, _reports = _reports, OrderedDict()
    try:
        yield
    finally:
        _reports = kept


def category_events(report, cat: str) -> set[int]:
    """The alloc events of the blocks ``report`` puts in category ``cat``."""
    life = report.analysis.timeline.lifetimes
    codes = np.asarray(report.analysis.categories.codes)
    return set(life.alloc_event[(codes == C[cat]) & (life.alloc_event >= 0)].tolist())


def not_released(report, kind: str) -> list:
    """``report``'s patterns of ``kind``, less those that release (gradients freed by zero_grad)."""
    return [p for p in report.patterns if p.kind == kind and not p.details.get("release")]
