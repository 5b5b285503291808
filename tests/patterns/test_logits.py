"""The LM shapes (logits, softmax_spike, logits_release): claimed with the sizes and words the model's
dimensions give, and only where a language model's loss ran.

Truth from the raw snapshot (its gt:: and Optimizer.step ranges, the stacks of its allocations) and
the recording's meta (the model's own byte counts), never from phasemem. The held-out recordings
(fixtures/heldoutN, fixtures/record_heldoutN.py) are analysed twice: with the gt:: ranges as markers,
and as a user would hand them over (helpers.analyses.marked_and_plain); the ../shared/wild ones as
published (helpers.wild).
"""
from __future__ import annotations

import copy
import pickle

import pytest

import phasemem
from helpers.analyses import marked_and_plain
from helpers.raw import optimizer_ends
from helpers.snapshots import as_handed_over, heldout
from helpers.wild import LM_SHAPES, PROGRAMS, wild_path, wild_report


def test_logits_only_with_an_lm_head_shared(shared_without_frames):
    report, _, known = shared_without_frames
    logits = report.patterns_of("logits")
    if known["logits"] is None:
        assert logits == [] and report.patterns_of("softmax_spike") == []
        return
    assert [p.step for p in logits] == list(range(len(report.steps)))
    assert all(p.bytes == known["logits"] for p in logits)
    for p in logits:
        assert 0 < p.details["vocab_share_of_peak"] <= 1
        assert report.analysis.labels[p.start_event] == 1  # made in forward
    # The spike sits on the logits and sets the forward's peak; the release opens backward.
    for spike, st in zip(report.patterns_of("softmax_spike"), report.steps):
        assert spike.peak_event == st.phases["forward"].peak_event
    for rel, st in zip(report.patterns_of("logits_release"), report.steps):
        assert rel.start_event == st.phases["backward"].start_event
        assert rel.bytes >= known["logits"]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_language_model_shapes_only_where_a_cross_entropy_ran(name):
    r, truth = wild_report(name), PROGRAMS[name]
    kinds = {p.kind for p in r.patterns}
    if not truth["ce"]:
        assert not kinds & LM_SHAPES, [p.kind for p in r.patterns]
    if truth.get("logits"):
        assert [p.bytes for p in r.patterns_of("logits")] == [truth["logits"]]


def test_logits_held_to_the_dump_are_not_said_to_be_freed():
    """magma27_cs336 dumps its snapshot inside the loop, while `lm_head` still holds the recorded step's
    logits: the trace never frees them. The logits' release said they were held "until event 5162", a
    free the trace does not show; it names the recording's end as such."""
    path = wild_path("magma27_cs336")
    with open(path, "rb") as f:
        events = pickle.load(f)["device_traces"][0]
    report = wild_report("magma27_cs336")
    (logits,) = [p for p in report.patterns if p.kind == "logits"]
    addr = events[logits.start_event]["addr"]  # the logits' block, its alloc from the raw trace
    assert events[logits.start_event]["action"] == "alloc"
    assert not any(e["addr"] == addr and e["action"].startswith("free") for e in events[logits.start_event + 1:])
    (release,) = [p for p in report.patterns if p.kind == "logits_release"]
    assert f"to the end of the recording (event {len(events) - 1}; the trace never frees them)" in release.explanation
    assert "until event" not in release.explanation


def test_attention_scores_are_not_logits():
    """Written-out attention: (B, H, T, T) scores of 512 MiB per layer; a vocabulary of 256."""
    snap = heldout("h9_char_gpt_math_attention")
    meta = snap["phasemem"]["meta"]
    logits = meta["batch"] * meta["seq"] * meta["vocab"] * 4
    for how, r in marked_and_plain("h9_char_gpt_math_attention"):
        assert [s.end_event + 1 for s in r.steps] == optimizer_ends(snap), how
        for kind in ("logits", "softmax_spike", "logits_release"):
            assert all(p.bytes <= 4 * logits for p in r.patterns_of(kind)), (how, kind)
        assert r.by_category["parameter"] == meta["param_bytes"], how


def test_contrastive_scores_are_no_lm_head_output():
    """MoCo's (256, 1 + 65536) scores are computed in the loop, outside any module."""
    snap = heldout("h10_moco_queue")
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain("h10_moco_queue"):
        logits = r.patterns_of("logits")
        assert logits and all(p.bytes <= meta["logits_bytes"] for p in logits), how
        assert all("LM head" not in p.explanation and "outside any module" in p.explanation for p in logits), how
        assert r.by_category["parameter"] == meta["param_bytes"], how


