"""Held-out set 8 (fixtures/heldout8, fixtures/record_heldout8.py): recordings begun inside a step,
training whose gradients the trace does not show (CUDA graphs), weights that live twice (an fp32
master copy), sampling before each update, weight-norm parametrizations, Python-only stacks. Each
truth comes from the raw snapshot (gt:: and Optimizer.step ranges, the recording's meta)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from helpers.analyses import marked_and_plain
from helpers.snapshots import recording

ROOT = Path(__file__).resolve().parents[1]
HELDOUT8 = ROOT / "fixtures" / "heldout8"


def _snap(name: str) -> dict:
    return recording(HELDOUT8, name)


def _opt_ends(snap: dict) -> list[int]:
    """One past the last event of each Optimizer.step range (every step here has one optimizer)."""
    t = np.array([e["time_us"] for e in snap["device_traces"][0]])
    ends = sorted(a["time_us"] for a in snap["external_annotations"]
                  if a["name"].startswith("Optimizer.step#") and a["stage"] == "END")
    return [int(np.searchsorted(t, x, "right")) for x in ends]


def test_a_trace_opened_inside_a_step_marks_it_partial():
    """Recording began after step 1's forward: the first step has no forward and is partial; the
    zero_grad it runs is given no advice about a forward it cannot see."""
    snap = _snap("h8_mid_step_start")
    want = _opt_ends(snap)
    for how, r in marked_and_plain(snap):
        assert [s.end_event + 1 for s in r.steps] == want, how
        assert [s.complete for s in r.steps] == [False] + [True] * (len(want) - 1), how
        first = [p for p in r.patterns_of("gradients") if p.step == 0 and p.phase == "zero_grad"]
        assert first and "forward" not in first[0].explanation, how


def test_cuda_graph_training_claims_no_weights_gradients_or_state():
    """reduce-overhead CUDA graphs make gradients in the graph's pool: the trace shows none (the loss's
    4-byte seed gradients were "gradients, 12 B"), so weights (384 MiB) and AdamW's state (768 MiB),
    all from before recording, cannot be told apart and neither is claimed; steps are torch's."""
    snap = _snap("h8_compile_reduce_overhead")
    want = _opt_ends(snap)
    assert len(want) == 3
    for how, r in marked_and_plain(snap):
        assert [s.end_event + 1 for s in r.steps] == want, how
        assert not r.patterns_of("gradients"), how
        assert r.by_category["parameter"] == r.by_category["optimizer_state"] == r.by_category["gradient"] == 0, how


def test_fp32_master_copy_is_not_the_parameters():
    snap = _snap("h8_master_weights")
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain(snap):
        assert r.by_category["parameter"] == meta["param_bytes"], how  # the bf16 weights, not the master copy
        assert any("fp32 master copy" in n for n in r.notes), how


def test_sampling_before_each_update_is_no_step():
    snap = _snap("h8_generate_then_train")
    meta = snap["phasemem"]["meta"]
    logits = meta["batch"] * meta["seq"] * meta["vocab"] * 4  # the update's forward on the sampled sequences
    for how, r in marked_and_plain(snap):
        assert [s.end_event + 1 for s in r.steps] == _opt_ends(snap), how
        assert {p.bytes for p in r.patterns_of("logits")} == {logits}, how


def test_weight_norm_and_python_stacks_name_the_weights():
    for name, per_param in (("h8_weight_norm", 1), ("h8_python_stacks_alloc", 2)):  # SGD momentum 1, AdamW 2
        snap = _snap(name)
        meta = snap["phasemem"]["meta"]
        for how, r in marked_and_plain(snap):
            assert [s.end_event + 1 for s in r.steps] == _opt_ends(snap), (name, how)
            assert r.by_category["parameter"] == meta["param_bytes"], (name, how)
            state = r.patterns_of("optimizer_state_init")
            assert state and state[0].bytes == per_param * meta["param_bytes"], (name, how)
