"""Backward found from lifetimes alone: placed at its seed (infer/seed.py), anchored by the gradients
it makes, gone on until its own blocks are freed.

Each rule on the real trace that showed the need for it. A trace's truth is its own marks (phasemem::
or gt::); the reading is the same snapshot with every annotation and stack frame removed
(helpers.snapshots.bare), segmented from lifetimes alone, as docs/eval_frameless.py scores it
(helpers.frameless). Every test fails with its rule taken out (docs/accuracy.md, "Frameless, over every
marked trace" and "Third round").
"""
import numpy as np

from helpers.frameless import frameless, share
from phasemem.analysis.spans import phase_runs
from phasemem.read.trace import A
from phasemem.vocab import P


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
    truth, steps, _, seg = frameless("fsdp2/fsdp2_plain")
    assert len(seg.steps) == steps == 3
    assert _backward_runs(seg.labels) == _backward_runs(truth)
    assert share(truth, seg.labels, "forward") > 0.95


def test_flat_gradients_of_a_seeded_backward_are_gradients():
    """FSDP2 with bf16 parameters makes one flat gradient a layer, of no parameter's size, so nothing
    said its passes made gradients (0.40 right, doubted). A seeded backward whose blocks outlive it
    and go to zero_grad's burst made gradients (seed.seeded_gradients)."""
    truth, steps, _, seg = frameless("heldout4/heldout4_gpt_fsdp2_bf16")
    assert len(seg.steps) == steps == 3 and not seg.doubts
    assert _backward_runs(seg.labels) == _backward_runs(truth)
    assert _accuracy(truth, seg.labels) > 0.95


def test_retain_graph_backward_calls_chain_and_the_loss_value_is_no_seed():
    """Two losses, two backward() calls on a retained graph, one right after the other: the second
    seed follows the first's free at once and continues the backward (seed._chain). The second loss,
    made right after the first, outlives both calls; its span holds the seeds' and is no seed. A tiny
    MLP saves four activations: a seed marks a backward however few it frees. Before: 0.23 right."""
    truth, steps, _, seg = frameless("heldout9/h9_multitask_retain_graph")
    assert len(seg.steps) == steps == 3
    assert share(truth, seg.labels, "backward") > 0.95
    said = seg.labels == P["backward"]
    assert np.mean(truth[said] == P["backward"]) > 0.95


def test_a_loss_of_scalar_ops_does_not_chain_into_the_seed():
    """heldout3_distill_kl's loss (KL divergence and cross-entropy) frees a scalar and allocates the next
    at once, the seed among them: its scalars chain into the loss value the loop keeps, whose span holds
    the seed's and two steps' backward. A span holding another's is no seed (seed._best_seed)."""
    truth, steps, _, seg = frameless("heldout3/heldout3_distill_kl")
    assert len(seg.steps) == steps == 3
    assert _backward_runs(seg.labels) == _backward_runs(truth)


def test_a_backward_no_mountain_showed_is_found_by_its_seed():
    """MoCo's queue logits outweigh a tiny encoder's activations: no mountain shows the first step,
    and the next mountains begin in the backward before them. A seed before a pass's top that frees,
    last made first, MIN_GAP_SAVED blocks and makes gradients is a pass of its own (seed._gap_seed).
    Before: 0.55 right."""
    truth, steps, _, seg = frameless("heldout10/h10_moco_queue")
    assert len(seg.steps) == steps == 3
    assert _backward_runs(seg.labels) == _backward_runs(truth)


def test_a_gap_seed_must_free_as_a_backward_does():
    """odd_cudagraph's steps are CUDA graphs (no pass); a scalar among its optimizer's temporaries frees
    them as made, not last made first, and is no backward's seed."""
    truth, steps, _, seg = frameless("odd_cudagraph")
    assert len(seg.steps) == steps == 3
    assert _accuracy(truth, seg.labels, gt=False) > 0.9


