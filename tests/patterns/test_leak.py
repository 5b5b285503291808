"""Leaks: a tensor each step keeps that a later step repeats, of its size, and nowhere else (not a
request's growth, not the loop's last tensors).

Truth from the raw snapshot (its gt:: and Optimizer.step ranges, the stacks of its allocations) and
the recording's meta (the model's own byte counts), never from phasemem. The held-out recordings
(fixtures/heldoutN, fixtures/record_heldoutN.py) are analysed twice: with the gt:: ranges as markers,
and as a user would hand them over (helpers.analyses.marked_and_plain); the ../shared/wild ones as
published (helpers.wild).
"""
from __future__ import annotations

import pytest

import phasemem
from helpers.analyses import marked_and_plain
from helpers.paths import ROOT, shared_paths
from helpers.raw import in_gt_range
from helpers.snapshots import heldout, load_snapshot


def test_knocking_out_the_leak_detector_is_caught(knock_out):
    """Without the leak detector's output the test above fails (the pattern truth has no leak to meet:
    patterns/test_pattern_truth.py knocks out the others)."""
    knock_out("leak")
    with pytest.raises(AssertionError):
        test_leak_found_where_frees_were_removed_and_nowhere_else_shared()


def test_leak_found_where_frees_were_removed_and_nowhere_else_shared():
    """Replicate a real trace's steady steps, then drop the frees of one forward tensor in some steps
    (a tensor kept across steps, as a loss accumulated without .item() keeps its graph)."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_analyze import replicate_steps

    paths = [p for p in shared_paths() if p.name.startswith("gpt_adamw_foreach")]
    if not paths:
        pytest.skip("no real GPU snapshots")
    snap = replicate_steps(load_snapshot(paths[0]), 4)  # step 0, 4 copies of steps 1-2, ...
    clean = phasemem.analyze(snap, marker_prefix="gt::")
    assert clean.patterns_of("leak") == []
    events = snap["device_traces"][0]
    leaked = {}
    for st in clean.steps[2:-2]:  # middle steps whose addresses are their own
        fwd = st.phases["forward"]
        # the first allocation of this forward that forward itself frees again
        life = clean.analysis.timeline.lifetimes
        pick = [(a, f) for a, f in zip(life.alloc_event.tolist(), life.free_event.tolist())
                if fwd.start_event <= a <= fwd.end_event and f <= fwd.end_event]
        a, f = pick[0]
        leaked[st.index] = events[a]["size"]
        addr = events[a]["addr"]
        for i in range(a + 1, f + 1):
            if events[i]["addr"] == addr and events[i]["action"] in ("free_requested", "free_completed"):
                events[i]["action"] = "snapshot"  # an entry that changes nothing: the free is gone
        # A block never freed is never handed out again: give it an address of its own.
        events[a]["addr"] = (1 << 50) + st.index * 4096
    report = phasemem.analyze(snap, marker_prefix="gt::")
    found = {p.step: p.bytes for p in report.patterns_of("leak")}
    assert found == leaked
    assert all(p.phase == "forward" for p in report.patterns_of("leak"))


@pytest.mark.parametrize("name", ["h5_wgan_gp", "h5_two_losses"])
def test_no_leak_and_no_accumulation_where_there_is_none(name):
    """WGAN-GP: the generator's Adam makes its state in its own first step and the loop's last
    tensors stay referenced: two steps keep different tensors, no leak. Its gradient penalty
    (autograd.grad) and two_losses' second backward on one forward are no micro-batches."""
    for how, r in marked_and_plain(name):
        assert r.patterns_of("leak") == [], how
        assert r.patterns_of("gradient_accumulation") == [], how


def test_kept_logits_are_a_leak_of_their_size():
    snap = heldout("h6_kept_logits")
    meta = snap["phasemem"]["meta"]
    logits = meta["batch"] * meta["seq"] * meta["vocab"] * 4
    for how, r in marked_and_plain("h6_kept_logits"):
        assert len(r.steps) == meta["nsteps"], how
        leaks = r.patterns_of("leak")
        assert leaks and all(p.bytes == logits for p in leaks), how


def test_inference_that_keeps_outputs_is_a_leak_only_where_requests_are_marked():
    """Forward-only without markers is one step, and a step's growth is no leak; with the gt::step
    ranges, every request leaves one tensor of the kept states' size."""
    snap = heldout("h7_decode_keeps_outputs")
    meta = snap["phasemem"]["meta"]
    kept = meta["batch"] * (meta["seq"] + 16) * 768 * 4  # batch x (prompt + 16 new) x width, fp32
    marked, plain = (r for _, r in marked_and_plain("h7_decode_keeps_outputs"))
    assert [p.bytes for p in marked.patterns_of("leak")] and all(p.bytes == kept for p in marked.patterns_of("leak"))
    assert not plain.patterns_of("leak") and len(plain.steps) == 1


def test_the_validation_graphs_kept_every_step_are_a_leak_of_their_size():
    """A validation forward with grad enabled whose loss is kept: its graph's saved tensors stay.
    The leak is the bytes each gt::eval range allocated and never freed (from the raw trace)."""
    snap = heldout("h13_eval_graph_leak")
    ev = snap["device_traces"][0]
    in_eval = in_gt_range(snap, "eval0")
    kept = sum(e["size"] for i, e in enumerate(ev) if e["action"] == "alloc" and in_eval[i] and not any(
        f["action"] == "free_completed" and f["addr"] == e["addr"] for f in ev[i + 1:]))
    assert kept > 1 << 30
    for how, r in marked_and_plain("h13_eval_graph_leak"):
        leaks = [p for p in r.patterns if p.kind == "leak"]
        assert leaks, how
        assert leaks[0].bytes == kept, how
        assert in_eval[leaks[0].start_event] and in_eval[leaks[0].end_event], how
