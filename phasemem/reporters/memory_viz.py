"""phasemem's labels written into the snapshot itself, in the forms torch's memory_viz reads: each
event's ``category`` and ``user_metadata``, and START/END ranges per step, phase and shape
(docs/memory_viz.md).

Example:
    >>> snap = phasemem.read.snapshot.load_snapshot("snapshot.pickle")
    >>> labels = annotate(snap, [phasemem.analyze(snap)])
    >>> open("labelled.pickle", "wb").write(memoryviz_pickle(labels.snapshot))
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import PhasememError
from ..output import Writer
from ..report.registry import writes
from ..report.report import Report
from ..vocab import CATEGORIES, PHASES

#: Prefix of the annotation ranges written: not phasemem's marker prefix ``phasemem::``, so analysing
#: the labelled snapshot reads the markers the original had and never takes its own labels for markers.
LABEL_PREFIX = "phasemem."

#: MemoryViz.js's name for an allocation without a category (``element_obj.category || 'unknown'``);
#: phasemem's ``other`` claims no more than that. It must be among the names: when the categories lack
#: it MemoryViz pushes it onto ``snapshot.categores`` (sic) and the page fails to load.
UNKNOWN = "unknown"

#: MemoryViz.js ``unpickle``: ``if (version < 2 || version > 4) throw new Error(`Unhandled version``.
MEMORYVIZ_PROTOCOL = 4

# The value types MemoryViz's unpickler has opcodes for (no GLOBAL, REDUCE, BINBYTES or EMPTY_SET).
_PLAIN = (str, int, float, bool, type(None))


@dataclass
class Labels:
    """A labelled snapshot and what was added to it."""

    snapshot: dict
    categories: int = 0  # events given a category
    metadata: int = 0  # events given user_metadata
    ranges: dict = field(default_factory=dict)  # "step" / "phase" / "shape" → START/END pairs added
    converted: dict = field(default_factory=dict)  # type name → values written as a plain type
    notes: list = field(default_factory=list)
    labelled: list = field(default_factory=list, repr=False)  # (device, event) given a category


def annotate(snapshot: dict, reports) -> Labels:
    """The snapshot with each report's steps, phases, shapes and categories added; ``snapshot`` is not
    changed (what is not labelled is shared, not copied).

    Example:
        >>> labels = annotate(snap, [phasemem.analyze(snap, 0)])
        >>> labels.snapshot["device_traces"][0][5]["category"]
        'activation'
    """
    traces = list(snapshot.get("device_traces") or [])
    out = Labels(snapshot={**snapshot, "device_traces": traces})
    anns = list(snapshot.get("external_annotations") or [])
    if any(str(a.get("name", "")).startswith(LABEL_PREFIX) for a in anns if isinstance(a, dict)):
        raise PhasememError("this snapshot was labelled by phasemem annotate already; annotate the original snapshot")
    added = []
    for r in reports:
        dev = _device_of(r, traces)
        traces[dev] = _label_events(r, traces[dev], dev, out)
        added += _ranges(r, traces[dev], dev, out)
    _ensure_unknown(traces, out)
    if added:
        out.snapshot["external_annotations"] = anns + sorted(added, key=lambda a: a["time_us"])
    out.snapshot = _plain(out.snapshot, out.converted, {})
    return out


def _device_of(report, traces) -> int:
    if report.live is not None or report.analysis is None:
        raise PhasememError(f"{report.device}: the snapshot holds no allocation history: nothing to label")
    dev = int(report.analysis.trace.device)
    events = traces[dev] if 0 <= dev < len(traces) else None
    if not isinstance(events, list) or len(events) != report.n_events or report.analysis.trace.first_event:
        raise PhasememError(f"{report.device}: the report was not made from this whole snapshot; "
                            "analyse the same snapshot without --steps")
    return dev


def _label_events(report, events: list, dev: int, out: Labels) -> list:
    """A copy of one device's event list, the events that made (or, made before recording, freed) an
    allocation given its category and, where torch left it empty, phasemem's words for it."""
    life = report.analysis.timeline.lifetimes
    owner = _owner_events(events, life)
    texts = _allocation_texts(report, life)
    cats = np.asarray(report.analysis.categories.codes)
    names = [UNKNOWN if c == "other" else c for c in CATEGORIES]
    events = list(events)
    for i, evs in owner:
        for e in evs:
            ev = dict(events[e])
            if "category" not in ev:
                ev["category"] = names[cats[i]]
                out.categories += 1
                out.labelled.append((dev, e))
            if not ev.get("user_metadata") and isinstance(ev.get("user_metadata", ""), str):
                ev["user_metadata"] = texts[i]
                out.metadata += 1
            events[e] = ev
    return events


