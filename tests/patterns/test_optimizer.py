"""The optimizer's shapes (optimizer_state_init, optimizer_temporaries): the state each optimizer keeps,
in the words its kind calls for, the temporaries of its update, and no claim where no optimizer ran.

Truth from the raw snapshot (its gt:: and Optimizer.step ranges, the stacks of its allocations) and
the recording's meta (the model's own byte counts), never from phasemem. The held-out recordings
(fixtures/heldoutN, fixtures/record_heldoutN.py) are analysed twice: with the gt:: ranges as markers,
and as a user would hand them over (helpers.analyses.marked_and_plain); the ../shared/wild ones as
published (helpers.wild).
"""
from __future__ import annotations

import pytest

from helpers.analyses import analyzed, marked_and_plain, not_released
from helpers.raw import close, optimizer_ends, true_step_ends
from helpers.snapshots import heldout
from helpers.wild import OPTIMIZER_SHAPES, PROGRAMS, wild_report


def test_adam_state_once_and_temporaries_unless_fused_shared(shared_without_frames):
    report, meta, known = shared_without_frames
    state = report.patterns_of("optimizer_state_init")
    assert [p.step for p in state] == [0]
    assert close(state[0].bytes, 2 * meta["param_bytes"])
    temps = report.patterns_of("optimizer_temporaries")
    if known["fused"]:
        assert [p.step for p in temps] == []
    else:
        assert [p.step for p in temps] == list(range(len(report.steps)))
        for p in temps:
            assert 0 < p.details["flagpole_bytes"] <= p.bytes
            assert report.analysis.labels[p.peak_event] == 5  # optimizer
    assert report.patterns_of("leak") == []


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_no_optimizer_claim_without_an_optimizer(name):
    r, truth = wild_report(name), PROGRAMS[name]
    kinds = {p.kind for p in r.patterns}
    if not truth["optimizer"]:
        assert "optimizer" not in r.phases
        assert not kinds & OPTIMIZER_SHAPES
    else:
        assert "optimizer" in r.phases


@pytest.mark.parametrize("name", ["wedsonlin_medium512_train", "bcrafton_cs336"])
def test_state_rebound_every_step_is_not_created_state(name):
    """A hand-written AdamW that assigns new state["m"], state["v"] each step, one step after warm-up:
    the old state existed before recording and is freed as the new one is made."""
    assert not wild_report(name).patterns_of("optimizer_state_init")


def test_state_created_in_the_recorded_first_step():
    """kkaitlyn_ctx128_fullstep records the first step ever: its AdamW makes m and v (zeros_like) there."""
    r = wild_report("kkaitlyn_ctx128_fullstep")
    (init,) = r.patterns_of("optimizer_state_init")
    assert init.details["ratio_to_gradients"] == pytest.approx(2.0, abs=0.01)


def test_hand_written_optimizer_is_not_told_to_pass_fused():
    for name in ("nothanmin_cs336", "wedsonlin_medium512_train", "bcrafton_cs336"):
        for p in wild_report(name).patterns_of("optimizer_temporaries"):
            assert "Pass fused=True" not in p.explanation and p.details["own_code"]


def test_legacy_recording_and_sgd_temporaries():
    """The legacy call (``_record_memory_history(True, trace_alloc_max_entries=...)``) is read with
    its steps; SGD's update ends in no division, so its flagpole is not said to be one."""
    snap = heldout("h6_legacy_empty_cache")
    want = true_step_ends(snap)
    for how, r in marked_and_plain("h6_legacy_empty_cache"):
        assert [s.end_event + 1 for s in r.steps] == want, how
        temps = r.patterns_of("optimizer_temporaries")
        assert temps and all("division" not in p.explanation for p in temps), how


def test_a_shampoo_subclass_is_not_said_to_keep_buffers_per_parameter():
    """Preconditioners m x m and n x n per weight: 4.36x the gradients. Before: "buffers per parameter
    (Adam keeps two, momentum SGD one)", and its eigh temporaries explained as sqrt(exp_avg_sq)."""
    snap = heldout("h10_shampoo_subclass")
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain("h10_shampoo_subclass"):
        assert [s.end_event + 1 for s in r.steps] == optimizer_ends(snap), how
        state = r.patterns_of("optimizer_state_init")
        assert [(p.step, p.bytes) for p in state] == [(0, meta["state_bytes"])], how
        assert "not a whole number of buffers per parameter" in state[0].explanation, how
        temps = r.patterns_of("optimizer_temporaries")
        assert temps and all("sqrt(exp_avg_sq)" not in p.explanation and "your own code" in p.explanation
                             for p in temps), how
        assert r.by_category["parameter"] == r.by_category["gradient"] == meta["param_bytes"], how


def test_a_lion_subclass_keeps_one_buffer_per_parameter():
    snap = heldout("h10_lion_subclass")
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain("h10_lion_subclass"):
        state = r.patterns_of("optimizer_state_init")
        assert [(p.step, p.bytes) for p in state] == [(0, meta["param_bytes"])], how
        assert "one buffer the size of each parameter" in state[0].explanation, how


