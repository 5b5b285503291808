"""Held-out set 10 (fixtures/heldout10, fixtures/record_heldout10.py): reentrant checkpointing (the
kind that records with torch's defaults), optimizers written as torch.optim.Optimizer subclasses
(Shampoo's preconditioners, Lion), a DQN's replay buffer and target network, a frozen feature
extractor, MoCo's queue and its contrastive scores. Each truth comes from the raw snapshot (gt:: and
Optimizer.step ranges, its segments) or the recording's meta (layers, state and buffer sizes)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from helpers.analyses import marked_and_plain
from helpers.snapshots import recording

ROOT = Path(__file__).resolve().parents[1]
HELDOUT10 = ROOT / "fixtures" / "heldout10"


def _snap(name: str) -> dict:
    return recording(HELDOUT10, name)


def _opt_ends(snap: dict) -> list[int]:
    t = np.array([e["time_us"] for e in snap["device_traces"][0]])
    ends = sorted(a["time_us"] for a in snap["external_annotations"]
                  if a["name"].startswith("Optimizer.step#") and a["stage"] == "END")
    return [int(np.searchsorted(t, x, "right")) for x in ends]


def _meta(snap: dict) -> dict:
    return snap["phasemem"]["meta"]


def test_reentrant_checkpointing_recomputes_once_per_layer():
    """Reentrant checkpointing runs each block's backward inside its own recompute call: the matching
    sizes split a HF layer into several runs (17 "times" for 4 layers before); the frames count calls."""
    for name in ("h10_reentrant_ckpt", "h10_hf_reentrant_ckpt"):
        snap = _snap(name)
        meta = _meta(snap)
        for how, r in marked_and_plain(snap):
            assert [s.end_event + 1 for s in r.steps] == _opt_ends(snap), (name, how)
            rc = r.patterns_of("checkpoint_recompute")
            assert [p.step for p in rc] == [0, 1, 2], (name, how)
            assert all(p.details["count"] == meta["layers"] for p in rc), (name, how)
            assert f"{meta['layers']} times here" in rc[0].explanation, (name, how)
            assert r.by_category["parameter"] == meta["param_bytes"], (name, how)


def test_a_shampoo_subclass_is_not_said_to_keep_buffers_per_parameter():
    """Preconditioners m x m and n x n per weight: 4.36x the gradients. Before: "buffers per parameter
    (Adam keeps two, momentum SGD one)", and its eigh temporaries explained as sqrt(exp_avg_sq)."""
    snap = _snap("h10_shampoo_subclass")
    meta = _meta(snap)
    for how, r in marked_and_plain(snap):
        assert [s.end_event + 1 for s in r.steps] == _opt_ends(snap), how
        state = r.patterns_of("optimizer_state_init")
        assert [(p.step, p.bytes) for p in state] == [(0, meta["state_bytes"])], how
        assert "not a whole number of buffers per parameter" in state[0].explanation, how
        temps = r.patterns_of("optimizer_temporaries")
        assert temps and all("sqrt(exp_avg_sq)" not in p.explanation and "your own code" in p.explanation
                             for p in temps), how
        assert r.by_category["parameter"] == r.by_category["gradient"] == meta["param_bytes"], how


def test_a_lion_subclass_keeps_one_buffer_per_parameter():
    snap = _snap("h10_lion_subclass")
    meta = _meta(snap)
    for how, r in marked_and_plain(snap):
        state = r.patterns_of("optimizer_state_init")
        assert [(p.step, p.bytes) for p in state] == [(0, meta["param_bytes"])], how
        assert "one buffer the size of each parameter" in state[0].explanation, how


def _preexisting_to_end(snap: dict) -> int:
    """Bytes of the blocks in the snapshot's segments that no event of the trace allocated."""
    made = {e["addr"] for e in snap["device_traces"][0] if e["action"] == "alloc"}
    return sum(b["size"] for seg in snap["segments"] for b in seg["blocks"]
               if b["state"] == "active_allocated" and b["address"] not in made)


def test_a_replay_buffer_and_a_frozen_backbone_are_not_parameters():
    """DQN: 205 MB of replay buffer and a target network from before recording, 12 updates; a linear
    probe: 537 MB of frozen weights under no_grad and a trained head."""
    for name, kept in (("h10_dqn_replay", "buffer_bytes"), ("h10_linear_probe", "frozen_bytes")):
        snap = _snap(name)
        meta = _meta(snap)
        assert _preexisting_to_end(snap) >= meta[kept] + meta["param_bytes"]
        for how, r in marked_and_plain(snap):
            assert [s.end_event + 1 for s in r.steps] == _opt_ends(snap), (name, how)
            assert len(r.steps) == meta["nsteps"], (name, how)
            assert r.by_category["parameter"] == meta["param_bytes"], (name, how)
            assert r.by_category["other"] >= meta[kept], (name, how)
            assert any("pair with no gradient" in n for n in r.notes), (name, how)


def test_contrastive_scores_are_no_lm_head_output():
    """MoCo's (256, 1 + 65536) scores are computed in the loop, outside any module."""
    snap = _snap("h10_moco_queue")
    meta = _meta(snap)
    for how, r in marked_and_plain(snap):
        logits = r.patterns_of("logits")
        assert logits and all(p.bytes <= meta["logits_bytes"] for p in logits), how
        assert all("LM head" not in p.explanation and "outside any module" in p.explanation for p in logits), how
        assert r.by_category["parameter"] == meta["param_bytes"], how
