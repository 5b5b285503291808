"""Frameless traces whose optimizer step the lifetimes did not find, or took for another phase
(docs/accuracy.md, "Third round: optimizer not seen"). Truth is each trace's own marks; the inferred
reading is the same snapshot with every annotation and stack frame removed, as docs/eval_frameless.py
scores it. Every test fails with its rule taken out.
"""
from test_frameless import _read, _share


def test_a_compile_between_backward_and_the_last_frees_is_no_recompute():
    """h16_compiled_fused compiles its fused AdamW in the first step, between the backward and the frees
    of the batch and the kept loss, 50,000 events later: its small blocks looked like a checkpointed
    block's recompute, so the backward ran to those frees and swallowed the optimizer
    (passes.RECOMPUTE_SPAN): 0.06 of the events right."""
    truth, _, _, seg = _read("heldout16/h16_compiled_fused")
    assert _share(truth, seg.labels, "optimizer") > 0.95
    assert _share(truth, seg.labels, "backward") > 0.95
