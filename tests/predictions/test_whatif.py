"""The peak decomposed, the what-ifs, and the OOM post-mortem (issue 15), on real H200 traces.

Expected values come from the raw snapshots (tests/helpers/reference.py's naive replay) and from what the
recorded programs measured themselves (``torch.cuda.max_memory_allocated``, in each run's JSON).
"""
import json
from pathlib import Path

import numpy as np
import pytest

import phasemem
from helpers.analyses import analyzed
from helpers.paths import FIXTURES
from helpers.reference import replay as naive_replay
from helpers.snapshots import load_snapshot
from phasemem.predictions.remedies import REMEDIES, SCALINGS
from phasemem.predictions.replay import Replayed, changed_points, points, replay

PAIRS = FIXTURES / "pairs"
OOM = FIXTURES / "oom"
ALL = sorted(FIXTURES.rglob("*.pkl.xz"))

# Which real run applies each remedy to fixtures/pairs/base (fixtures/record_pairs.py).
REAL_RUN = {"fused_optimizer": "fused", "chunked_cross_entropy": "chunked_ce", "activation_checkpointing": "ckpt",
            "batch_x0.5": "half_batch", "zero_grad_before_forward": "zero_grad_before", "bf16_logits": "bf16_logits"}
#: The target of issue 15: each prediction within 5 % of the peak the real run measured.
WITHIN = 0.05


def _meta(path: Path) -> dict:
    return json.loads(path.with_name(path.name.replace(".pkl.xz", ".json")).read_text())


@pytest.mark.parametrize("path", ALL, ids=lambda p: f"{p.parent.name}/{p.name.split('.')[0]}")
def test_peak_decomposition_sums_to_the_raw_traces_peak(path):
    snap = load_snapshot(path)
    report = analyzed(path, "file")
    if report.live is not None or report.peak is None:
        pytest.skip("no allocation history")
    dev = report.analysis.trace.device
    pre, after, deltas = naive_replay(snap["device_traces"][dev], snap.get("segments", []), dev)
    levels = [max(a, a - d) for a, d in zip(after, deltas)]
    b = report.peak
    assert b.bytes == max(levels) == report.peak_bytes
    assert sum(b.by_category.values()) == b.bytes
    assert sum(b.by_shape.values()) + sum(b.rest_by_category.values()) == b.bytes
    assert all(v > 0 for v in b.by_shape.values())


@pytest.mark.parametrize("path", ALL[:12], ids=lambda p: p.name.split(".")[0])
def test_replay_without_a_change_is_the_memory_curve(path):
    report = analyzed(path, "file")
    life = report.analysis.timeline.lifetimes
    assert np.array_equal(replay(report.n_events, life.alloc_event, life.free_event, life.size), report.analysis.timeline.level)


