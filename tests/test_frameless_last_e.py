"""The last frameless traces below 0.7 (docs/accuracy.md, "Third round, last traces"), read as
docs/eval_frameless.py reads them: every annotation and stack frame removed (tests/heldout_sets.bare).
Every test fails with its rule taken out.
"""
import numpy as np

from phasemem.read.trace import A
from phasemem.vocab import P

from test_frameless import _read, _share


def test_graphed_mse_step_is_read_from_its_seed():
    """torch.compile(mode="reduce-overhead") replays forward and backward as CUDA graphs and fused AdamW
    makes nothing: only the MSE loss (eager) and backward's seed and first gradient leave events.
    Without loss.seeded_steps the trace read as one inference request (0.44, 1 step of 3)."""
    truth, steps, trace, seg = _read("heldout8/h8_compile_reduce_overhead")
    assert len(seg.steps) == steps == 3
    assert _share(truth, seg.labels, "backward") == 1.0
    # every backward event read is one (its seed and gradient), and one run a step
    bwd = seg.labels == P["backward"]
    assert (truth[bwd] == P["backward"]).all()
    firsts = np.flatnonzero(bwd & ~np.roll(bwd, 1))
    assert len(firsts) == steps and (trace.action[firsts] == A["alloc"]).all()
    assert (trace.size[firsts] <= 8).all()  # each begins at the seed, a scalar
    # ... and the seed's pattern claims no training in an inference loop (generate, graphed decode)
    for rel in ("gpt_inference", "heldout12/h12_static_kv_decode", "heldout7/h7_decode_keeps_outputs",
                "heldout14/h14_compiled_infer_dynamic"):
        truth, _, _, seg = _read(rel)
        assert not (truth == P["backward"]).any()
        assert not (seg.labels == P["backward"]).any(), rel


def test_closure_seed_inside_an_optimizer_scalar():
    """LBFGS's step(closure) makes scalars and flat vectors before each closure and frees them after it:
    one such scalar's span holds the closure's backward, and the closure's seed, leaving those alive,
    was refused (seed.closure_seed). Without the rule the later evaluations' backward ran on through
    LBFGS's line search to the scalar's free (3 backward runs of 12 began elsewhere than their seed)."""
    truth, _, _, seg = _read("truth/truth_lbfgs")
    bwd, tb = seg.labels == P["backward"], truth == P["backward"]
    got = np.flatnonzero(bwd & ~np.roll(bwd, 1))
    want = np.flatnonzero(tb & ~np.roll(tb, 1))
    assert np.isin(got, want).all() and len(got) >= len(want) - 1
    assert float((truth[bwd] == P["backward"]).mean()) > 0.98


def test_every_closure_evaluation_before_a_top_is_a_backward():
    """LBFGS evaluates its closure several times a step; where two evaluations come before the next
    mountain's top, each is a backward of its own from its seed (seed.reseat's gap seeds, repeated).
    Without the repetition truth_lbfgs's second evaluation (300 events) read as 'other'."""
    truth, _, _, seg = _read("truth/truth_lbfgs")
    bwd, tb = seg.labels == P["backward"], truth == P["backward"]
    got = np.flatnonzero(bwd & ~np.roll(bwd, 1))
    want = np.flatnonzero(tb & ~np.roll(tb, 1))
    assert len(want) == 12 and np.array_equal(got, want)
    assert _share(truth, seg.labels, "backward") > 0.98


def test_zero_grad_between_closure_evaluations_begins_no_step():
    """A zero_grad's burst of gradient frees between two passes is no optimizer's update: LBFGS frees the
    gradients before each closure evaluation, a gradient-buffer loop before each micro-batch
    (lifetimes._temporaries_burst). Without it truth_lbfgs read 4 steps of 3, h16_accum_grad_buffers 12."""
    for rel in ("truth/truth_lbfgs", "heldout16/h16_accum_grad_buffers"):
        truth, steps, _, seg = _read(rel)
        assert len(seg.steps) == steps == 3, rel


def test_closure_forward_starts_after_the_optimizers_vectors():
    """LBFGS makes its flat direction vectors and line-search scalars before each closure and frees them
    after it: where they began the mountain, the forward starts at the seed's first saved block instead
    (seed._held_around). Without it the line search between evaluations read as forward (~760 events)."""
    truth, _, _, seg = _read("truth/truth_lbfgs")
    fwd = seg.labels == P["forward"]
    assert float((truth[fwd] == P["forward"]).mean()) > 0.98
    assert _share(truth, seg.labels, "forward") > 0.95


def test_flat_gradient_work_is_the_optimizer():
    """LBFGS works on one flat vector of every gradient, the bytes each zero_grad frees together: what
    allocates one between a backward and the next zero_grad is the optimizer (infer/flat_updates.py).
    Without it LBFGS's direction and line search (~1,200 events) read 'other'."""
    truth, _, _, seg = _read("truth/truth_lbfgs")
    opt = seg.labels == P["optimizer"]
    assert float((truth[opt] == P["optimizer"]).mean()) > 0.98
    assert _share(truth, seg.labels, "optimizer") > 0.85  # the last step's, no zero_grad after it, stays unknown
