"""Held-out set 13 (fixtures/heldout13, fixtures/record_heldout13.py): programs whose memory does
things the loop's shape does not say. Truth from the raw snapshot (its gt:: ranges, its segments'
stacks) and from the recording's meta (the model's own byte counts)."""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

import phasemem
from heldout_sets import as_handed_over, marked_and_plain, recording
from phasemem.vocab import P

ROOT = Path(__file__).resolve().parents[1]
HELDOUT13 = ROOT / "fixtures" / "heldout13"


def _frames_only(snap: dict) -> dict:
    """The snapshot without any annotation (torch's Optimizer.step ranges too): frames decide."""
    s = as_handed_over(snap)
    s["external_annotations"] = []
    return s


def _in_gt_range(snap: dict, name: str) -> np.ndarray:
    """Per event: inside a gt::<name> range (by the events' and the ranges' times)."""
    marks = sorted((a["time_us"], a["stage"]) for a in snap["external_annotations"] if a["name"] == "gt::" + name)
    starts = [t for t, st in marks if st == "START"]
    ends = [t for t, st in marks if st == "END"]
    times = np.array([e["time_us"] for e in snap["device_traces"][0]])
    inside = np.zeros(len(times), bool)
    for a, b in zip(starts, ends):
        inside |= (times >= a) & (times <= b)
    return inside


def _workspace_bytes(snap: dict) -> int:
    """Blocks from before the trace, alive at the end, whose stack names a cuBLAS workspace getter."""
    made = {e["addr"] for e in snap["device_traces"][0] if e["action"] == "alloc"}
    return sum(b["size"] for seg in snap["segments"] for b in seg["blocks"]
               if b["state"] == "active_allocated" and b["address"] not in made
               and any("Workspace" in f["name"] for f in b.get("frames") or []))


def test_a_decorated_optimizer_subclass_with_helpers_is_the_optimizer_by_its_frames():
    """Muon's step (``@torch.no_grad()``, a Newton-Schulz helper) with no annotation to go by: its
    events were 'other' (accuracy 0.26), because the decorator's frame hid the subclass's step."""
    snap = recording(HELDOUT13, "h13_muon_adamw")
    opt = _in_gt_range(snap, "optimizer")
    got = phasemem.analyze(_frames_only(snap))
    codes = got.analysis.labels
    assert opt.sum() > 5000
    assert np.mean(codes[opt] == P["optimizer"]) > 0.99
    # and nothing outside the update is called optimizer
    assert np.mean(codes[~opt] == P["optimizer"]) < 0.01
    assert len(got.steps) == 3


def test_muon_and_adamw_state_is_what_the_two_keep():
    snap = recording(HELDOUT13, "h13_muon_adamw")
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain(snap):
        state = [p for p in r.patterns if p.kind == "optimizer_state_init"]
        assert [p.bytes for p in state] == [meta["state_bytes"]], how
        assert "not a whole number" in state[0].explanation, how


@pytest.mark.parametrize("name", ["h13_ddim_cfg_infer", "h13_embeddings_cat_growth"])
def test_workspaces_left_by_an_earlier_recording_are_not_parameters(name):
    """Inference whose weights came before recording: the cuBLAS/cuBLASLt workspaces beside them
    (made under an earlier recording of the process, so their stacks say what they are) were
    parameters too: 105 MiB of "parameters" for a 40 MiB MLP."""
    snap = recording(HELDOUT13, name)
    meta = snap["phasemem"]["meta"]
    assert _workspace_bytes(snap) >= 64 << 20
    for how, r in marked_and_plain(snap):
        assert r.by_category["parameter"] == meta["param_bytes"], how


def test_offloaded_blocks_weights_count_as_parameters_while_on_the_device():
    """Only the embeddings and the head stay resident; each block's weights come and go."""
    snap = recording(HELDOUT13, "h13_layer_offload_infer")
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain(snap):
        # at the peak one block is on the device; at the end none is
        assert r.by_category["parameter"] == meta["resident_param_bytes"] + meta["block_param_bytes"], how
        end = r.analysis.categories_at_level([len(r.analysis.trace) - 1])[0]
        assert end[list(r.by_category).index("parameter")] == meta["resident_param_bytes"], how


