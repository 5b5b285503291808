"""Forward found from lifetimes alone: where it starts, and the work around it that is no forward (the
next step's data, a teacher's no-grad forward, an evaluation).

Each rule on the real trace that showed the need for it. A trace's truth is its own marks (phasemem::
or gt::); the reading is the same snapshot with every annotation and stack frame removed
(helpers.snapshots.bare), segmented from lifetimes alone, as docs/eval_frameless.py scores it
(helpers.frameless). Every test fails with its rule taken out (docs/accuracy.md, "Frameless, over every
marked trace" and "Third round").
"""
import numpy as np

from helpers.frameless import frameless, share
from phasemem.vocab import P


def test_a_frozen_teachers_forward_in_the_first_step():
    """Distillation: the frozen teacher's no-grad forward saves nothing; after each update it is the
    forward work before the student's pass, and the first step is made like the others
    (lifetimes._label_before_first): step 0's teacher forward was 'other'."""
    truth, _, _, seg = frameless("heldout3/heldout3_distill_kl")
    first_fwd = np.flatnonzero(truth == P["forward"])
    first_fwd = first_fwd[first_fwd < np.flatnonzero(truth == P["backward"])[0]]
    assert np.mean(seg.labels[first_fwd] == P["forward"]) > 0.95


def test_gradients_overrule_passes_whose_tops_fell_in_backward():
    """A weight-normed tiny model: backward's temporaries outweigh the forward's activations, so the
    first pass's top fell in the next step's backward (0.45 of what was called forward was forward). The
    gradients' sets explain 1.18 times as many saved activations and replace the passes
    (lifetimes.EXPLAINS). Since infer/seed.py, each pass's seed moves its top back to the loss, and
    the passes need no replacing; the loss they find is forward to gt:: marks (as docs/eval_frameless.py
    scores it)."""
    truth, steps, _, seg = frameless("heldout8/h8_weight_norm")
    assert len(seg.steps) == steps == 3
    got = np.where(seg.labels == P["loss"], P["forward"], seg.labels)
    said = got == P["forward"]
    assert np.mean(truth[said] == P["forward"]) > 0.7
    assert share(truth, got, "forward") > 0.95 and share(truth, got, "optimizer") > 0.9


def test_no_optimizer_before_the_first_pass_of_an_inference_trace():
    """An inference loop that offloads its layers frees each layer's weights in bursts before the first
    pass; read as a wrapped ring buffer's last optimizer, 564 events of forward were called optimizer
    (and doubted). An optimizer before the first pass only where some pass trains (lifetimes._label_passes)."""
    truth, _, _, seg = frameless("heldout13/h13_layer_offload_infer")
    assert len(seg.steps) == 1  # inference: nothing tells which forward calls make one request
    assert not (seg.labels == P["optimizer"]).any()
    assert share(truth, seg.labels, "forward") > 0.95


def test_closure_forward_starts_after_the_optimizers_vectors():
    """LBFGS makes its flat direction vectors and line-search scalars before each closure and frees them
    after it: where they began the mountain, the forward starts at the seed's first saved block instead
    (seed._held_around). Without it the line search between evaluations read as forward (~760 events)."""
    truth, _, _, seg = frameless("truth/truth_lbfgs")
    fwd = seg.labels == P["forward"]
    assert float((truth[fwd] == P["forward"]).mean()) > 0.98
    assert share(truth, seg.labels, "forward") > 0.95


def test_the_next_steps_data_is_no_evaluation_forward():
    """GraphSAGE samples each step's neighbourhoods between the previous update and its forward (126
    events a step, marked 'other'), and keeps 8-9 of their blocks until that step's update is done. That
    work was read as an evaluation forward after each update, and the first step's as its like
    (lifetimes._label_before_first): 0.53 of the events right. The next step's data, held through its
    pass and freed after it in a burst, is no forward (other_work.held_for_step)."""
    truth, steps, _, seg = frameless("heldout16/h16_graphsage_sampled")
    assert len(seg.steps) == steps == 3
    sampled = truth == P["other"]
    assert float((seg.labels[sampled] == P["forward"]).mean()) < 0.05
    assert float((seg.labels == truth).mean()) >= 0.7


def test_a_teachers_forward_after_the_crops_stays_forward():
    """DINO makes its multi-crop batch, then runs its teacher's no-grad forward before the student's pass;
    the crops are held until the update, as sampled data is, but they are few of what that work makes
    (4 of 84: other_work.HELD_SHARE): the teacher's forward, marked so, stays forward."""
    truth, steps, _, seg = frameless("heldout16/h16_dino_multicrop")
    assert len(seg.steps) == steps == 3
    assert share(truth, seg.labels, "forward") > 0.85  # 0.78 without HELD_SHARE


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
    truth, steps, _, seg = frameless("heldout15/h15_gradcache_contrastive")
    assert len(seg.steps) == steps == 3
    runs = _no_grad_forwards(seg, truth)
    assert len(runs) == 3 and min(runs[1:]) > 0.95


def test_gradcache_first_no_grad_forward_is_forward():
    """... and the first step's, before the first chunk, is its like (lifetimes._label_before_first):
    every later step's first chunk follows such a forward, and it repeats the first chunk's sizes
    (0.93), though the chunks between follow none."""
    truth, steps, _, seg = frameless("heldout15/h15_gradcache_contrastive")
    assert _no_grad_forwards(seg, truth)[0] > 0.95
    assert float((seg.labels == truth).mean()) >= 0.7


def test_sampled_neighbourhoods_are_not_the_forward():
    """GraphSAGE samples each step's neighbourhoods long before its forward and frees them after Adam:
    one such block alive across the top began the forward 126 events early (passes.forward_start only
    drops stragglers from passes saving 13 blocks or more; this one saves 12). Held past backward and
    followed by a quiet stretch, it is no activation (odd_steps.held_start)."""
    truth, steps, _, seg = frameless("heldout16/h16_graphsage_sampled")
    assert len(seg.steps) == steps == 3
    fwd = seg.labels == P["forward"]
    assert float((truth[fwd] == P["other"]).mean()) < 0.05