def test_mountains_without_seed_or_backward_are_no_passes_where_seeds_placed_backward():
    """8-bit Adam's and Shampoo's temporaries make mountains of their own after backward; once seeds place
    the backward runs, a mountain with neither seed nor backward's frees is the optimizer's, not an
    evaluation forward (h16_adam8bit 0.15 right before, h10_shampoo_subclass 0.87)."""
    for rel in ("heldout16/h16_adam8bit", "heldout10/h10_shampoo_subclass"):
        truth, steps, _, seg = frameless(rel)
        assert len(seg.steps) == steps == 3, rel
        assert share(truth, seg.labels, "optimizer") > 0.9, rel


def test_a_fingerprint_far_before_the_seed_is_no_loss():
    """A PINN's forward calls autograd.grad, whose own seed follows a cross-entropy-like fingerprint 75
    events before the loss: where a seed placed backward, only a fingerprint ending at it is the loss
    (seed.seeded_loss); else backward began at the inner autograd.grad (0.84 right)."""
    truth, _, _, seg = frameless("heldout14/h14_pinn_second_order")
    assert _accuracy(truth, seg.labels) > 0.95
    assert _backward_runs(seg.labels) == _backward_runs(truth)


def test_seeded_passes_stand_against_the_gradients_sets():
    """h5_vae_handadam's gradients' sets explain 1.2 times the saved activations its seeded passes do
    (lifetimes.EXPLAINS) but start backward 29 events late; passes whose every backward run begins at a
    seed, as many as the sets', stand (seed.all_seeded)."""
    truth, _, _, seg = frameless("heldout5/h5_vae_handadam")
    assert _backward_runs(seg.labels) == _backward_runs(truth)


def test_a_loop_s_batch_freed_in_a_burst_is_not_left_alive_by_the_seed():
    """An EmbeddingBag loop frees its 18-block batch in a burst after the optimizer: counted as left
    alive by the seed (beside 22 activations it frees) it refused the seed (heldout_embbag_adagrad 0.54)."""
    truth, steps, _, seg = frameless("heldout/heldout_embbag_adagrad")
    assert len(seg.steps) == steps == 3
    assert _backward_runs(seg.labels) == _backward_runs(truth)


def test_the_loss_s_scalars_are_no_seed_of_a_checkpointed_backward():
    """A checkpointed llama: a scalar of the loss frees 33 of the loss's temporaries and leaves the 9
    checkpointed inputs alive; the seed frees 11 and leaves none. The seed is the one that frees the
    most for each left alive; the recompute's mountain inside its backward is part of it."""
    truth, steps, _, seg = frameless("pairs2/llama__ckpt_1")
    assert len(seg.steps) == steps == 3
    assert _backward_runs(seg.labels) == _backward_runs(truth)


def test_generate_after_the_optimizer_is_no_evaluation_forward():
    """With its backward ending at its seed's free, h8_generate_then_train's optimizer is found, and the
    generate() loop after it (25 passes' events) was taken for an evaluation forward: 0.05 right. An
    evaluation forward is no longer than EVAL_SPAN passes (pass_labels.label_after_backward)."""
    truth, _, _, seg = frameless("heldout8/h8_generate_then_train")
    assert _accuracy(truth, seg.labels) > 0.95


def test_a_scalar_made_as_backward_ends_continues_it_only_if_it_frees_the_forward():
    """SigLIP's optimizer allocates a scalar the very event after the seed's free: read as a second
    backward() call it swallowed the optimizer (0.91 right). A chained scalar must free some block made
    before the first seed, as a second call through the same forward does (seed._chain)."""
    truth, _, _, seg = frameless("heldout16/h16_siglip")
    assert _backward_runs(seg.labels) == _backward_runs(truth)


def test_the_loss_fingerprint_is_searched_past_the_seed():
    """heldout_cnn_bn_nesterov runs zero_grad between its loss and backward(): cross-entropy's fingerprint
    places backward's start 5 allocations after the seed, beyond what a search up to the seed sees; the
    loss then went unnamed (forward to the seed)."""
    truth, _, _, seg = frameless("heldout/heldout_cnn_bn_nesterov")
    assert share(truth, seg.labels, "loss") > 0.95