def _free_of(snap: dict, event: int) -> int:
    """The event that frees the block allocated at ``event`` (from the raw trace)."""
    tr = snap["device_traces"][0]
    addr = tr[event]["addr"]
    return next(k for k in range(event + 1, len(tr)) if tr[k]["addr"] == addr and tr[k]["action"] == "free_completed")


def test_logits_are_not_cudnns_workspace_and_the_loop_holds_them():
    """cuDNN's LSTM makes a 124 MB workspace in forward before the 82 MB logits: it was "the LM head's
    output" and the spike's partner. The loop keeps `logits` to the end of the step, so backward's
    release does not free them, which the report used to say it did."""
    snap = heldout("h11_tbptt_lstm")
    meta = snap["phasemem"]["meta"]
    logits_bytes = meta["batch"] * meta["seq"] * meta["vocab"] * 4
    for how, r in marked_and_plain("h11_tbptt_lstm"):
        first = [p for p in r.patterns_of("logits") if p.step == 0]
        assert [p.bytes for p in first] == [logits_bytes], how
        assert "among the largest tensors" in first[0].explanation, how
        release = [p for p in r.patterns_of("logits_release") if p.step == 0]
        freed = _free_of(snap, first[0].start_event)
        assert release and freed > release[0].end_event, how
        assert f"until event {freed}" in release[0].explanation and "stay" in release[0].explanation, how


def test_segmentation_scores_are_logits_but_no_lm_head_and_no_vocabulary():
    """The FCN's per-pixel class scores (F.interpolate's output) have the logits' shape in memory;
    the words were "the LM head's output ... batch × sequence × vocabulary scores"."""
    snap = heldout("h13_multiscale_seg")
    no_frames = copy.deepcopy(as_handed_over(snap))
    for e in no_frames["device_traces"][0]:
        e["frames"] = []
    reports = marked_and_plain("h13_multiscale_seg") + [("no frames", phasemem.analyze(no_frames))]
    for how, r in reports:
        mine = [p for p in r.patterns if p.kind in ("logits", "softmax_spike", "logits_release")]
        assert mine, how
        for p in mine:
            assert "LM head's output" not in p.explanation and "vocabulary-sized" not in p.explanation, how
        logits = [p for p in mine if p.kind == "logits"]
        assert ("interpolate()" in logits[0].explanation) == (how != "no frames"), how


def test_a_language_model_keeps_its_lm_head_words():
    for how, r in marked_and_plain("h13_muon_adamw"):
        logits = [p for p in r.patterns if p.kind == "logits"]
        assert logits and all("LM head's output" in p.explanation for p in logits), how


def test_pure_fp16_with_hand_scaling():
    """fp16 weights and logits, the loss upcast to fp32 (the spike), SGD momentum's one buffer."""
    snap = heldout("h14_pure_fp16_scaled")
    meta = snap["phasemem"]["meta"]
    fp16_logits = meta["batch"] * meta["seq"] * meta["vocab"] * 2
    for how, r in marked_and_plain("h14_pure_fp16_scaled"):
        assert r.by_category["parameter"] == meta["param_bytes"], how
        (state,) = [p for p in r.patterns if p.kind == "optimizer_state_init"]
        assert state.bytes == meta["param_bytes"], how
        logits = [p for p in r.patterns if p.kind == "logits"]
        assert logits and all(p.bytes == fp16_logits for p in logits), how
        spikes = [p for p in r.patterns if p.kind == "softmax_spike"]
        assert spikes and all(p.bytes >= 2 * fp16_logits for p in spikes), how  # the fp32 copy


def test_a_chunked_loss_is_not_told_to_chunk_its_loss():
    """The batch x sequence x vocabulary logits never exist (no allocation of their size); nothing
    says 'compute the loss in chunks' of a loss computed in chunks."""
    snap = heldout("h15_chunked_ce")
    meta = snap["phasemem"]["meta"]
    full = meta["batch"] * meta["seq"] * meta["vocab"] * 4
    assert not any(e["size"] >= full for e in snap["device_traces"][0] if e["action"] == "alloc")
    for how, r in marked_and_plain("h15_chunked_ce"):
        assert not any("in chunks" in p.explanation for p in r.patterns if p.kind != "checkpoint_recompute"), how
        assert not any(p.bytes >= full for p in r.patterns if p.kind == "logits"), how
        assert r.by_category["parameter"] == meta["param_bytes"], how
