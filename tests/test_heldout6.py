"""Programs whose memory tells a story phasemem could misread with confidence (fixtures/heldout6,
fixtures/record_heldout6.py). Each truth comes from the raw trace — the gt:: ranges placed by hand,
PyTorch's own Optimizer.step ranges, the recording's meta (what the program was) — not from phasemem.

Analysed twice: with the gt:: ranges as markers, and as a user would hand them over (the ranges and
the phasemem key removed; PyTorch's annotations and torch's default stack frames kept).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from heldout_sets import as_handed_over, marked_and_plain, recording
from phasemem.vocab import C

ROOT = Path(__file__).resolve().parents[1]
HELDOUT6 = ROOT / "fixtures" / "heldout6"


def _snap(name: str) -> dict:
    return recording(HELDOUT6, name)


_plain = as_handed_over
_both = marked_and_plain


def _ranges(snap: dict, match) -> list[tuple[int, int]]:
    """(START, END) times of the annotation ranges whose name ``match`` accepts, in start order."""
    open_, out = {}, []
    for a in snap.get("external_annotations") or []:
        if not match(a["name"]):
            continue
        if a["stage"] == "START":
            open_.setdefault(a["name"], []).append(a["time_us"])
        elif open_.get(a["name"]):
            out.append((open_[a["name"]].pop(), a["time_us"]))
    return sorted(out)


def _true_step_ends(snap: dict) -> list[int]:
    """Per gt::stepN range, one past the last event of the last Optimizer.step range inside it."""
    t = np.array([e["time_us"] for e in snap["device_traces"][0]])
    steps = _ranges(snap, lambda n: n.startswith("gt::step"))
    opts = _ranges(snap, lambda n: n.startswith("Optimizer.step#"))
    ends = []
    for s0, s1 in steps:
        inside = [o1 for o0, o1 in opts if s0 <= o0 and o1 <= s1]
        ends.append(int(np.searchsorted(t, max(inside), "right")))
    return ends


@pytest.mark.parametrize("name", ["h6_sparse_two_opt", "h6_optim_in_backward"])
def test_a_step_ends_at_its_last_optimizer_range(name):
    """Two optimizers stepped one after the other, and an optimizer stepped per parameter inside
    backward (53 Optimizer.step ranges a step on the autograd thread), are one step each time: the
    step ends where the last Optimizer.step of the gt::step range ends (was 6 and 159 steps)."""
    snap = _snap(name)
    want = _true_step_ends(snap)
    assert len(want) == 3
    for how, r in _both(snap):
        assert [s.end_event + 1 for s in r.steps] == want, how
        assert all(s.complete for s in r.steps), how


def test_optimizer_inside_backward_is_said_and_its_gradients_never_coexist():
    snap = _snap("h6_optim_in_backward")
    trace = snap["device_traces"][0]
    for how, r in _both(snap):
        assert any("optimizer runs inside backward in 3 of 3" in n for n in r.notes), how
        for p in r.patterns_of("gradients"):
            if p.phase != "backward":
                continue
            # recomputed from the raw events: the most of this pattern's blocks alive at once
            idx = np.asarray([r.analysis.facts.alloc[m] for m in p.members])
            born = {int(e): int(trace[e]["size"]) for e in idx}
            events = sorted([(int(a), s) for a, s in born.items()] +
                            [(int(f), -s) for f, s in zip(r.analysis.facts.free[np.asarray(p.members)],
                                                          born.values())], key=lambda x: (x[0], x[1]))
            alive = np.cumsum([d for _, d in events])
            assert p.bytes == int(alive.max()), how
            assert p.bytes < sum(born.values()) / 4, how  # a parameter at a time, not their total
            assert "inside backward" in p.explanation, how
        # moving zero_grad before forward cannot free what backward has not made yet
        moved = [w for w in r.what_if if w.remedy == "zero_grad_before_forward"]
        assert moved and not moved[0].applies, how
        assert r.patterns_of("leak") == [], how
        temps = r.patterns_of("optimizer_temporaries")
        assert len(temps) == len(r.steps), how  # one update at a time: one shape a step


def test_weights_named_by_optimizer_state_when_the_gradient_is_sparse():
    """SparseAdam's dense state names the 488 MiB embedding as a parameter although its gradient
    (a sparse tensor, 32 MiB of values) has another size; all 129 M parameters are parameters."""
    snap = _snap("h6_sparse_two_opt")
    meta = snap["phasemem"]["meta"]
    rows_dim = 2_000_000 * 64 * 4  # EmbeddingBag(2_000_000, 64) in fp32, from the recording script
    blocks = [b for seg in snap["segments"] if seg["device"] == 0 for b in seg["blocks"]
              if b["state"] == "active_allocated" and b["size"] == rows_dim]
    assert blocks  # alive from before recording to the end
    for how, r in _both(snap):
        life = r.analysis.timeline.lifetimes
        codes = np.asarray(r.analysis.categories.codes)
        big = life.preexisting & (life.size == rows_dim)
        assert big.any() and (codes[big] == C["parameter"]).all(), how
        assert r.by_category["parameter"] >= meta["param_bytes"], how


def test_kept_logits_are_a_leak_of_their_size():
    snap = _snap("h6_kept_logits")
    meta = snap["phasemem"]["meta"]
    logits = meta["batch"] * meta["seq"] * meta["vocab"] * 4
    for how, r in _both(snap):
        assert len(r.steps) == meta["nsteps"], how
        leaks = r.patterns_of("leak")
        assert leaks and all(p.bytes == logits for p in leaks), how


def test_legacy_recording_and_sgd_temporaries():
    """The legacy call (``_record_memory_history(True, trace_alloc_max_entries=...)``) is read with
    its steps; SGD's update ends in no division, so its flagpole is not said to be one."""
    snap = _snap("h6_legacy_empty_cache")
    want = _true_step_ends(snap)
    for how, r in _both(snap):
        assert [s.end_event + 1 for s in r.steps] == want, how
        temps = r.patterns_of("optimizer_temporaries")
        assert temps and all("division" not in p.explanation for p in temps), how


def test_ppo_rollouts_are_not_steps():
    snap = _snap("h6_ppo")
    want = _true_step_ends(snap)
    assert len(want) == snap["phasemem"]["meta"]["nsteps"] == 16
    for how, r in _both(snap):
        assert [s.end_event + 1 for s in r.steps] == want, how


def test_generate_claims_nothing_of_training():
    for how, r in _both(_snap("h6_hf_generate")):
        assert not r.patterns, how  # no leak (the cache grows inside a request), no optimizer, no gradients
        assert r.by_category["gradient"] == r.by_category["optimizer_state"] == 0, how


def test_save_on_cpu_is_no_checkpointing():
    """save_on_cpu(pin_memory=True) keeps the saved activations in host memory: at the peak the GPU
    holds next to none, and backward's copies of them brought back (made under save_on_cpu's
    unpack_from_cpu, as the raw frames say) echo forward's sizes in order but are no recompute."""
    snap = _snap("h6_save_on_cpu")
    unpacked = [i for i, e in enumerate(snap["device_traces"][0]) if e["action"] == "alloc"
                and any(f["name"] == "unpack_from_cpu" for f in e.get("frames") or [])]
    assert len(unpacked) > 100
    for how, r in _both(snap):
        assert r.by_category["activation"] < 0.01 * r.peak_bytes, how
        assert not r.patterns_of("checkpoint_recompute"), how
        ckpt = [w for w in r.what_if if w.remedy == "activation_checkpointing"]
        assert ckpt and "on already" not in ckpt[0].explanation, how
