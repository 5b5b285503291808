"""The categories add up to the memory curve at every event, and parameters, gradients and optimizer
state are the bytes of the model each recording built (its meta; ../shared's README).
"""
from __future__ import annotations

import numpy as np
import pytest

import phasemem
from helpers.raw import close
from helpers.snapshots import load_snapshot


def test_categories_sum_to_the_curve_and_match_the_model_shared(shared_without_frames):
    report, meta, _ = shared_without_frames
    tl = report.analysis.timeline
    every = report.analysis.categories.at_level(np.arange(report.n_events), tl)
    assert (every.sum(axis=1) == tl.level).all()
    cats = report.categories()
    assert close(cats["parameter"], meta["param_bytes"])
    assert close(report.phases["optimizer"].by_category["optimizer_state"], 2 * meta["param_bytes"])
    # During the optimizer step the gradients are all alive.
    assert close(report.phases["optimizer"].by_category["gradient"], meta["param_bytes"])
    assert sum(cats.values()) == report.peak_bytes


def test_categories_at_a_few_points_equal_the_curves_over_every_event_shared(shared_without_frames):
    """CategoryCurves.at sorts the blocks between the asked points (few points) or sums every event
    per category (many): both paths give the same bytes."""
    report, _, _ = shared_without_frames
    cc = report.analysis.categories
    pts = np.random.default_rng(0).integers(0, report.n_events + 1, 300)
    assert np.array_equal(cc.at(pts), cc.at(np.arange(report.n_events + 1))[pts])
    assert np.array_equal(cc.at(pts), cc._at_by_cumsum(pts))


def _fixture_metas():
    from helpers.paths import fixture_paths

    # wrapped: part of the run is gone; inference: nothing to pair parameters with; cudagraph: the
    # graph's static buffers (gradients included) exist before recording and never show as such
    skip = ("wrapped", "inference", "cudagraph")
    return [p for p in fixture_paths() if not any(s in p.name for s in skip)]


@pytest.mark.parametrize("path", _fixture_metas(), ids=lambda p: p.name.split(".")[0])
def test_categories_match_each_recorded_model(path):
    """Parameters, gradients and optimizer state against the model the recording script built
    (fixtures/record.py counts the parameter bytes), frames removed. gpt_compiled was recorded
    after a warm-up step, so its Adam state existed before recording and is found by size."""
    snap = load_snapshot(path)
    meta = snap["phasemem"]["meta"]
    for e in snap["device_traces"][0]:
        e["frames"] = []
    report = phasemem.analyze(snap)
    p = meta["param_bytes"]
    every = report.analysis.categories.at_level(np.arange(report.n_events), report.analysis.timeline)
    assert close(report.categories()["parameter"], p)
    assert close(int(every[:, 1].max()), p)  # gradients, where alive
    name = meta["optimizer"]
    mult = 2 if "Adam" in name else (1 if "momentum" in name else 0)
    assert close(int(every[-1, 2]), mult * p) if mult else int(every[-1, 2]) == 0
