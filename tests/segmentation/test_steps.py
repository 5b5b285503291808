"""Steps as the program ran them: a step ends where its last optimizer update ends; skipped updates,
rollouts, sampling and evaluations are no steps of their own or are said to be what they are; a
trace that opens or ends inside a step marks it partial.

Truth from the raw snapshot (its gt:: and Optimizer.step ranges, the stacks of its allocations) and
the recording's meta (the model's own byte counts), never from phasemem. The held-out recordings
(fixtures/heldoutN, fixtures/record_heldoutN.py) are analysed twice: with the gt:: ranges as markers,
and as a user would hand them over (helpers.analyses.marked_and_plain); the ../shared/wild ones as
published (helpers.wild).
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from helpers.analyses import marked_and_plain
from helpers.raw import event_ranges, in_gt_range, optimizer_ends, param_bytes, true_step_ends
from helpers.snapshots import heldout
from helpers.wild import PROGRAMS, wild_report


@pytest.mark.parametrize("name", sorted(n for n, t in PROGRAMS.items() if not t["backward"]))
def test_forward_only_runs_are_forward_and_one_step(name):
    r = wild_report(name)
    assert "backward" not in r.phases and "optimizer" not in r.phases
    assert len(r.steps) == 1
    # the forward passes are forward: most allocations are labelled so (sqattn's others move weights
    # to the GPU between layers: 'other'), and none a phase that never ran
    allocs = r.analysis.trace.action == 0
    assert set(r.labels[allocs]) <= {"forward", "other"}
    assert np.mean(r.labels[allocs] == "forward") >= 0.85
    assert any("forward passes only" in n for n in r.notes)


@pytest.mark.parametrize("name", ["h6_sparse_two_opt", "h6_optim_in_backward"])
def test_a_step_ends_at_its_last_optimizer_range(name):
    """Two optimizers stepped one after the other, and an optimizer stepped per parameter inside
    backward (53 Optimizer.step ranges a step on the autograd thread), are one step each time: the
    step ends where the last Optimizer.step of the gt::step range ends (was 6 and 159 steps)."""
    snap = heldout(name)
    want = true_step_ends(snap)
    assert len(want) == 3
    for how, r in marked_and_plain(name):
        assert [s.end_event + 1 for s in r.steps] == want, how
        assert all(s.complete for s in r.steps), how


def test_ppo_rollouts_are_not_steps():
    snap = heldout("h6_ppo")
    want = true_step_ends(snap)
    assert len(want) == snap["phasemem"]["meta"]["nsteps"] == 16
    for how, r in marked_and_plain("h6_ppo"):
        assert [s.end_event + 1 for s in r.steps] == want, how


def test_wrapped_ring_numbers_the_steps_it_kept_and_says_so():
    """max_entries=2500 kept the end of a 6-step run: the steps are numbered as the loop numbered them
    (the gt::stepN ranges that end inside the kept events), and the baseline is not called memory
    from before recording."""
    snap = heldout("h7_ring_wrapped")
    t0 = snap["device_traces"][0][0]["time_us"]
    ends = {}
    for a in snap["external_annotations"]:
        m = re.fullmatch(r"gt::step(\d+)", a["name"])
        if m and a["stage"] == "END":
            ends[int(m.group(1))] = a["time_us"]
    kept = sorted(k for k, t in ends.items() if t >= t0)
    assert kept[0] > 0 and len(kept) < snap["phasemem"]["meta"]["nsteps"]
    for how, r in marked_and_plain("h7_ring_wrapped"):
        assert [s.number for s in r.steps] == kept, how
        assert not r.steps[0].complete and all(s.complete for s in r.steps[1:]), how
        line = str(r).splitlines()[1]
        assert "before the trace's first event (the ring buffer dropped" in line and "before recording" not in line, how


def test_a_trace_opened_inside_a_step_marks_it_partial():
    """Recording began after step 1's forward: the first step has no forward and is partial; the
    zero_grad it runs is given no advice about a forward it cannot see."""
    snap = heldout("h8_mid_step_start")
    want = optimizer_ends(snap)
    for how, r in marked_and_plain("h8_mid_step_start"):
        assert [s.end_event + 1 for s in r.steps] == want, how
        assert [s.complete for s in r.steps] == [False] + [True] * (len(want) - 1), how
        first = [p for p in r.patterns_of("gradients") if p.step == 0 and p.phase == "zero_grad"]
        assert first and "forward" not in first[0].explanation, how


def test_sampling_before_each_update_is_no_step():
    snap = heldout("h8_generate_then_train")
    meta = snap["phasemem"]["meta"]
    logits = meta["batch"] * meta["seq"] * meta["vocab"] * 4  # the update's forward on the sampled sequences
    for how, r in marked_and_plain("h8_generate_then_train"):
        assert [s.end_event + 1 for s in r.steps] == optimizer_ends(snap), how
        assert {p.bytes for p in r.patterns_of("logits")} == {logits}, how


def test_skipped_updates_are_steps_of_their_own():
    """GradScaler(init_scale=2**40) overflows twice: no optimizer.step() in the first two of five
    iterations, a zero_grad freeing their gradients each time. Before: 3 steps, the first holding
    three iterations, "gradients 384 MiB in all" and "optimizer state 0.67x the gradients"."""
    snap = heldout("h9_scaler_skips_first")
    ran = snap["phasemem"]["meta"]["optimizer_ran"]
    backward, forward = event_ranges(snap, r"gt::backward"), event_ranges(snap, r"gt::forward")
    assert len(backward) == len(forward) == len(ran) == 5
    ends = iter(optimizer_ends(snap))
    grads = param_bytes(snap)
    for how, r in marked_and_plain("h9_scaler_skips_first"):
        assert len(r.steps) == len(ran), how
        for k, s in enumerate(r.steps):
            # a step holds its iteration's backward, and the next one's forward is not in it
            assert s.start_event <= backward[k][0] and backward[k][1] - 1 <= s.end_event, (how, k)
            if k + 1 < len(ran):
                assert s.end_event < forward[k + 1][0], (how, k)
            if ran[k]:
                assert s.end_event + 1 == next(ends), (how, k)
        ends = iter(optimizer_ends(snap))
        skipped = [k for k, did in enumerate(ran) if not did]
        note = [n for n in r.notes if "ran no optimizer update" in n]
        assert note and note[0].startswith("step(s) " + ", ".join(map(str, skipped)) + " "), how
        made = [p for p in r.patterns_of("gradients") if p.phase == "backward"]
        assert [p.step for p in made] == list(range(len(ran))), how
        assert all(p.bytes == grads for p in made), how  # one iteration's, each
        state = r.patterns_of("optimizer_state_init")
        assert [(p.step, p.bytes) for p in state] == [(ran.index(True), 2 * grads)], how
        assert "2.00×" in state[0].explanation, how


def test_an_evaluation_after_the_last_update_is_no_partial_step():
    """model.eval() + no_grad forwards after the 4th update: before, a fifth "partial" step and the
    note that the trace ends inside a step."""
    snap = heldout("h9_train_eval_interleaved")
    ends = optimizer_ends(snap)
    evals = event_ranges(snap, r"gt::eval\d+")
    assert len(ends) == snap["phasemem"]["meta"]["nsteps"] == 4 and evals[-1][0] >= ends[-1]
    for how, r in marked_and_plain("h9_train_eval_interleaved"):
        assert [s.end_event + 1 for s in r.steps] == ends, how
        assert all(s.complete for s in r.steps), how
        assert not any("partial" in n for n in r.notes), how
    plain = marked_and_plain("h9_train_eval_interleaved")[1][1]
    assert any(n.startswith(f"events {ends[-1]}-") and "not a step" in n for n in plain.notes)


def test_two_backward_passes_and_routed_experts_are_one_step_each():
    """retain_graph=True then a second backward; an MoE whose per-expert sizes change every step."""
    for name, per_param in (("h9_multitask_retain_graph", 1), ("h9_moe_dynamic_routing", 2)):
        snap = heldout(name)
        for how, r in marked_and_plain(name):
            assert [s.end_event + 1 for s in r.steps] == optimizer_ends(snap), (name, how)
            made = [p for p in r.patterns_of("gradients") if p.phase == "backward"]
            assert [p.bytes for p in made] == [param_bytes(snap)] * 3, (name, how)
            state = r.patterns_of("optimizer_state_init")
            assert [p.bytes for p in state] == [per_param * param_bytes(snap)], (name, how)


def test_a_forward_only_last_step_is_said_to_be_either_cut_or_an_evaluation():
    """The validation after the last update keeps its graph, so with torch's annotations alone it
    reads as a fifth, partial step; the report says it may be either."""
    snap = heldout("h13_eval_graph_leak")
    (_, marked), (_, plain) = marked_and_plain("h13_eval_graph_leak")
    assert len(marked.steps) == 4 and not any("forward passes only (events" in n for n in marked.notes)
    last = plain.steps[-1]
    assert not last.complete
    assert in_gt_range(snap, "eval3")[last.start_event + 3:last.end_event - 3].all()
    said = [n for n in plain.notes if "forward passes only (events" in n]
    assert len(said) == 1 and f"step {last.number} " in said[0] and "evaluation" in said[0]
