"""Fixtures every folder may ask for. Helpers are plain modules under tests/helpers/, imported by name
(``from helpers.analyses import analyzed``): pytest puts tests/ on ``sys.path`` for this file, so they
are found from every folder. Nothing is read at collection: tests are parametrized over paths, and a
recording is read (once a session) by the first test that needs it."""
import importlib

import pytest

from helpers.analyses import fresh_analyses
from helpers.paths import SHARED, fixture_paths, path_id, shared_paths
from helpers.snapshots import load_snapshot, prefix_of


@pytest.fixture(params=shared_paths() or [None], ids=lambda p: p.stem if p else "missing")
def shared_snapshot(request):
    if request.param is None:
        pytest.skip(f"no real GPU snapshots at {SHARED}")
    return request.param, load_snapshot(request.param)


@pytest.fixture(params=shared_paths() + fixture_paths(), ids=path_id)
def real_snapshot(request):
    """Every real H200 snapshot: the shared ones and our recorded fixtures, with their marker prefix."""
    return request.param, load_snapshot(request.param), prefix_of(request.param)


@pytest.fixture
def knock_out(monkeypatch):
    """``knock_out(kind)``: the analysis without that detector's output, on analyses of this test's own
    (the session's cached reports are neither read nor written while it runs)."""
    analyze_module = importlib.import_module("phasemem.analyze")
    real = analyze_module.detect_patterns

    def knock(kind: str) -> None:
        monkeypatch.setattr(analyze_module, "detect_patterns", lambda ctx: [p for p in real(ctx) if p.kind != kind])

    with fresh_analyses():
        yield knock
