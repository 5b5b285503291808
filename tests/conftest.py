import copy
import lzma
import pickle
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "gpu-snapshots"
FIXTURES = ROOT / "fixtures"


def _load(path: Path) -> dict:
    obj = pickle.loads(lzma.decompress(path.read_bytes())) if path.suffix == ".xz" else pickle.loads(path.read_bytes())
    return obj.get("snapshot", obj)


def shared_paths():
    return sorted(SHARED.glob("*.pkl.xz"))


def fixture_paths():
    return sorted(FIXTURES.glob("*.pkl.xz"))


def prefix_of(path: Path) -> str:
    """The shared snapshots mark phases with gt::; ours say which markers they were recorded with."""
    if path.parent == SHARED:
        return "gt::"
    return load_snapshot(path).get("phasemem", {}).get("markers", "phasemem::")


_cache: dict = {}


def load_snapshot(path: Path) -> dict:
    """A fresh deep copy each call, so tests may mutate it."""
    if path not in _cache:
        _cache[path] = _load(path)
    return copy.deepcopy(_cache[path])


@pytest.fixture(params=shared_paths() or [None], ids=lambda p: p.stem if p else "missing")
def shared_snapshot(request):
    if request.param is None:
        pytest.skip(f"no real GPU snapshots at {SHARED}")
    return request.param, load_snapshot(request.param)


@pytest.fixture(params=shared_paths() + fixture_paths(), ids=lambda p: f"{p.parent.name}/{p.name.split('.')[0]}")
def real_snapshot(request):
    """Every real H200 snapshot: the shared ones and our recorded fixtures, with their marker prefix."""
    return request.param, load_snapshot(request.param), prefix_of(request.param)
