"""A recording read as it was written, and the forms the tests analyse it in: as a user would hand it
over (the gt:: truth ranges and the phasemem key removed; PyTorch's annotations and the stack frames
kept) and bare (every annotation and stack frame removed: lifetimes alone)."""
from __future__ import annotations

import copy
import lzma
import pickle
from pathlib import Path

import pytest

from helpers.paths import SHARED, heldout_path


def _unpickle(path: Path, data: bytes):
    """pickle.loads, or the test skipped where the file names a torch class and torch is missing
    (../shared/gpu-snapshots' meta holds a TorchVersion; phasemem's own readers need no torch)."""
    try:
        return pickle.loads(data)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "torch":
            raise
        pytest.skip(f"{path} is read with pickle here, which needs torch for it: {e}")


def read(path: Path) -> dict:
    """The snapshot of ``path`` read fresh (unwrapped from ../shared's {"snapshot", "meta"})."""
    path = Path(path)
    obj = _unpickle(path, lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes())
    return obj.get("snapshot", obj)


_loaded: dict = {}


def load_snapshot(path: Path) -> dict:
    """The snapshot of ``path`` (unwrapped from ../shared's {"snapshot", "meta"}), read once a session;
    a fresh deep copy each call, so tests may mutate it."""
    path = Path(path)
    if path not in _loaded:
        _loaded[path] = read(path)
    return copy.deepcopy(_loaded[path])


def prefix_of(path: Path) -> str:
    """The shared snapshots mark phases with gt::; ours say which markers they were recorded with."""
    if Path(path).parent == SHARED:
        return "gt::"
    return load_snapshot(path).get("phasemem", {}).get("markers", "phasemem::")


def recording(folder: Path, name: str) -> dict:
    """fixtures/<folder>/<name>.pkl.xz read fresh, or the test is skipped where it is missing."""
    path = Path(folder) / f"{name}.pkl.xz"
    if not path.exists():
        pytest.skip(f"{path} is missing")
    return _unpickle(path, lzma.decompress(path.read_bytes()))


def heldout(name: str) -> dict:
    """A held-out recording by its name (``h9_ppo``: fixtures/heldout9/h9_ppo.pkl.xz), read fresh."""
    path = heldout_path(name)
    return recording(path.parent, name)


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


def without_frames(snap: dict) -> dict:
    """``snap`` with every stack frame removed, the events' and the segments' and blocks' (in place; returned)."""
    for t in snap["device_traces"]:
        for e in t:
            e["frames"] = []
    for seg in snap.get("segments") or []:
        seg["frames"] = []
        for b in seg.get("blocks") or []:
            b["frames"] = []
    return snap