def _owner_events(events: list, life) -> list[tuple[int, list[int]]]:
    """(allocation, the events memory_viz takes it from) for every allocation the trace shows: its
    alloc; for one made before recording, its free and the free_requested memory_viz merges into it."""
    out = []
    n = len(events)
    for i, (a, f) in enumerate(zip(life.alloc_event.tolist(), life.free_event.tolist())):
        if a >= 0:
            out.append((i, [a]))
        elif f < n:
            prev = events[f - 1] if f > 0 else {}
            merged = prev.get("action") == "free_requested" and prev.get("addr") == events[f].get("addr")
            out.append((i, [f - 1, f] if merged else [f]))
    return out


def _allocation_texts(report, life) -> list[str]:
    """'phasemem: step 3, backward, activation, logits' for every allocation (one string per distinct
    text, shared: the pickle stores each once)."""
    step_of, labels = report.analysis.step_of, report.analysis.labels
    numbers = [s.number for s in report.steps]
    sure = {p.name: p for p in report.phases.values()}
    shapes = _shapes_of(report, len(life))
    cats = np.asarray(report.analysis.categories.codes)
    seen: dict[str, str] = {}
    out = []
    for i, a in enumerate(life.alloc_event.tolist()):
        if a < 0:
            where = "made before recording"
        else:
            s, ph = int(step_of[a]), PHASES[int(labels[a])]
            guess = sure.get(ph)
            if guess is not None and guess.source == "inferred":
                ph += f" (inferred, {guess.confidence:.0%} sure)"
            ph = "no phase known" if ph == "other" else ph
            where = f"step {numbers[s]}, {ph}" if s >= 0 else f"no step, {ph}"
        text = f"phasemem: {where}, {CATEGORIES[cats[i]]}" + "".join(f", {k}" for k in shapes[i])
        out.append(seen.setdefault(text, text))
    return out


def _shapes_of(report, n: int) -> list[tuple[str, ...]]:
    """The shape kinds each allocation (Lifetimes order) is a member of."""
    n_pre = int(report.analysis.timeline.lifetimes.preexisting.sum())
    kinds: list[list[str]] = [[] for _ in range(n)]
    for p in report.patterns:
        for m in p.members:
            if p.kind not in kinds[n_pre + m]:
                kinds[n_pre + m].append(p.kind)
    return [tuple(k) for k in kinds]


def _ranges(report, events: list, dev: int, out: Labels) -> list[dict]:
    """START/END annotations of every step, phase run and shape, at the times of their first and last
    event (an event at time t is inside when START <= t <= END, as phasemem reads markers)."""
    if not report.analysis.trace.time_us.any():
        out.notes.append(f"{report.device}: the trace has no event times, so no annotation ranges were written "
                         "(memory_viz still shows the categories and labels)")
        return []
    numbers = [s.number for s in report.steps]
    inferred = {p.name for p in report.phases.values() if p.source == "inferred"}
    spans = [("step", f"step#{s.number}", s.start_event, s.end_event) for s in report.steps]
    spans += [("phase", f"{ph}{'?' * (ph in inferred)}#{numbers[s]}", a, b)
              for a, b, ph, s in report.label_runs() if ph != "other" and s >= 0]
    spans += [("shape", f"{p.kind}#{numbers[p.step]}", p.start_event, p.end_event) for p in report.patterns]
    added = []
    for what, name, a, b in spans:
        out.ranges[what] = out.ranges.get(what, 0) + 1
        for stage, e in (("START", a), ("END", b)):
            added.append({"name": LABEL_PREFIX + name, "stage": stage, "device": dev, "time_us": events[e]["time_us"]})
    return added


