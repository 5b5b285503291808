"""A marked trace's truth and its reading from lifetimes alone, as docs/eval_frameless.py scores it:
the truth is the trace's own marks (phasemem:: or gt::), the reading the same snapshot with every
annotation and stack frame removed (``snapshots.bare``), segmented without markers."""
from __future__ import annotations

import lzma
import pickle

import pytest

from helpers.analyses import analyzed
from helpers.paths import FIXTURES
from phasemem.analysis.segmentation import segment
from phasemem.analysis.timeline import Timeline
from phasemem.read.trace import Trace
from phasemem.vocab import P

_cache: dict = {}


def frameless(rel: str):
    """(truth labels, truth step count, the bare trace, its segmentation) of fixtures/<rel>.pkl.xz, made
    once a session and shared by every test that asks: read them, never change them."""
    if rel not in _cache:
        path = FIXTURES / f"{rel}.pkl.xz"
        if not path.exists():
            pytest.skip(f"{path} is missing")
        obj = pickle.loads(lzma.decompress(path.read_bytes()))
        snap = obj.get("snapshot", obj)
        names = {str(a.get("name", "")) for a in snap.get("external_annotations") or []}
        prefix = (snap.get("phasemem") or {}).get("markers") or (
            "gt::" if any(n.startswith("gt::") for n in names) else "phasemem::")
        marked = Trace.from_snapshot(snap)
        truth = segment(marked, prefix, Timeline.from_trace(marked))
        # the session's analysis of the bare snapshot (helpers.analyses): its trace and segmentation are
        # segment()'s of the bare Trace, and the held-out tests that analyse it bare share it
        reading = analyzed(path, "bare")
        _cache[rel] = (truth.labels.copy(), len(truth.steps), reading.analysis.trace, reading.analysis.segmentation)
    return _cache[rel]


def share(truth, got, phase: str) -> float:
    """Of the events the marks call ``phase``, the share the inference calls so too."""
    m = truth == P[phase]
    return float((got[m] == P[phase]).mean())
