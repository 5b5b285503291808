"""Gradient accumulation: micro-batches counted where several backwards add into one step's gradients;
losses summed before one backward are no accumulation.

Truth from the raw snapshot (its gt:: and Optimizer.step ranges, the stacks of its allocations) and
the recording's meta (the model's own byte counts), never from phasemem. The held-out recordings
(fixtures/heldoutN, fixtures/record_heldoutN.py) are analysed twice: with the gt:: ranges as markers,
and as a user would hand them over (helpers.analyses.marked_and_plain); the ../shared/wild ones as
published (helpers.wild).
"""
from __future__ import annotations

from helpers.analyses import marked_and_plain, not_released
from helpers.snapshots import heldout


def test_accumulation_counts_its_micro_batches():
    snap = heldout("h16_accum4")
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain("h16_accum4"):
        acc = not_released(r, "gradient_accumulation")
        assert len(acc) == meta["nsteps"] and all(p.details["microbatches"] == meta["micro_batches"] for p in acc), how
        assert all(p.bytes == meta["param_bytes"] for p in not_released(r, "gradients")), how


def test_summed_losses_are_one_backward():
    """Four forwards, their losses summed, one backward: no accumulation of gradients across passes."""
    snap = heldout("h16_accum_loss_sum")
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain("h16_accum_loss_sum"):
        assert not not_released(r, "gradient_accumulation"), how
        grads = not_released(r, "gradients")
        assert len(grads) == meta["nsteps"] and all(p.bytes == meta["param_bytes"] for p in grads), how
