"""Fixtures every folder may ask for. Helpers are plain modules under tests/helpers/, imported by name
(``from helpers.analyses import analyzed``): pyproject.toml's ``pythonpath`` puts tests/ on ``sys.path``.
Nothing is read at collection: tests are parametrized over paths, and a recording is read (once a
session) by the first test that needs it."""
import importlib
import lzma
import pickle
from pathlib import Path

import pytest

from helpers.analyses import analyzed, fresh_analyses
from helpers.modules import have
from helpers.paths import SHARED, fixture_paths, path_id, shared_paths
from helpers.snapshots import load_snapshot, prefix_of


def pytest_collection_modifyitems(items):
    """Without torch, a test over a ../shared/gpu-snapshots file skips: the tests read those files with
    pickle, and their meta holds a TorchVersion (phasemem's own readers need no torch)."""
    if have("torch"):
        return
    skip = pytest.mark.skip(reason=f"no torch: the tests read {SHARED}'s files with pickle, and their meta "
                                   "holds a TorchVersion")
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {}).values()
        if any(isinstance(v, Path) and v.parent == SHARED for v in params):
            item.add_marker(skip)


@pytest.fixture(params=shared_paths() or [None], ids=lambda p: p.stem if p else "missing")
def shared_snapshot(request):
    if request.param is None:
        pytest.skip(f"no real GPU snapshots at {SHARED}")
    return request.param, load_snapshot(request.param)


@pytest.fixture(params=shared_paths() + fixture_paths(), ids=path_id)
def real_snapshot(request):
    """Every real H200 snapshot: the shared ones and our recorded fixtures, with their marker prefix."""
    return request.param, load_snapshot(request.param), prefix_of(request.param)


# From the recording README: model dimensions and training set-up of each shared snapshot.
KNOWN = {
    "gpt_adamw_foreach": dict(logits=4 * 1024 * 50304 * 4, layers=6, ckpt=False, fused=False),
    "gpt_ckpt_fused_seedlike": dict(logits=4 * 1024 * 151936 * 2, layers=8, ckpt=True, fused=True),
    "mlp_fp16_scaler": dict(logits=None, layers=8, ckpt=False, fused=False),
}


@pytest.fixture(params=shared_paths() or [None], ids=lambda p: p.name.split(".")[0] if p else "missing")
def shared_without_frames(request):
    """Each ../shared snapshot analysed with its gt:: markers and every stack frame removed: (the report,
    the file's meta, KNOWN's dimensions)."""
    if request.param is None:
        pytest.skip("no real GPU snapshots")
    path = request.param
    meta = pickle.loads(lzma.decompress(path.read_bytes()))["meta"]
    return analyzed(path, "no_frames", marker_prefix="gt::"), meta, KNOWN[path.name.split(".")[0]]


@pytest.fixture
def knock_out(monkeypatch):
    """``knock_out(kind)``: the analysis without that detector's output, on analyses of this test's own
    (the session's cached reports are neither read nor written while it runs)."""
    analyze_module = importlib.import_module("phasemem.report.pipeline")
    real = analyze_module.detect_patterns

    def knock(kind: str) -> None:
        monkeypatch.setattr(analyze_module, "detect_patterns", lambda ctx: [p for p in real(ctx) if p.kind != kind])

    with fresh_analyses():
        yield knock
