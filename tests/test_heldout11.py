"""Held-out set 11 (fixtures/heldout11, fixtures/record_heldout11.py): backward passes that are no
training step's (MAML's inner updates, PGD's attack), a hidden state carried across steps (TBPTT),
and timm's ResNet-50 under AMP with cudnn.benchmark. Truth from the raw snapshot (Optimizer.step
ranges) and the recording's meta (parameter bytes, the optimizer)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers.analyses import marked_and_plain
from helpers.snapshots import recording

ROOT = Path(__file__).resolve().parents[1]
HELDOUT11 = ROOT / "fixtures" / "heldout11"


def _opt_ends(snap: dict) -> list[int]:
    t = np.array([e["time_us"] for e in snap["device_traces"][0]])
    ends = sorted(a["time_us"] for a in snap["external_annotations"]
                  if a["name"].startswith("Optimizer.step#") and a["stage"] == "END")
    return [int(np.searchsorted(t, x, "right")) for x in ends]


@pytest.mark.parametrize("name,per_param", [("h11_resnet50_amp_cl", 1), ("h11_maml", 2), ("h11_pgd_adversarial", 1),
                                            ("h11_tbptt_lstm", 2)])
def test_steps_weights_gradients_and_state(name, per_param):
    """Attack and inner-loop backward passes make no .grad: one gradient set a step, no accumulation."""
    snap = recording(HELDOUT11, name)
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain(snap):
        assert [s.end_event + 1 for s in r.steps] == _opt_ends(snap), how
        assert len(r.steps) == meta["nsteps"], how
        assert r.by_category["parameter"] == meta["param_bytes"], how
        made = [p for p in r.patterns_of("gradients") if p.phase == "backward"]
        assert [p.step for p in made] == list(range(meta["nsteps"])), how
        assert all(p.bytes == meta["param_bytes"] for p in made), how
        assert not r.patterns_of("gradient_accumulation"), how
        state = r.patterns_of("optimizer_state_init")
        assert [(p.step, p.bytes) for p in state] == [(0, per_param * meta["param_bytes"])], how


def test_sgd_temporaries_are_not_explained_by_adam():
    """SGD with weight decay and Nesterov makes per-parameter temporaries, but no sqrt(exp_avg_sq)."""
    snap = recording(HELDOUT11, "h11_resnet50_amp_cl")
    for how, r in marked_and_plain(snap):
        temps = r.patterns_of("optimizer_temporaries")
        assert temps and all("sqrt" not in p.explanation and "weight decay" in p.explanation for p in temps), how


def _free_of(snap: dict, event: int) -> int:
    """The event that frees the block allocated at ``event`` (from the raw trace)."""
    tr = snap["device_traces"][0]
    addr = tr[event]["addr"]
    return next(k for k in range(event + 1, len(tr)) if tr[k]["addr"] == addr and tr[k]["action"] == "free_completed")


def test_logits_are_not_cudnns_workspace_and_the_loop_holds_them():
    """cuDNN's LSTM makes a 124 MB workspace in forward before the 82 MB logits: it was "the LM head's
    output" and the spike's partner. The loop keeps `logits` to the end of the step, so backward's
    release does not free them, which the report used to say it did."""
    snap = recording(HELDOUT11, "h11_tbptt_lstm")
    meta = snap["phasemem"]["meta"]
    logits_bytes = meta["batch"] * meta["seq"] * meta["vocab"] * 4
    for how, r in marked_and_plain(snap):
        first = [p for p in r.patterns_of("logits") if p.step == 0]
        assert [p.bytes for p in first] == [logits_bytes], how
        assert "among the largest tensors" in first[0].explanation, how
        release = [p for p in r.patterns_of("logits_release") if p.step == 0]
        freed = _free_of(snap, first[0].start_event)
        assert release and freed > release[0].end_event, how
        assert f"until event {freed}" in release[0].explanation and "stay" in release[0].explanation, how
