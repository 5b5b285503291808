"""Held-out set 9 (fixtures/heldout9, fixtures/record_heldout9.py): shapes that look like the named
ones and are not (per-sample gradients, attention scores, a preallocated KV pool), steps that do not
happen (GradScaler skipping updates) and forwards that are no step (an evaluation). Each truth comes
from the raw snapshot: gt:: and Optimizer.step ranges, the allocations themselves, the recording's
meta."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from helpers.analyses import marked_and_plain
from helpers.snapshots import recording

ROOT = Path(__file__).resolve().parents[1]
HELDOUT9 = ROOT / "fixtures" / "heldout9"


def _snap(name: str) -> dict:
    return recording(HELDOUT9, name)


def _times(snap: dict) -> np.ndarray:
    return np.array([e["time_us"] for e in snap["device_traces"][0]])


def _opt_ends(snap: dict) -> list[int]:
    """One past the last event of each Optimizer.step range."""
    t = _times(snap)
    ends = sorted(a["time_us"] for a in snap["external_annotations"]
                  if a["name"].startswith("Optimizer.step#") and a["stage"] == "END")
    return [int(np.searchsorted(t, x, "right")) for x in ends]


def _ranges(snap: dict, pattern: str) -> list[tuple[int, int]]:
    """(first event, one past the last) of each gt:: range whose name matches, in time order."""
    t, open_, out = _times(snap), {}, []
    for a in snap["external_annotations"]:
        if not re.fullmatch(pattern, a["name"]):
            continue
        if a["stage"] == "START":
            open_.setdefault(a["name"], []).append(a["time_us"])
        else:
            t0 = open_[a["name"]].pop()
            out.append((int(np.searchsorted(t, t0, "left")), int(np.searchsorted(t, a["time_us"], "right"))))
    return sorted(out)


def _param_bytes(snap: dict) -> int:
    return snap["phasemem"]["meta"]["param_bytes"]


def test_skipped_updates_are_steps_of_their_own():
    """GradScaler(init_scale=2**40) overflows twice: no optimizer.step() in the first two of five
    iterations, a zero_grad freeing their gradients each time. Before: 3 steps, the first holding
    three iterations, "gradients 384 MiB in all" and "optimizer state 0.67x the gradients"."""
    snap = _snap("h9_scaler_skips_first")
    ran = snap["phasemem"]["meta"]["optimizer_ran"]
    backward, forward = _ranges(snap, r"gt::backward"), _ranges(snap, r"gt::forward")
    assert len(backward) == len(forward) == len(ran) == 5
    ends = iter(_opt_ends(snap))
    grads = _param_bytes(snap)
    for how, r in marked_and_plain(snap):
        assert len(r.steps) == len(ran), how
        for k, s in enumerate(r.steps):
            # a step holds its iteration's backward, and the next one's forward is not in it
            assert s.start_event <= backward[k][0] and backward[k][1] - 1 <= s.end_event, (how, k)
            if k + 1 < len(ran):
                assert s.end_event < forward[k + 1][0], (how, k)
            if ran[k]:
                assert s.end_event + 1 == next(ends), (how, k)
        ends = iter(_opt_ends(snap))
        skipped = [k for k, did in enumerate(ran) if not did]
        note = [n for n in r.notes if "ran no optimizer update" in n]
        assert note and note[0].startswith("step(s) " + ", ".join(map(str, skipped)) + " "), how
        made = [p for p in r.patterns_of("gradients") if p.phase == "backward"]
        assert [p.step for p in made] == list(range(len(ran))), how
        assert all(p.bytes == grads for p in made), how  # one iteration's, each
        state = r.patterns_of("optimizer_state_init")
        assert [(p.step, p.bytes) for p in state] == [(ran.index(True), 2 * grads)], how
        assert "2.00×" in state[0].explanation, how


def _made_by_backward_kept(snap: dict) -> int:
    """Bytes the per-sample gradient call allocates and that outlive it (from the raw events)."""
    lo, hi = _ranges(snap, r"gt::per_sample_grads")[0]
    tr = snap["device_traces"][0]
    alive = {}
    for e in tr[lo:hi]:
        if e["action"] == "alloc":
            alive[e["addr"]] = e["size"]
        elif e["action"] == "free_completed":
            alive.pop(e["addr"], None)
    return sum(alive.values())


def test_per_sample_gradients_are_not_gradients():
    """vmap(grad) makes batch x each parameter (1.78 GiB) on the autograd thread, freed after
    clipping; no .grad exists. Before: "gradients 1.78 GiB ... they stay until zero_grad", an
    inferred zero_grad phase, and 72 MiB of "parameters" (7.1 MiB of weights)."""
    snap = _snap("h9_per_sample_dpsgd")
    meta = snap["phasemem"]["meta"]
    assert _made_by_backward_kept(snap) >= 0.9 * meta["per_sample_bytes"]
    for how, r in marked_and_plain(snap):
        assert not r.patterns_of("gradients"), how
        assert r.by_category["gradient"] == 0, how
        assert r.by_category["parameter"] <= meta["param_bytes"], how
        assert "zero_grad" not in r.phases, how
    marked = marked_and_plain(snap)[0][1]
    # the hand-written momentum SGD's buffers, made on step 0 inside gt::optimizer: one per parameter
    assert [(p.step, p.bytes) for p in marked.patterns_of("optimizer_state_init")] == [(0, meta["param_bytes"])]


def test_an_evaluation_after_the_last_update_is_no_partial_step():
    """model.eval() + no_grad forwards after the 4th update: before, a fifth "partial" step and the
    note that the trace ends inside a step."""
    snap = _snap("h9_train_eval_interleaved")
    ends = _opt_ends(snap)
    evals = _ranges(snap, r"gt::eval\d+")
    assert len(ends) == snap["phasemem"]["meta"]["nsteps"] == 4 and evals[-1][0] >= ends[-1]
    for how, r in marked_and_plain(snap):
        assert [s.end_event + 1 for s in r.steps] == ends, how
        assert all(s.complete for s in r.steps), how
        assert not any("partial" in n for n in r.notes), how
    plain = marked_and_plain(snap)[1][1]
    assert any(n.startswith(f"events {ends[-1]}-") and "not a step" in n for n in plain.notes)


def test_two_backward_passes_and_routed_experts_are_one_step_each():
    """retain_graph=True then a second backward; an MoE whose per-expert sizes change every step."""
    for name, per_param in (("h9_multitask_retain_graph", 1), ("h9_moe_dynamic_routing", 2)):
        snap = _snap(name)
        for how, r in marked_and_plain(snap):
            assert [s.end_event + 1 for s in r.steps] == _opt_ends(snap), (name, how)
            made = [p for p in r.patterns_of("gradients") if p.phase == "backward"]
            assert [p.bytes for p in made] == [_param_bytes(snap)] * 3, (name, how)
            state = r.patterns_of("optimizer_state_init")
            assert [p.bytes for p in state] == [per_param * _param_bytes(snap)], (name, how)


def test_attention_scores_are_not_logits():
    """Written-out attention: (B, H, T, T) scores of 512 MiB per layer; a vocabulary of 256."""
    snap = _snap("h9_char_gpt_math_attention")
    meta = snap["phasemem"]["meta"]
    logits = meta["batch"] * meta["seq"] * meta["vocab"] * 4
    for how, r in marked_and_plain(snap):
        assert [s.end_event + 1 for s in r.steps] == _opt_ends(snap), how
        for kind in ("logits", "softmax_spike", "logits_release"):
            assert all(p.bytes <= 4 * logits for p in r.patterns_of(kind)), (how, kind)
        assert r.by_category["parameter"] == meta["param_bytes"], how


def test_a_host_side_optimizer_keeps_no_state_on_the_device():
    snap = _snap("h9_cpu_offload_optimizer")
    for how, r in marked_and_plain(snap):
        assert [s.end_event + 1 for s in r.steps] == _opt_ends(snap), how
        assert r.by_category["optimizer_state"] == 0 and not r.patterns_of("optimizer_state_init"), how
        assert r.by_category["parameter"] == r.by_category["gradient"] == _param_bytes(snap), how


def test_a_preallocated_kv_pool_is_not_parameters():
    """A 2 GiB pool allocated before recording, written in place by decode steps. Before: "parameters
    2.31 GiB" (257 MiB of weights)."""
    snap = _snap("h9_paged_kv_inference")
    meta = snap["phasemem"]["meta"]
    pool = [b["size"] for seg in snap["segments"] for b in seg["blocks"] if b["size"] == meta["pool_bytes"]]
    assert pool, "the pool is in the snapshot's segments"
    for how, r in marked_and_plain(snap):
        assert r.by_category["parameter"] < meta["pool_bytes"], how
        assert r.by_category["other"] >= meta["pool_bytes"], how
        assert r.by_category["parameter"] >= meta["param_bytes"], how