def test_a_backward_whose_forward_predates_the_trace_is_found_by_its_seed():
    """h8_mid_step_start's ring buffer wrapped mid-step: it opens with zero_grad and a whole backward whose
    forward (and loss value) came before the trace. A scalar among the allocations before the first pass
    that frees blocks older than the trace and keeps gradients seeds it (seed._leading_seed); it was read
    as the optimizer (0.79 right)."""
    truth, steps, _, seg = frameless("heldout8/h8_mid_step_start")
    assert len(seg.steps) == steps == 4
    assert _backward_runs(seg.labels) == _backward_runs(truth)


def test_a_backward_that_frees_nothing_on_the_gpu_is_found_by_the_mountains_it_holds():
    """save_on_cpu moves what the forward saves to the host: the seed frees none of the forward's GPU
    blocks, and backward brings the saved tensors back layer by layer, a mountain each. A seed whose span
    holds MIN_HELD or more passes' tops and keeps gradients is the backward, the mountains since the last
    backward its forward (seed._held_seed); the gradients' sets read 0.71 of it right."""
    truth, steps, _, seg = frameless("heldout6/h6_save_on_cpu")
    assert len(seg.steps) == steps == 3
    assert _backward_runs(seg.labels) == _backward_runs(truth)
    assert _accuracy(truth, seg.labels) > 0.95


def test_bucket_view_gradients_still_train():
    """DDP with gradient_as_bucket_view makes no gradient in backward (the buckets predate the trace),
    so no backward keeps one; AdamW's bursts between the passes say the loop trains
    (lifetimes._updates_after). Without it the passes were forward-only and the trace read as a
    CUDA-graphed one: everything 'optimizer', 1 step."""
    truth, steps, _, seg = frameless("heldout4/heldout4_gpt_ddp_bucket_view")
    assert len(seg.steps) == steps == 3
    assert share(truth, seg.labels, "backward") > 0.9
    assert share(truth, seg.labels, "forward") > 0.95


def test_no_cuda_graph_reading_where_passes_save_activations():
    """A checkpointed GPT whose every pass was refused (its backward end runs past zero_grad) still has
    passes that save activations for a backward: it is no CUDA-graphed model, whose replay makes none
    (lifetimes._has_saved_passes). The graphed reading called the whole trace 'optimizer', 1 step of 5."""
    truth, steps, _, seg = frameless("pairs/ckpt")
    assert len(seg.steps) == steps == 5
    assert share(truth, seg.labels, "backward") > 0.9


def test_a_kept_loss_does_not_start_the_next_forward():
    """The chunked cross-entropy keeps its accumulated loss from one step's loss into the next step's:
    that one block, made long before the next forward, began it there, and cut the step's backward
    short after a few events (passes.forward_start): backward was 0.19 of its events."""
    truth, _, _, seg = frameless("pairs/chunked_ce")
    assert share(truth, seg.labels, "backward") > 0.8
    assert share(truth, seg.labels, "optimizer") > 0.9


def test_a_checkpointed_second_micro_batch_is_a_training_pass():
    """With HF checkpointing and two micro-batches, the second one's forward saves 8 activations, under
    MIN_SAVED; where the first is plainly a training pass, it is one too (lifetimes.MIN_SAVED_PEER):
    its backward was called optimizer (0.47 of backward's events right, 0.75 with the rule)."""
    truth, steps, _, seg = frameless("heldout3/heldout3_neox_hfckpt_accum2")
    assert len(seg.steps) == steps == 3
    assert share(truth, seg.labels, "backward") > 0.7


def test_gradients_freed_after_an_update_before_an_out_of_memory_error():
    """The trace ends in the next step's forward, which ran out of memory before it made a pass: the
    one pass's gradients were freed by zero_grad after AdamW, and the loop went on -- it trains
    (gradients.keeps_gradients, WENT_ON). Its backward was called forward."""
    truth, _, _, seg = frameless("integrations/hf_oom")
    assert share(truth, seg.labels, "backward") > 0.95