def _ensure_unknown(traces: list, out: Labels) -> None:
    """Give ``unknown`` to the first event phasemem does not label when no allocation got it (see UNKNOWN)."""
    names = {e["category"] for t in traces if isinstance(t, list) for e in t if "category" in e}
    if not names or UNKNOWN in names:
        return
    for t in traces:
        for k, e in enumerate(t if isinstance(t, list) else []):
            if "category" not in e and e.get("action") != "alloc":
                t[k] = {**e, "category": UNKNOWN}
                out.categories += 1
                return
    # Only allocations, none unknown: memory_viz would fail on the categories, so they are taken back.
    out.notes.append("no event was left to carry memory_viz's 'unknown' category: no categories were written")
    for dev, e in out.labelled:
        traces[dev][e] = {k: v for k, v in traces[dev][e].items() if k != "category"}
    out.categories = 0


def _plain(obj, converted: dict, memo: dict):
    """``obj`` with every value MemoryViz's unpickler cannot read written as the plain type it stands for
    (TorchVersion → str, OrderedDict → dict, set → list, bytes → str); containers are copied only on the
    path to such a value, and shared objects stay shared."""
    if type(obj) in _PLAIN:
        return obj
    key = id(obj)
    if key in memo:
        return memo[key]
    if type(obj) is dict:
        new = {k: _plain(v, converted, memo) for k, v in obj.items()}
        res = obj if all(new[k] is v for k, v in obj.items()) else new
    elif type(obj) in (list, tuple):
        items = [_plain(v, converted, memo) for v in obj]
        res = obj if all(a is b for a, b in zip(items, obj)) else type(obj)(items)
    else:
        res = _plainer(obj, converted, memo)
    memo[key] = res
    return res


def _plainer(obj, converted: dict, memo: dict):
    res: Any
    if isinstance(obj, str):
        res = str(obj)
    elif isinstance(obj, float):
        res = float(obj)
    elif isinstance(obj, dict):  # built here, not through _plain: a temporary's id may come back in the memo
        res = {k: _plain(v, converted, memo) for k, v in obj.items()}
    elif isinstance(obj, (set, frozenset)):
        res = [_plain(v, converted, memo) for v in sorted(obj, key=repr)]
    elif isinstance(obj, (bytes, bytearray)):
        res = bytes(obj).decode("latin-1")
    elif hasattr(obj, "__index__"):  # an int subclass, a numpy integer
        res = int(obj.__index__())
    else:
        raise PhasememError(f"the snapshot holds a {type(obj).__name__}, which memory_viz cannot read; "
                            "phasemem annotate reads torch's own snapshots only")
    name = type(obj).__name__
    converted[name] = converted.get(name, 0) + 1
    return res


def memoryviz_pickle(snapshot: dict) -> bytes:
    """The snapshot pickled as MemoryViz.js reads it: protocol 4 (it rejects 5), plain types only.

    Example:
        >>> memoryviz_pickle(labels.snapshot)[:2]
        b'\\x80\\x04'
    """
    return pickle.dumps(snapshot, protocol=MEMORYVIZ_PROTOCOL)


def summary(labels: Labels) -> str:
    """What was added, in a line or two, for the command's output.

    Example:
        >>> print(summary(annotate(snap, [report])))
        940 events given a category, 940 a phasemem label (user_metadata); 33 ranges in external_annotations ...
    """
    r = labels.ranges
    parts = [f"{labels.categories:,} events given a category, {labels.metadata:,} a phasemem label (user_metadata)",
             f"{sum(r.values()):,} ranges in external_annotations ({r.get('step', 0)} steps, "
             f"{r.get('phase', 0)} phase runs, {r.get('shape', 0)} shapes)"]
    if labels.converted:
        parts.append("written as plain types for memory_viz's unpickler: " + ", ".join(
            f"{n} {k}" for k, n in sorted(labels.converted.items())))
    return "; ".join(parts) + "".join(f"\nnote: {n}" for n in labels.notes)


__all__ = ["annotate", "memoryviz_pickle", "summary", "Labels", "LABEL_PREFIX", "UNKNOWN"]


class MemoryViz:
    """The snapshot with a report's labels, pickled for memory_viz (``phasemem annotate``); ``render``
    needs the ``snapshot`` the report was made from, and takes the reports of its other devices in
    ``others``."""

    name = "memory_viz"
    suffixes = (".pickle",)
    takes = (Report,)

    def render(self, report, snapshot: dict, others=()) -> bytes:
        return memoryviz_pickle(annotate(snapshot, [report, *others]).snapshot)

    def writer(self, report, path=None, **options) -> Writer:
        return writes(self.render(report, **options))
