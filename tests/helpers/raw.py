"""What a recording says of itself, read off the raw snapshot without phasemem: its annotation
ranges (gt:: and torch's Optimizer.step), the steps they end, the blocks a recording script's line
made, and the meta the recording script wrote."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np


def times(snap: dict) -> np.ndarray:
    return np.array([e["time_us"] for e in snap["device_traces"][0]])


def param_bytes(snap: dict) -> int:
    """The model's parameter bytes, as the recording script counted them."""
    return snap["phasemem"]["meta"]["param_bytes"]


def optimizer_ends(snap: dict) -> list[int]:
    """One past the last event of each Optimizer.step range (torch's own annotation)."""
    t = times(snap)
    ends = sorted(a["time_us"] for a in snap["external_annotations"]
                  if a["name"].startswith("Optimizer.step#") and a["stage"] == "END")
    return [int(np.searchsorted(t, x, "right")) for x in ends]


def annotation_ranges(snap: dict, match) -> list[tuple[int, int]]:
    """(START, END) times of the annotation ranges whose name ``match`` accepts, in start order."""
    open_, out = {}, []
    for a in snap.get("external_annotations") or []:
        if not match(a["name"]):
            continue
        if a["stage"] == "START":
            open_.setdefault(a["name"], []).append(a["time_us"])
        elif open_.get(a["name"]):
            out.append((open_[a["name"]].pop(), a["time_us"]))
    return sorted(out)


def true_step_ends(snap: dict) -> list[int]:
    """Per gt::stepN range, one past the last event of the last Optimizer.step range inside it."""
    t = times(snap)
    steps = annotation_ranges(snap, lambda n: n.startswith("gt::step"))
    opts = annotation_ranges(snap, lambda n: n.startswith("Optimizer.step#"))
    ends = []
    for s0, s1 in steps:
        inside = [o1 for o0, o1 in opts if s0 <= o0 and o1 <= s1]
        ends.append(int(np.searchsorted(t, max(inside), "right")))
    return ends


def event_ranges(snap: dict, pattern: str) -> list[tuple[int, int]]:
    """(first event, one past the last) of each gt:: range whose name matches, in time order."""
    t, open_, out = times(snap), {}, []
    for a in snap["external_annotations"]:
        if not re.fullmatch(pattern, a["name"]):
            continue
        if a["stage"] == "START":
            open_.setdefault(a["name"], []).append(a["time_us"])
        else:
            t0 = open_[a["name"]].pop()
            out.append((int(np.searchsorted(t, t0, "left")), int(np.searchsorted(t, a["time_us"], "right"))))
    return sorted(out)


def in_gt_range(snap: dict, name: str) -> np.ndarray:
    """Per event: inside a gt::<name> range (by the events' and the ranges' times)."""
    marks = sorted((a["time_us"], a["stage"]) for a in snap["external_annotations"] if a["name"] == "gt::" + name)
    starts = [t for t, st in marks if st == "START"]
    ends = [t for t, st in marks if st == "END"]
    times_ = times(snap)
    inside = np.zeros(len(times_), bool)
    for a, b in zip(starts, ends):
        inside |= (times_ >= a) & (times_ <= b)
    return inside


def line_of(script: Path, function: str, text: str) -> int:
    """The line of ``text`` inside ``def function`` of a recording script."""
    lines = Path(script).read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith(f"def {function}("))
    return next(i for i in range(start, len(lines)) if text in lines[i]) + 1


def made_at(snap: dict, script: Path, function: str, line: int) -> set[int]:
    """Alloc events whose innermost Python frame is ``function`` at ``line`` of the recording script."""
    out = set()
    for i, e in enumerate(snap["device_traces"][0]):
        if e["action"] != "alloc":
            continue
        py = [f for f in e.get("frames") or [] if f["filename"].endswith(".py")]
        if py and py[0]["filename"].endswith(Path(script).name) and py[0]["name"] == function and py[0]["line"] == line:
            out.add(i)
    return out


def close(a, b, tol=0.02) -> bool:
    """``a`` within ``tol`` of ``b`` (the recording scripts count bytes a block rounds up)."""
    return abs(a - b) <= tol * b
