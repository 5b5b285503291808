"""Backward placed by its seed (infer/seed.py; docs/accuracy.md, "Third round: backward without an
anchor"), each rule on the real trace that showed the need for it. A trace's truth is its own marks;
the inferred reading is the same snapshot with every annotation and stack frame removed
(tests/heldout_sets.bare), as docs/eval_frameless.py scores it. Every test fails with its rule taken out.
"""
import numpy as np

from phasemem.analysis.spans import phase_runs
from phasemem.vocab import P

from test_frameless import _read, _share


def _accuracy(truth, got, gt: bool = True) -> float:
    """Share of events labelled as marked; with ``gt`` (gt:: marks, whose forward spans the loss) a loss
    counts as forward, as docs/eval_frameless.py scores it."""
    return float((truth == (np.where(got == P["loss"], P["forward"], got) if gt else got)).mean())


def _backward_runs(labels) -> list[tuple[int, int]]:
    first, last, code, _ = phase_runs(labels, np.zeros(len(labels), np.int32))
    return [(int(a), int(b)) for a, b, c in zip(first, last, code) if c == P["backward"]]


def test_a_mountain_inside_backward_is_read_from_its_seed():
    """FSDP2 all-gathers each layer's weights again in backward: the live bytes top out at backward's
    end, and the only mountain lies in backward. Its seed (the loss's gradient, made after the loss,
    freed as backward's last act) starts backward; what it frees of the forward starts the forward
    (seed.reseat). Before: 0.01 of the events right, the mountain read as a CUDA-graphed step."""
    truth, steps, _, seg = _read("fsdp2/fsdp2_plain")
    assert len(seg.steps) == steps == 3
    assert _backward_runs(seg.labels) == _backward_runs(truth)
    assert _share(truth, seg.labels, "forward") > 0.95


def test_flat_gradients_of_a_seeded_backward_are_gradients():
    """FSDP2 with bf16 parameters makes one flat gradient a layer, of no parameter's size, so nothing
    said its passes made gradients (0.40 right, doubted). A seeded backward whose blocks outlive it
    and go to zero_grad's burst made gradients (seed.seeded_gradients)."""
    truth, steps, _, seg = _read("heldout4/heldout4_gpt_fsdp2_bf16")
    assert len(seg.steps) == steps == 3 and not seg.doubts
    assert _backward_runs(seg.labels) == _backward_runs(truth)
    assert _accuracy(truth, seg.labels) > 0.95


def test_retain_graph_backward_calls_chain_and_the_loss_value_is_no_seed():
    """Two losses, two backward() calls on a retained graph, one right after the other: the second
    seed follows the first's free at once and continues the backward (seed._chain). The second loss,
    made right after the first, outlives both calls; its span holds the seeds' and is no seed. A tiny
    MLP saves four activations: a seed marks a backward however few it frees. Before: 0.23 right."""
    truth, steps, _, seg = _read("heldout9/h9_multitask_retain_graph")
    assert len(seg.steps) == steps == 3
    assert _share(truth, seg.labels, "backward") > 0.95
    said = seg.labels == P["backward"]
    assert np.mean(truth[said] == P["backward"]) > 0.95


def test_a_loss_of_scalar_ops_does_not_chain_into_the_seed():
    """heldout3_distill_kl's loss (KL divergence and cross-entropy) frees a scalar and allocates the next
    at once, the seed among them: its scalars chain into the loss value the loop keeps, whose span holds
    the seed's and two steps' backward. A span holding another's is no seed (seed._best_seed)."""
    truth, steps, _, seg = _read("heldout3/heldout3_distill_kl")
    assert len(seg.steps) == steps == 3
    assert _backward_runs(seg.labels) == _backward_runs(truth)


def test_a_backward_no_mountain_showed_is_found_by_its_seed():
    """MoCo's queue logits outweigh a tiny encoder's activations: no mountain shows the first step,
    and the next mountains begin in the backward before them. A seed before a pass's top that frees,
    last made first, MIN_GAP_SAVED blocks and makes gradients is a pass of its own (seed._gap_seed).
    Before: 0.55 right."""
    truth, steps, _, seg = _read("heldout10/h10_moco_queue")
    assert len(seg.steps) == steps == 3
    assert _backward_runs(seg.labels) == _backward_runs(truth)


def test_a_gap_seed_must_free_as_a_backward_does():
    """odd_cudagraph's steps are CUDA graphs (no pass); a scalar among its optimizer's temporaries frees
    them as made, not last made first, and is no backward's seed."""
    truth, steps, _, seg = _read("odd_cudagraph")
    assert len(seg.steps) == steps == 3
    assert _accuracy(truth, seg.labels, gt=False) > 0.9


def test_mountains_without_seed_or_backward_are_no_passes_where_seeds_placed_backward():
    """8-bit Adam's and Shampoo's temporaries make mountains of their own after backward; once seeds place
    the backward runs, a mountain with neither seed nor backward's frees is the optimizer's, not an
    evaluation forward (h16_adam8bit 0.15 right before, h10_shampoo_subclass 0.87)."""
    for rel in ("heldout16/h16_adam8bit", "heldout10/h10_shampoo_subclass"):
        truth, steps, _, seg = _read(rel)
        assert len(seg.steps) == steps == 3, rel
        assert _share(truth, seg.labels, "optimizer") > 0.9, rel


