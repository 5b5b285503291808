"""Steps found from lifetimes alone: micro-batches, closure evaluations and a wrapped start belong to one
step; updates between forwards end one.

Each rule on the real trace that showed the need for it. A trace's truth is its own marks (phasemem::
or gt::); the reading is the same snapshot with every annotation and stack frame removed
(helpers.snapshots.bare), segmented from lifetimes alone, as docs/eval_frameless.py scores it
(helpers.frameless). Every test fails with its rule taken out (docs/accuracy.md, "Frameless, over every
marked trace" and "Third round").
"""
import numpy as np

from helpers.frameless import frameless
from phasemem.vocab import P


def test_updates_between_forwards_end_steps():
    """FSDP2's all-gathers hide the backward from the lifetimes; AdamW's bursts between the forwards
    still end each step (segmentation.steps_from_labels._updates_between_forwards): 3 steps, not 1."""
    truth, steps, _, seg = frameless("heldout4/heldout4_gpt_fsdp2_bf16")
    assert len(seg.steps) == steps == 3
    # each step ends where the marked one does, within its optimizer's last events
    ends = np.flatnonzero(np.diff((truth == P["optimizer"]).astype(int)) == -1) + 1
    assert all(abs(b - e) <= 16 for (_, b, _), e in zip(seg.steps[:-1], ends))


def test_micro_batches_adding_to_their_steps_gradients_are_one_step():
    """A pass whose backward adds to gradients its step already made (made before it, freed after it by
    zero_grad, no new set kept) is a micro-batch of that step, however far apart the passes are and
    whatever bursts come between (odd_steps.accumulates): h16_accum4_mlp's four micro-batches a step were
    read as 9 steps, GradCache's 16 chunks a step as 49."""
    truth, steps, _, seg = frameless("heldout16/h16_accum4_mlp")
    assert len(seg.steps) == steps == 3
    _, steps, _, seg = frameless("heldout15/h15_gradcache_contrastive")
    assert steps == 3 and len(seg.steps) <= steps + 1


def test_a_wrapped_start_is_made_of_parameter_sized_blocks():
    """Burst frees before the first pass are the end of an optimizer (the ring buffer wrapped mid-step)
    only where what is made there has the parameters' sizes (odd_steps.update_sized): GradCache's no-grad
    forward over all chunks and an out-of-memory retry's first attempt free in bursts too, and each was
    read as a partial step of its own."""
    for rel in ("heldout15/h15_gradcache_contrastive", "heldout13/h13_oom_retry_halve"):
        _, steps, _, seg = frameless(rel)
        assert len(seg.steps) == steps == 3, rel
    truth, steps, _, seg = frameless("gpt_wrapped")
    assert len(seg.steps) == steps == 2
    first = seg.steps[1][0]  # ... and its real wrapped start still reads as the optimizer
    opt = seg.labels[:first] == P["optimizer"]
    assert opt.any() and float((truth[:first][opt] == P["optimizer"]).mean()) > 0.9


def test_zero_grad_between_closure_evaluations_begins_no_step():
    """A zero_grad's burst of gradient frees between two passes is no optimizer's update: LBFGS frees the
    gradients before each closure evaluation, a gradient-buffer loop before each micro-batch
    (lifetimes._temporaries_burst). Without it truth_lbfgs read 4 steps of 3, h16_accum_grad_buffers 12."""
    for rel in ("truth/truth_lbfgs", "heldout16/h16_accum_grad_buffers"):
        truth, steps, _, seg = frameless(rel)
        assert len(seg.steps) == steps == 3, rel