def test_sgd_temporaries_are_not_explained_by_adam():
    """SGD with weight decay and Nesterov makes per-parameter temporaries, but no sqrt(exp_avg_sq)."""
    for how, r in marked_and_plain("h11_resnet50_amp_cl"):
        temps = r.patterns_of("optimizer_temporaries")
        assert temps and all("sqrt" not in p.explanation and "weight decay" in p.explanation for p in temps), how


def test_muon_and_adamw_state_is_what_the_two_keep():
    snap = heldout("h13_muon_adamw")
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain("h13_muon_adamw"):
        state = [p for p in r.patterns if p.kind == "optimizer_state_init"]
        assert [p.bytes for p in state] == [meta["state_bytes"]], how
        assert "not a whole number" in state[0].explanation, how


def test_sgd_by_hand_makes_no_optimizer_claims():
    """p.data.add_(p.grad) allocates nothing: no state, no temporaries, no advice for torch.optim;
    the gradients are the parameters' bytes and p.grad = None frees them."""
    snap = heldout("h14_sgd_by_hand")
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain("h14_sgd_by_hand"):
        assert len(r.steps) == 3, how
        kinds = {p.kind for p in r.patterns}
        assert not kinds & {"optimizer_state_init", "optimizer_temporaries"}, how
        made = [p for p in r.patterns if p.kind == "gradients" and not p.details.get("release")]
        assert len(made) == 3 and all(p.bytes == meta["param_bytes"] for p in made), how
        # p.grad = None frees them (with the loss's 4-byte scalar, where phases are inferred)
        freed = [p for p in r.patterns if p.kind == "gradients" and p.details.get("release")]
        assert freed and all(0 <= p.bytes - meta["param_bytes"] <= 512 for p in freed), how
        assert not any("fused=True" in p.explanation or "optimizer.step" in p.explanation for p in r.patterns), how


def test_eight_bit_state_is_not_told_to_go_eight_bit():
    """Blockwise 8-bit Adam: int8/uint8 moments and an fp32 absmax per 2,048 values, made lazily on
    step 0: the state is the meta's bytes, 0.50x the fp32 gradients, and the words neither call it
    'sized otherwise (preconditioners ...)' nor advise 'an 8-bit or factored optimizer'."""
    snap = heldout("h16_adam8bit")
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain("h16_adam8bit"):
        (state,) = not_released(r, "optimizer_state_init")
        assert state.bytes == meta["state_bytes"], how
        assert "8-bit or factored optimizer" not in state.explanation, how
        assert "preconditioners" not in state.explanation and "fewer bits" in state.explanation, how
        # nor predict what 8-bit state would save: it is 8-bit already (was "kept in a quarter of the bytes")
        (eight,) = [w for w in r.what_if if w.remedy == "smaller_optimizer_state"]
        assert not eight.applies, how


def test_sparse_adam_state_is_said_to_be_dense():
    """SparseAdam keeps dense moments for the whole 200,000-row table while its gradient holds the
    looked-up rows: the state (2x every trained weight) is 5.7x the gradients, and the words say why."""
    snap = heldout("h16_graphsage_sampled")
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain("h16_graphsage_sampled"):
        (state,) = not_released(r, "optimizer_state_init")
        assert abs(state.bytes - 2 * meta["param_bytes"]) <= 4 * 512 * 16, how  # block rounding of 16 tensors
        assert "SparseAdam keeps its two moments dense" in state.explanation, how
        assert r.by_category["parameter"] <= meta["param_bytes"] + (1 << 20), how


def test_siglip_without_frames_has_no_huge_state():
    snap = heldout("h16_siglip")
    meta = snap["phasemem"]["meta"]
    r = analyzed("h16_siglip", "bare")
    assert all(p.bytes <= 2 * meta["param_bytes"] + (1 << 20) for p in not_released(r, "optimizer_state_init"))
    assert r.by_category["optimizer_state"] <= 2 * meta["param_bytes"] + (1 << 20)


def test_compiling_the_update_is_not_its_temporaries():
    """Compiling opt.step inside the recording builds guards that print every parameter: thousands of
    tiny blocks under torch/_dynamo/guards.py in step 0's optimizer range, once 'the update's
    temporaries ... a foreach update makes per-parameter intermediates'. The compiled update makes
    none afterwards."""
    snap = heldout("h16_compiled_fused")
    ev = snap["device_traces"][0]
    guards = {i for i, e in enumerate(ev) if e["action"] == "alloc"
              and any(f["filename"].endswith("torch/_dynamo/guards.py") for f in e.get("frames") or [])}
    assert len(guards) > 1000
    for how, r in marked_and_plain("h16_compiled_fused"):
        facts = r.analysis.facts
        for p in r.patterns_of("optimizer_temporaries"):
            assert not guards & {int(facts.alloc[m]) for m in p.members}, how