def test_a_fingerprint_far_before_the_seed_is_no_loss():
    """A PINN's forward calls autograd.grad, whose own seed follows a cross-entropy-like fingerprint 75
    events before the loss: where a seed placed backward, only a fingerprint ending at it is the loss
    (seed.seeded_loss); else backward began at the inner autograd.grad (0.84 right)."""
    truth, _, _, seg = _read("heldout14/h14_pinn_second_order")
    assert _accuracy(truth, seg.labels) > 0.95
    assert _backward_runs(seg.labels) == _backward_runs(truth)


def test_seeded_passes_stand_against_the_gradients_sets():
    """h5_vae_handadam's gradients' sets explain 1.2 times the saved activations its seeded passes do
    (lifetimes.EXPLAINS) but start backward 29 events late; passes whose every backward run begins at a
    seed, as many as the sets', stand (seed.all_seeded)."""
    truth, _, _, seg = _read("heldout5/h5_vae_handadam")
    assert _backward_runs(seg.labels) == _backward_runs(truth)


def test_a_loop_s_batch_freed_in_a_burst_is_not_left_alive_by_the_seed():
    """An EmbeddingBag loop frees its 18-block batch in a burst after the optimizer: counted as left
    alive by the seed (beside 22 activations it frees) it refused the seed (heldout_embbag_adagrad 0.54)."""
    truth, steps, _, seg = _read("heldout/heldout_embbag_adagrad")
    assert len(seg.steps) == steps == 3
    assert _backward_runs(seg.labels) == _backward_runs(truth)


def test_the_loss_s_scalars_are_no_seed_of_a_checkpointed_backward():
    """A checkpointed llama: a scalar of the loss frees 33 of the loss's temporaries and leaves the 9
    checkpointed inputs alive; the seed frees 11 and leaves none. The seed is the one that frees the
    most for each left alive; the recompute's mountain inside its backward is part of it."""
    truth, steps, _, seg = _read("pairs2/llama__ckpt_1")
    assert len(seg.steps) == steps == 3
    assert _backward_runs(seg.labels) == _backward_runs(truth)


def test_generate_after_the_optimizer_is_no_evaluation_forward():
    """With its backward ending at its seed's free, h8_generate_then_train's optimizer is found, and the
    generate() loop after it (25 passes' events) was taken for an evaluation forward: 0.05 right. An
    evaluation forward is no longer than EVAL_SPAN passes (pass_labels.label_after_backward)."""
    truth, _, _, seg = _read("heldout8/h8_generate_then_train")
    assert _accuracy(truth, seg.labels) > 0.95


def test_a_scalar_made_as_backward_ends_continues_it_only_if_it_frees_the_forward():
    """SigLIP's optimizer allocates a scalar the very event after the seed's free: read as a second
    backward() call it swallowed the optimizer (0.91 right). A chained scalar must free some block made
    before the first seed, as a second call through the same forward does (seed._chain)."""
    truth, _, _, seg = _read("heldout16/h16_siglip")
    assert _backward_runs(seg.labels) == _backward_runs(truth)


def test_the_loss_fingerprint_is_searched_past_the_seed():
    """heldout_cnn_bn_nesterov runs zero_grad between its loss and backward(): cross-entropy's fingerprint
    places backward's start 5 allocations after the seed, beyond what a search up to the seed sees; the
    loss then went unnamed (forward to the seed)."""
    truth, _, _, seg = _read("heldout/heldout_cnn_bn_nesterov")
    assert _share(truth, seg.labels, "loss") > 0.95


def test_a_backward_whose_forward_predates_the_trace_is_found_by_its_seed():
    """h8_mid_step_start's ring buffer wrapped mid-step: it opens with zero_grad and a whole backward whose
    forward (and loss value) came before the trace. A scalar among the allocations before the first pass
    that frees blocks older than the trace and keeps gradients seeds it (seed._leading_seed); it was read
    as the optimizer (0.79 right)."""
    truth, steps, _, seg = _read("heldout8/h8_mid_step_start")
    assert len(seg.steps) == steps == 4
    assert _backward_runs(seg.labels) == _backward_runs(truth)


def test_a_backward_that_frees_nothing_on_the_gpu_is_found_by_the_mountains_it_holds():
    """save_on_cpu moves what the forward saves to the host: the seed frees none of the forward's GPU
    blocks, and backward brings the saved tensors back layer by layer, a mountain each. A seed whose span
    holds MIN_HELD or more passes' tops and keeps gradients is the backward, the mountains since the last
    backward its forward (seed._held_seed); the gradients' sets read 0.71 of it right."""
    truth, steps, _, seg = _read("heldout6/h6_save_on_cpu")
    assert len(seg.steps) == steps == 3
    assert _backward_runs(seg.labels) == _backward_runs(truth)
    assert _accuracy(truth, seg.labels) > 0.95
