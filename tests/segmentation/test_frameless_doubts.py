"""Doubts: where the reading from lifetimes contradicts itself, its phases are less sure and the report
says why (segmentation.inferred.find_doubts, DOUBTFUL).

Each rule on the real trace that showed the need for it. A trace's truth is its own marks (phasemem::
or gt::); the reading is the same snapshot with every annotation and stack frame removed
(helpers.snapshots.bare), segmented from lifetimes alone, as docs/eval_frameless.py scores it
(helpers.frameless). Every test fails with its rule taken out (docs/accuracy.md, "Frameless, over every
marked trace" and "Third round").
"""
import numpy as np

from helpers.analyses import analyzed
from helpers.frameless import frameless
from helpers.paths import FIXTURES
from phasemem.vocab import P


def test_doubts_lower_confidence_where_the_reading_contradicts_itself():
    """PPO's rollouts and updates make steps of different orders of phases: the inferred forward and
    optimizer say so (segmentation.inferred.find_doubts, DOUBTFUL), while a plain loop keeps CONFIDENCE.
    (FSDP2 was this test's trace until infer/seed.py placed its backward, then GRPO until
    infer/other_work.py read its rollouts: test_frameless_backward.py, test_frameless_other_work.py.)"""
    from phasemem.analysis.segmentation.inferred import CONFIDENCE, DOUBTFUL
    truth, _, _, seg = frameless("heldout6/h6_ppo")
    assert seg.doubts
    assert seg.confidence["forward"] == DOUBTFUL["forward"] and seg.confidence["optimizer"] == DOUBTFUL["optimizer"]
    # and they are that unsure: under half of what it calls optimizer is
    assert np.mean(truth[seg.labels == P["optimizer"]] == P["optimizer"]) < 0.5
    _, _, _, plain = frameless("heldout4/heldout4_gpt_ddp")
    assert not plain.doubts and plain.confidence["forward"] == CONFIDENCE["lifetimes"]["forward"]


def test_steps_in_different_orders_are_doubted():
    """WGAN-GP's critic and generator turns make steps of different orders of phases: a guess, said so
    (segmentation.inferred.find_doubts); a loop accumulating 4 micro-batches a step is not doubted.
    (LBFGS's closure evaluations, once read as steps of 2, 4 and 3 backward runs, now make its 3 steps of
    4 each: test_frameless_steps.py, test_frameless_backward.py.)"""
    _, _, _, seg = frameless("heldout5/h5_wgan_gp")
    assert any("order" in d for d in seg.doubts)
    _, _, _, seg = frameless("heldout2/heldout2_gpt_accum4_bf16_clip")
    assert not seg.doubts


def test_the_report_says_its_doubts():
    """The doubts are said in the report's notes, not only scored in confidence: the WGAN's turns
    (doubted) and a plain accumulation loop (not)."""
    for rel, doubted in (("heldout5/h5_wgan_gp", True), ("heldout2/heldout2_gpt_accum4_bf16_clip", False)):
        notes = analyzed(FIXTURES / f"{rel}.pkl.xz", "bare").notes
        said = [n for n in notes if n.startswith("the inferred phases are uncertain")]
        assert bool(said) == doubted, (rel, notes)
        if doubted:
            assert "order of phases" in said[0]


def test_gradients_overruling_passes_with_other_steps_is_doubted():
    """PPO's epochs: passes read 7 steps of 16; the gradients' sets, one per update, count 16 and
    replace them (lifetimes.EXPLAINS). The two readings disagree on what a step is, so the phases stay
    doubted (lifetimes.anchored_over_passes)."""
    truth, steps, _, seg = frameless("heldout6/h6_ppo")
    assert len(seg.steps) == steps == 16
    said = seg.labels == P["forward"]
    assert np.mean(truth[said] == P["forward"]) > 0.8
    from phasemem.analysis.segmentation.inferred import CONFIDENCE, DOUBTFUL
    assert seg.doubts and seg.confidence["optimizer"] == DOUBTFUL["optimizer"] < CONFIDENCE["lifetimes"]["optimizer"]