@pytest.mark.parametrize("share", [0.001, 0.05, 0.5])  # below and above replay.SPARSE_SHARE
@pytest.mark.parametrize("path", ALL[:6], ids=lambda p: p.name.split(".")[0])
def test_a_change_replayed_on_the_base_is_the_change_summed_again(path, share):
    report = analyzed(path, "file")
    life, n = report.analysis.timeline.lifetimes, report.n_events
    rng = np.random.default_rng(len(life.size))
    touched = rng.random(len(life.size)) < share
    size, free = life.size.copy(), life.free_event.copy()
    size[touched] //= 3
    later = touched & (rng.random(len(size)) < 0.5)
    free[later] = np.minimum(free[later] + rng.integers(0, 50, int(later.sum())), n)
    free = np.maximum(free, life.alloc_event + 1)
    added = (np.array([0, n // 2]), np.array([n // 3, n]), np.array([1 << 20, 3 << 20]))
    want = replay(n, np.concatenate([life.alloc_event, added[0]]), np.concatenate([free, added[1]]),
                  np.concatenate([size, added[2]]))
    base_pts = points(n, life.alloc_event, life.free_event, life.size)
    pts = changed_points(base_pts, life.alloc_event, life.free_event, life.size, free, size, added)
    assert np.array_equal(np.maximum(pts[:-1], pts[1:]), want)
    # the timeline's own curve as the base (what whatif.replays gives, no copy): the same points
    tl = report.analysis.timeline
    assert np.array_equal(base_pts, np.concatenate([[tl.baseline], tl.active_after]))
    on_timeline = changed_points((tl.baseline, tl.active_after), life.alloc_event, life.free_event, life.size,
                                 free, size, added)
    assert np.array_equal(on_timeline, pts)
    # what the report keeps of it, read from the points, is what the level itself gives
    runs = report.analysis.facts.run_first
    ooms = [0, n // 2, n - 1]
    a, b = Replayed.of(want, runs, ooms, "", []), Replayed.of_points(pts, runs, ooms, "", [])
    assert (a.peak_event, a.peak_bytes, a.at_events) == (b.peak_event, b.peak_bytes, b.at_events)
    assert np.array_equal(a.run_peaks, b.run_peaks)


@pytest.fixture(scope="module")
def base():
    if not (PAIRS / "base.pkl.xz").exists():
        pytest.skip("fixtures/pairs not recorded")
    return analyzed(PAIRS / "base.pkl.xz", "file")


@pytest.mark.parametrize("remedy", sorted(REAL_RUN))
def test_prediction_from_the_base_trace_matches_the_real_run(base, remedy):
    w = {x.remedy: x for x in base.what_if}[remedy]
    real = PAIRS / f"{REAL_RUN[remedy]}.pkl.xz"
    measured = _meta(real)["peak_allocated"]  # torch.cuda.max_memory_allocated over the run
    assert w.applies, w.explanation
    assert abs(w.predicted_peak_bytes - measured) <= WITHIN * measured
    assert w.saves_bytes == base.peak_bytes - w.predicted_peak_bytes
    assert sum(1 for _ in w.predicted_phase_peaks) >= 4  # every phase that ran gets its predicted peak


def test_what_if_lists_every_remedy_ranked_and_the_rest_say_why(base):
    assert {w.remedy for w in base.what_if} == set(REMEDIES) | set(SCALINGS)
    saves = [w.saves_bytes for w in base.what_if if w.applies]
    assert saves == sorted(saves, reverse=True)
    for w in base.what_if:
        assert w.applies or (w.predicted_peak_bytes is None and w.explanation)


@pytest.mark.parametrize("run,remedy", [("fused", "fused_optimizer"), ("ckpt", "activation_checkpointing"),
                                        ("zero_grad_before", "zero_grad_before_forward"),
                                        ("bf16_logits", "bf16_logits"), ("chunked_ce", "chunked_cross_entropy")])
def test_a_remedy_already_applied_does_not_apply(run, remedy):
    path = PAIRS / f"{run}.pkl.xz"
    if not path.exists():
        pytest.skip("fixtures/pairs not recorded")
    w = {x.remedy: x for x in analyzed(path, "file").what_if}[remedy]
    assert not w.applies and w.saves_bytes is None


def test_oom_post_mortem_names_the_request_and_a_fix_that_really_fit():
    path = OOM / "oom_base.pkl.xz"
    if not path.exists():
        pytest.skip("fixtures/oom not recorded")
    snap = load_snapshot(path)
    report = phasemem.analyze(snap)
    (o,) = report.ooms
    raw = [e for e in snap["device_traces"][0] if e["action"] == "oom"]
    assert o.requested_bytes == raw[0]["size"]
    # what the recorded program measured: the fix ran for real under the same cap and fitted
    assert _meta(OOM / "oom_fix_chunked_ce.pkl.xz")["oom"] is False
    assert "chunked_cross_entropy" in o.would_fit and o.would_fit["chunked_cross_entropy"] > 0
    # checkpointing ran out of memory for real (in backward): nothing may say it fits this one
    assert _meta(OOM / "oom_fix_ckpt.pkl.xz")["oom"] is True
    assert "activation_checkpointing" not in o.would_fit
    assert o.upcast_of is not None and 2 * o.upcast_of == o.requested_bytes
    assert o.reserved_bytes >= o.allocated_bytes
    text = str(report)
    assert text.startswith("OUT OF MEMORY") and "chunked_cross_entropy" in text.splitlines()[2]
    assert "what_if" in report.to_dict() and report.to_dict()["ooms"][0]["would_fit"]


def test_json_carries_peak_and_what_if(base):
    d = base.to_dict()
    assert sum(d["peak"]["by_category"].values()) == d["peak_bytes"]
    assert [w["remedy"] for w in d["what_if"]] == [w.remedy for w in base.what_if]
    assert all("members" not in p for p in d["patterns"])


SHARED = FIXTURES.parent.parent / "shared"
_shared = sorted((SHARED / "wild").glob("*.pickle")) + sorted((SHARED / "gpu-snapshots").glob("*.pkl.xz"))


@pytest.mark.parametrize("path", _shared or [None], ids=lambda p: p.name.split(".")[0] if p else "missing")
def test_peak_decomposition_sums_exactly_on_the_shared_traces_shared(path):
    if path is None:
        pytest.skip(f"no ../shared beside the repository ({SHARED})")
    try:
        report = analyzed(path, "file")
    except phasemem.PhasememError as e:
        assert "empty" in str(e)  # an empty snapshot (hitsbe_mysnap) is refused, with one line
        return
    if report.peak is None:
        assert report.live is not None  # only a snapshot without history has no peak to decompose
        return
    b = report.peak
    assert sum(b.by_category.values()) == b.bytes == report.peak_bytes
    assert sum(b.by_shape.values()) + sum(b.rest_by_category.values()) == b.bytes


# fixtures/oom's 2B loops also ran uncapped (meta "uncapped": their max_memory_allocated): batch x 2 of
# fixtures/pairs/base, alone and with the remedy that the OOM post-mortem names.
UNCAPPED = {"oom_base": ({}, "batch x2"), "oom_fix_chunked_ce": ({"chunked_cross_entropy": {"chunks": 4}}, "+ chunked"),
            "oom_fix_ckpt": ({"activation_checkpointing": {"every": 1}}, "+ checkpointing")}


@pytest.mark.parametrize("run", sorted(UNCAPPED))
def test_batch_x2_predicted_from_the_base_matches_the_uncapped_2b_run(base, run):
    from phasemem.predictions.fits import predict

    path = OOM / f"{run}.json"
    if not path.exists():
        pytest.skip("fixtures/oom not recorded")
    measured = json.loads(path.read_text())["uncapped"]["peak_allocated"]
    got = predict(base.analysis, base.patterns, UNCAPPED[run][0], batch=2)
    assert abs(got - measured) <= WITHIN * measured
    if not UNCAPPED[run][0]:
        assert got == {w.remedy: w for w in base.what_if}["batch_x2"].predicted_peak_bytes


@pytest.mark.parametrize("path", [PAIRS / "base.pkl.xz", OOM / "oom_base.pkl.xz"], ids=lambda p: p.name.split(".")[0])
def test_without_what_ifs_the_report_is_the_same_but_its_what_if_list(path):
    """``phasemem diff`` reads no what-if: it analyses without them, and an out-of-memory's
    would_fit (which the replays give) is still there."""
    if not path.exists():
        pytest.skip("fixture not recorded")
    full, lean = analyzed(path, "file").to_dict(), analyzed(path, "file", what_ifs=False).to_dict()
    assert full["what_if"] and lean["what_if"] == []
    assert {k: v for k, v in lean.items() if k != "what_if"} == {k: v for k, v in full.items() if k != "what_if"}
    assert all(o["would_fit"] for o in lean["ooms"]) and (path.parent != OOM or lean["ooms"])
    c = phasemem.compare(str(path), str(path))
    assert c.a_report.what_if == [] and c.delta == 0