def test_segmentation_scores_are_logits_but_no_lm_head_and_no_vocabulary():
    """The FCN's per-pixel class scores (F.interpolate's output) have the logits' shape in memory;
    the words were "the LM head's output ... batch × sequence × vocabulary scores"."""
    snap = recording(HELDOUT13, "h13_multiscale_seg")
    no_frames = copy.deepcopy(as_handed_over(snap))
    for e in no_frames["device_traces"][0]:
        e["frames"] = []
    reports = marked_and_plain(snap) + [("no frames", phasemem.analyze(no_frames))]
    for how, r in reports:
        mine = [p for p in r.patterns if p.kind in ("logits", "softmax_spike", "logits_release")]
        assert mine, how
        for p in mine:
            assert "LM head's output" not in p.explanation and "vocabulary-sized" not in p.explanation, how
        logits = [p for p in mine if p.kind == "logits"]
        assert ("interpolate()" in logits[0].explanation) == (how != "no frames"), how


def test_a_language_model_keeps_its_lm_head_words():
    snap = recording(HELDOUT13, "h13_muon_adamw")
    for how, r in marked_and_plain(snap):
        logits = [p for p in r.patterns if p.kind == "logits"]
        assert logits and all("LM head's output" in p.explanation for p in logits), how


def test_the_validation_graphs_kept_every_step_are_a_leak_of_their_size():
    """A validation forward with grad enabled whose loss is kept: its graph's saved tensors stay.
    The leak is the bytes each gt::eval range allocated and never freed (from the raw trace)."""
    snap = recording(HELDOUT13, "h13_eval_graph_leak")
    ev = snap["device_traces"][0]
    in_eval = _in_gt_range(snap, "eval0")
    kept = sum(e["size"] for i, e in enumerate(ev) if e["action"] == "alloc" and in_eval[i] and not any(
        f["action"] == "free_completed" and f["addr"] == e["addr"] for f in ev[i + 1:]))
    assert kept > 1 << 30
    for how, r in marked_and_plain(snap):
        leaks = [p for p in r.patterns if p.kind == "leak"]
        assert leaks, how
        assert leaks[0].bytes == kept, how
        assert in_eval[leaks[0].start_event] and in_eval[leaks[0].end_event], how


def test_out_of_memory_retries_are_reported_where_they_happened():
    """Three attempts ran out (batch 64, 32, 16), each at the allocation the raw trace's oom entry
    names; the three steps after them are the three updates."""
    snap = recording(HELDOUT13, "h13_oom_retry_halve")
    ev = snap["device_traces"][0]
    ooms = [i for i, e in enumerate(ev) if e["action"] == "oom"]
    assert len(ooms) == 3 == sum(1 for _, s in snap["phasemem"]["meta"]["attempts"] if s == "oom")
    fwd = _in_gt_range(snap, "forward")
    for how, r in marked_and_plain(snap):
        assert [o.event for o in r.ooms] == ooms, how
        assert [o.requested_bytes for o in r.ooms] == [ev[i]["size"] for i in ooms], how
        assert len(r.steps) == 3, how
        for o in r.ooms:
            assert fwd[o.event]
            assert o.phase in ("forward", "other"), how  # the third is in cross_entropy, outside the model


def test_caught_out_of_memory_errors_are_said_and_fatal_ones_are_not():
    """The retry loop went on after each error (allocations follow them in the raw trace); the
    fixtures/oom recordings ended at theirs, and get no such note."""
    snap = recording(HELDOUT13, "h13_oom_retry_halve")
    ev = snap["device_traces"][0]
    ooms = [i for i, e in enumerate(ev) if e["action"] == "oom"]
    assert all(sum(1 for e in ev[i + 1:] if e["action"] == "alloc") > 100 for i in ooms)
    for how, r in marked_and_plain(snap):
        said = [n for n in r.notes if "did not end the program" in n]
        assert len(said) == 1 and said[0].startswith(f"{len(ooms)} out-of-memory"), how
    fatal = ROOT / "fixtures" / "oom" / "oom_base.pkl.xz"
    if fatal.exists():
        r = phasemem.analyze(str(fatal))
        assert r.ooms and not any("did not end the program" in n for n in r.notes)


def test_a_forward_only_last_step_is_said_to_be_either_cut_or_an_evaluation():
    """The validation after the last update keeps its graph, so with torch's annotations alone it
    reads as a fifth, partial step; the report says it may be either."""
    snap = recording(HELDOUT13, "h13_eval_graph_leak")
    (_, marked), (_, plain) = marked_and_plain(snap)
    assert len(marked.steps) == 4 and not any("forward passes only (events" in n for n in marked.notes)
    last = plain.steps[-1]
    assert not last.complete
    assert _in_gt_range(snap, "eval3")[last.start_event + 3:last.end_event - 3].all()
    said = [n for n in plain.notes if "forward passes only (events" in n]
    assert len(said) == 1 and f"step {last.number} " in said[0] and "evaluation" in said[0]