def test_a_tiny_models_backward_from_its_gradients():
    """A two-layer MLP under a Shampoo subclass: its forward saves too few activations to be a pass,
    and the optimizer's temporaries make the only mountains; zero_grad freeing each step's gradients
    together anchors the backward runs (infer/anchored.py): 3 steps, not 1, the optimizer found (it was
    all 'forward'), and backward in part (its first events, before the first gradient, stay forward)."""
    truth, steps, _, seg = frameless("heldout10/h10_shampoo_subclass")
    assert len(seg.steps) == steps == 3
    assert share(truth, seg.labels, "optimizer") > 0.9
    assert share(truth, seg.labels, "backward") > 0.3
    assert not seg.doubts


def test_gradients_before_a_cuda_graph_reading():
    """save_on_cpu moves every saved activation to the host: no pass shows on the device, and
    cross-entropy's fingerprint before AdamW's bursts read as a CUDA-graphed model (1 step of 3, its
    backward 'optimizer'). A graph keeps gradients in its pool without events; these are made, kept
    through the update and freed together by zero_grad, so they anchor the backward runs instead
    (lifetimes.labels_from_lifetimes, infer/anchored.py, LIVE_ACROSS)."""
    truth, steps, _, seg = frameless("heldout6/h6_save_on_cpu")
    assert len(seg.steps) == steps == 3
    assert share(truth, seg.labels, "backward") > 0.7
    assert not (seg.labels[truth == P["backward"]] == P["optimizer"]).mean() > 0.1


def test_a_cuda_graphed_model_is_still_read_so():
    """The rules above leave a real CUDA-graphed model's reading alone: its gradients live in the graph's
    pool and make no events, its passes save nothing on the device."""
    truth, steps, _, seg = frameless("odd_cudagraph")
    assert len(seg.steps) == steps == 3
    assert share(truth, seg.labels, "loss") == 1 and share(truth, seg.labels, "backward") == 1
    assert share(truth, seg.labels, "optimizer") > 0.85


def test_a_backward_that_makes_its_gradients_after_its_last_saved_free():
    """int8 LoRA: after the first step the adapters' gradients are made once every saved activation is
    freed, while two of backward's own blocks live on; the pass ended at the last saved free, made no
    gradient and read forward-only (0.60 of the events right). Its backward goes on until its own
    blocks are freed (pass_labels.backward_goes_on)."""
    truth, steps, _, seg = frameless("heldout16/h16_int8_lora")
    assert len(seg.steps) == steps == 3
    assert share(truth, seg.labels, "backward") > 0.95
    said = seg.labels == P["forward"]
    assert np.mean(truth[said] == P["forward"]) > 0.95


def test_graphed_mse_step_is_read_from_its_seed():
    """torch.compile(mode="reduce-overhead") replays forward and backward as CUDA graphs and fused AdamW
    makes nothing: only the MSE loss (eager) and backward's seed and first gradient leave events.
    Without loss.seeded_steps the trace read as one inference request (0.44, 1 step of 3)."""
    truth, steps, trace, seg = frameless("heldout8/h8_compile_reduce_overhead")
    assert len(seg.steps) == steps == 3
    assert share(truth, seg.labels, "backward") == 1.0
    # every backward event read is one (its seed and gradient), and one run a step
    bwd = seg.labels == P["backward"]
    assert (truth[bwd] == P["backward"]).all()
    firsts = np.flatnonzero(bwd & ~np.roll(bwd, 1))
    assert len(firsts) == steps and (trace.action[firsts] == A["alloc"]).all()
    assert (trace.size[firsts] <= 8).all()  # each begins at the seed, a scalar
    # ... and the seed's pattern claims no training in an inference loop (generate, graphed decode)
    for rel in ("gpt_inference", "heldout12/h12_static_kv_decode", "heldout7/h7_decode_keeps_outputs",
                "heldout14/h14_compiled_infer_dynamic"):
        truth, _, _, seg = frameless(rel)
        assert not (truth == P["backward"]).any()
        assert not (seg.labels == P["backward"]).any(), rel


