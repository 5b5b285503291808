"""What the held-out tests share (tests/test_heldout5.py, 6, 7): a recording of fixtures/heldoutN read
as it was written, the same snapshot as a user would hand it over (the gt:: truth ranges and the
phasemem key removed; PyTorch's annotations and torch's stack frames kept), and both analysed."""
from __future__ import annotations

import copy
import lzma
import pickle
from pathlib import Path

import pytest

import phasemem


def recording(folder: Path, name: str) -> dict:
    """fixtures/<folder>/<name>.pkl.xz, or the test is skipped where it is missing."""
    path = folder / f"{name}.pkl.xz"
    if not path.exists():
        pytest.skip(f"{path} is missing")
    return pickle.loads(lzma.decompress(path.read_bytes()))


def as_handed_over(snap: dict) -> dict:
    """What the user's own recording holds: no gt:: ranges, no phasemem key."""
    s = copy.deepcopy(snap)
    s.pop("phasemem", None)
    s["external_annotations"] = [a for a in s.get("external_annotations") or [] if not a["name"].startswith("gt::")]
    return s


def bare(snap: dict) -> dict:
    """As handed over, and then with every annotation and every stack frame removed (the segments'
    blocks' too): what a recording without stacks holds, inferred from lifetimes alone."""
    s = as_handed_over(snap)
    s["external_annotations"] = []
    for e in s["device_traces"][0]:
        e["frames"] = []
    for seg in s.get("segments") or []:
        for b in seg.get("blocks") or []:
            b["frames"] = []
    return s


def marked_and_plain(snap: dict) -> list:
    """[("marked", the report with the gt:: ranges as markers), ("plain", the report as handed over)]."""
    return [("marked", phasemem.analyze(copy.deepcopy(snap), marker_prefix="gt::")),
            ("plain", phasemem.analyze(as_handed_over(snap)))]
