"""Held-out set 14 (fixtures/heldout14, fixtures/record_heldout14.py): training loops that update or
differentiate in their own way. Truth from the raw snapshot (its gt:: ranges, the stacks of its
allocations) and from the recording's meta (the models' own byte counts)."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers.analyses import marked_and_plain
from helpers.snapshots import recording

ROOT = Path(__file__).resolve().parents[1]
HELDOUT14 = ROOT / "fixtures" / "heldout14"


def _workspace_allocs(snap: dict) -> int:
    """Bytes the trace allocates through a cuBLAS/cuBLASLt workspace getter and never frees."""
    ev = snap["device_traces"][0]
    freed = {}
    for i, e in enumerate(ev):
        if e["action"] == "free_completed":
            freed.setdefault(e["addr"], []).append(i)
    return sum(e["size"] for i, e in enumerate(ev) if e["action"] == "alloc"
               and any("Workspace" in f["name"] for f in e.get("frames") or [])
               and not any(j > i for j in freed.get(e["addr"], [])))


def test_workspaces_the_first_matmul_makes_before_forward_are_not_parameters():
    """The PINN's first matmul made cuBLAS's and cuBLASLt's workspaces (33 MiB) before the forward
    phase began, kept to the end: "parameters 41.02 MiB" for an 8.02 MiB MLP."""
    snap = recording(HELDOUT14, "h14_pinn_second_order")
    meta = snap["phasemem"]["meta"]
    assert _workspace_allocs(snap) >= 33 << 20
    for how, r in marked_and_plain(snap):
        assert r.by_category["parameter"] == meta["param_bytes"], how
        assert len(r.steps) == 3, how


def test_sgd_by_hand_makes_no_optimizer_claims():
    """p.data.add_(p.grad) allocates nothing: no state, no temporaries, no advice for torch.optim;
    the gradients are the parameters' bytes and p.grad = None frees them."""
    snap = recording(HELDOUT14, "h14_sgd_by_hand")
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain(snap):
        assert len(r.steps) == 3, how
        kinds = {p.kind for p in r.patterns}
        assert not kinds & {"optimizer_state_init", "optimizer_temporaries"}, how
        made = [p for p in r.patterns if p.kind == "gradients" and not p.details.get("release")]
        assert len(made) == 3 and all(p.bytes == meta["param_bytes"] for p in made), how
        # p.grad = None frees them (with the loss's 4-byte scalar, where phases are inferred)
        freed = [p for p in r.patterns if p.kind == "gradients" and p.details.get("release")]
        assert freed and all(0 <= p.bytes - meta["param_bytes"] <= 512 for p in freed), how
        assert not any("fused=True" in p.explanation or "optimizer.step" in p.explanation for p in r.patterns), how


def test_pure_fp16_with_hand_scaling():
    """fp16 weights and logits, the loss upcast to fp32 (the spike), SGD momentum's one buffer."""
    snap = recording(HELDOUT14, "h14_pure_fp16_scaled")
    meta = snap["phasemem"]["meta"]
    fp16_logits = meta["batch"] * meta["seq"] * meta["vocab"] * 2
    for how, r in marked_and_plain(snap):
        assert r.by_category["parameter"] == meta["param_bytes"], how
        (state,) = [p for p in r.patterns if p.kind == "optimizer_state_init"]
        assert state.bytes == meta["param_bytes"], how
        logits = [p for p in r.patterns if p.kind == "logits"]
        assert logits and all(p.bytes == fp16_logits for p in logits), how
        spikes = [p for p in r.patterns if p.kind == "softmax_spike"]
        assert spikes and all(p.bytes >= 2 * fp16_logits for p in spikes), how  # the fp32 copy


def test_a_frozen_encoder_is_not_trained():
    """Only the denoiser's weights get gradients and state; the frozen encoder's are 'other'."""
    snap = recording(HELDOUT14, "h14_frozen_encoder_latent")
    meta = snap["phasemem"]["meta"]
    trained = meta["trained_param_bytes"]
    for how, r in marked_and_plain(snap):
        assert r.by_category["parameter"] == trained, how
        grads = [p for p in r.patterns if p.kind == "gradients"]
        assert grads and all(p.bytes == trained for p in grads), how
        (state,) = [p for p in r.patterns if p.kind == "optimizer_state_init"]
        assert state.bytes == 2 * trained, how


@pytest.mark.parametrize("name", ["h14_compiled_infer_dynamic"])
def test_compiled_inference_is_forward_only_with_its_weights(name):
    snap = recording(HELDOUT14, name)
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain(snap):
        assert r.by_category["parameter"] == meta["param_bytes"], how
        assert not {p.kind for p in r.patterns} & {"logits", "gradients", "optimizer_state_init"}, how
    plain = marked_and_plain(snap)[1][1]
    assert len(plain.steps) == 1 and any("forward passes only" in n for n in plain.notes)