def test_closure_seed_inside_an_optimizer_scalar():
    """LBFGS's step(closure) makes scalars and flat vectors before each closure and frees them after it:
    one such scalar's span holds the closure's backward, and the closure's seed, leaving those alive,
    was refused (seed.closure_seed). Without the rule the later evaluations' backward ran on through
    LBFGS's line search to the scalar's free (3 backward runs of 12 began elsewhere than their seed)."""
    truth, _, _, seg = frameless("truth/truth_lbfgs")
    bwd, tb = seg.labels == P["backward"], truth == P["backward"]
    got = np.flatnonzero(bwd & ~np.roll(bwd, 1))
    want = np.flatnonzero(tb & ~np.roll(tb, 1))
    assert np.isin(got, want).all() and len(got) >= len(want) - 1
    assert float((truth[bwd] == P["backward"]).mean()) > 0.98


def test_every_closure_evaluation_before_a_top_is_a_backward():
    """LBFGS evaluates its closure several times a step; where two evaluations come before the next
    mountain's top, each is a backward of its own from its seed (seed.reseat's gap seeds, repeated).
    Without the repetition truth_lbfgs's second evaluation (300 events) read as 'other'."""
    truth, _, _, seg = frameless("truth/truth_lbfgs")
    bwd, tb = seg.labels == P["backward"], truth == P["backward"]
    got = np.flatnonzero(bwd & ~np.roll(bwd, 1))
    want = np.flatnonzero(tb & ~np.roll(tb, 1))
    assert len(want) == 12 and np.array_equal(got, want)
    assert share(truth, seg.labels, "backward") > 0.98


def test_embedding_gradient_made_in_chunks_is_backward():
    """EmbeddingBag's backward makes its tables' gradient a chunk at a time after its last saved
    activation is freed; those slices are freed by zero_grad with the other gradients, so they are
    backward's, not Adagrad's (odd_steps.chunked_gradients). Without the rule the later steps' chunks
    (404 events a step) read as the optimizer."""
    truth, steps, _, seg = frameless("heldout/heldout_embbag_adagrad")
    assert len(seg.steps) == steps == 3
    assert share(truth, seg.labels, "backward") > 0.9
    opt = seg.labels == P["optimizer"]
    assert float((truth[opt] == P["optimizer"]).mean()) > 0.7


def test_graph_network_first_top_inside_backward_moves_back():
    """A GCN's backward makes blocks as large as its whole-graph activations, so the first pass's top
    falls inside backward and what is alive there is not freed last-made-first: the pass was refused and
    its backward read forward-only. Its other passes plainly train; the forward's end, where the saved
    blocks' frees best reverse their allocations, is its top (odd_steps.earlier_top)."""
    truth, steps, _, seg = frameless("heldout3/heldout3_gcn_scatter_adam")
    assert len(seg.steps) == steps == 3
    a, b, _ = seg.steps[0]
    assert share(truth[a:b], seg.labels[a:b], "backward") > 0.8
    assert share(truth, seg.labels, "forward") > 0.8


def test_gradcache_chunks_after_the_no_grad_forward_are_backward():
    """After GradCache's no-grad forward, each chunk's forward is run again with grad and backward with the
    cached gradients: the marks call all of it, up to the update, backward. Each chunk read as a pass of
    its own, its forward and surrogate loss ~110 events, 16 a step (cached.label_reforwards)."""
    truth, steps, _, seg = frameless("heldout15/h15_gradcache_contrastive")
    assert share(truth, seg.labels, "backward") > 0.95
    bwd = seg.labels == P["backward"]
    assert float((truth[bwd] == P["backward"]).mean()) > 0.95
