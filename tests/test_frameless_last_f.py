"""The last frameless traces below 0.7 (issue #32; docs/accuracy.md, "Third round, last traces:
h16_graphsage_sampled, h15_gradcache_contrastive"), each read as docs/eval_frameless.py reads it: every
annotation and stack frame removed (tests/heldout_sets.bare). Every test fails with its rule taken out.
"""
import numpy as np

from phasemem.vocab import P

from helpers.frameless import frameless as _read, share as _share


def test_the_next_steps_data_is_no_evaluation_forward():
    """GraphSAGE samples each step's neighbourhoods between the previous update and its forward (126
    events a step, marked 'other'), and keeps 8-9 of their blocks until that step's update is done. That
    work was read as an evaluation forward after each update, and the first step's as its like
    (lifetimes._label_before_first): 0.53 of the events right. The next step's data, held through its
    pass and freed after it in a burst, is no forward (other_work.held_for_step)."""
    truth, steps, _, seg = _read("heldout16/h16_graphsage_sampled")
    assert len(seg.steps) == steps == 3
    sampled = truth == P["other"]
    assert float((seg.labels[sampled] == P["forward"]).mean()) < 0.05
    assert float((seg.labels == truth).mean()) >= 0.7


def test_a_teachers_forward_after_the_crops_stays_forward():
    """DINO makes its multi-crop batch, then runs its teacher's no-grad forward before the student's pass;
    the crops are held until the update, as sampled data is, but they are few of what that work makes
    (4 of 84: other_work.HELD_SHARE): the teacher's forward, marked so, stays forward."""
    truth, steps, _, seg = _read("heldout16/h16_dino_multicrop")
    assert len(seg.steps) == steps == 3
    assert _share(truth, seg.labels, "forward") > 0.85  # 0.78 without HELD_SHARE


def _no_grad_forwards(seg, truth):
    """For each run of events the marks call forward (GradCache's no-grad forwards: one a step), the share
    read so."""
    fwd = np.concatenate([[0], (truth == P["forward"]).astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(fwd))
    return [float((seg.labels[a:b] == P["forward"]).mean()) for a, b in zip(edges[::2], edges[1::2])]


def test_gradcache_no_grad_forward_after_an_update_is_forward():
    """GradCache runs a no-grad forward over every chunk after each update, then each chunk's forward and
    backward again: longer than an evaluation forward (pass_labels.EVAL_SPAN), it was left 'other' (0.21
    of h15_gradcache_contrastive's events). It allocates the sizes the chunks' forwards do (0.99 of its
    allocations): the step's forward (infer/cached.repeats_forward)."""
    truth, steps, _, seg = _read("heldout15/h15_gradcache_contrastive")
    assert len(seg.steps) == steps == 3
    runs = _no_grad_forwards(seg, truth)
    assert len(runs) == 3 and min(runs[1:]) > 0.95


def test_gradcache_first_no_grad_forward_is_forward():
    """... and the first step's, before the first chunk, is its like (lifetimes._label_before_first):
    every later step's first chunk follows such a forward, and it repeats the first chunk's sizes
    (0.93), though the chunks between follow none."""
    truth, steps, _, seg = _read("heldout15/h15_gradcache_contrastive")
    assert _no_grad_forwards(seg, truth)[0] > 0.95
    assert float((seg.labels == truth).mean()) >= 0.7


def test_sparse_adam_begins_the_update():
    """SparseAdam coalesces the embedding's sparse gradient (blocks of the sizes of its values and indices,
    which the backward made and zero_grad frees) before the dense Adam allocates a parameter's size: 51
    events a step read 'other' (updates.sparse_update_start)."""
    truth, steps, _, seg = _read("heldout16/h16_graphsage_sampled")
    assert _share(truth, seg.labels, "optimizer") > 0.9
    opt = seg.labels == P["optimizer"]
    assert float((truth[opt] == P["optimizer"]).mean()) > 0.8


def test_gradcache_chunks_after_the_no_grad_forward_are_backward():
    """After GradCache's no-grad forward, each chunk's forward is run again with grad and backward with the
    cached gradients: the marks call all of it, up to the update, backward. Each chunk read as a pass of
    its own, its forward and surrogate loss ~110 events, 16 a step (cached.label_reforwards)."""
    truth, steps, _, seg = _read("heldout15/h15_gradcache_contrastive")
    assert _share(truth, seg.labels, "backward") > 0.95
    bwd = seg.labels == P["backward"]
    assert float((truth[bwd] == P["backward"]).mean()) > 0.95
