"""Every shape detector against truth that is not its own (tests/helpers/pattern_truth.py: markers, model
dimensions, stack frames), on every real trace we recorded; and each detector knocked out in turn
must make that comparison fail (docs/testing.md)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import phasemem
from helpers.analyses import analyzed
from helpers.paths import ROOT, SHARED
from helpers.pattern_truth import KINDS, detected, load, truth, vocabulary_sizes
from phasemem.analysis.patterns import KIND_NAMES as DETECTOR_KINDS

# fixtures/big holds torch's own recordings (issue 20), fixtures/integrations the trainer callbacks'
# (issue 16): no instrument() meta with the parameters and the vocabulary to derive truth from.
# h7_state_only was recorded with enabled="state": no history, nothing to detect. fixtures/fsdp2's
# parameters are DTensor shards and bf16 copies made per unshard, which the truth's rules (weights of
# param_bytes, one gradient each) do not model: tests/distributed/test_fsdp2_compile.py checks it from its meta.
# fixtures/pairs2, capacity, capacity2 (issue 30, fixtures/record_pairs2.py) keep their dimensions under
# "config" with names pattern_truth.load does not read (ckpt_every, chunks); their truth is not derived yet.
# fixtures/plans (issue 41) keeps fixtures/record_plans.py's own meta (ranks, plans; tests/predictions/test_plans.py
# checks them), fixtures/lookalikes (issue 40) plain recordings with gt:: marks (tests/patterns/test_lookalikes.py).
TRACES = sorted(p for p in (ROOT / "fixtures").rglob("*.pkl.xz")
                if p.parent.name not in ("big", "integrations", "fsdp2", "pairs2", "capacity", "capacity2", "plans",
                                         "lookalikes")
                and p.name != "h7_state_only.pkl.xz") + sorted(SHARED.glob("*.pkl.xz"))

# Disagreements measured, each explained in docs/patterns.md; the detector may only miss here (never
# claim what the truth does not have), except where the truth's own rule is narrower than the claim.
MISSES = {
    ("heldout2_encoder_cudagraphs", "gradients"),  # the graph's pool holds them from before recording
    ("heldout4_gpt_ddp_bucket_view", "gradients"),  # views of DDP's buckets: no gradient is allocated
    ("heldout3_speech_ctc", "logits"), ("heldout3_speech_ctc", "logits_release"),  # CTC: no cross-entropy
    # a DPO-style loss on gathered log-probabilities of two models' logits: not cross-entropy's fingerprint
    # LBFGS adds to its history in later steps too; phasemem names the state made once, in the first
    ("truth_lbfgs", "optimizer_state_init"),
    # backward ran out of memory in its first recompute: the vocabulary-sized blocks it had freed are no
    # whole release, and phasemem does not call them one (recall, not precision)
    ("oom_fix_ckpt", "logits_release"),
    ("truth_dpo_reference", "logits"), ("truth_dpo_reference", "logits_release"), ("truth_dpo_reference", "softmax_spike"),
    # a 100k-way classifier: its first conv's activations are 0.66 of the logits, vocabulary-sized by
    # VOCAB_SHARE and early, so the detector stays silent
    ("h5_extreme_cls", "logits"), ("h5_extreme_cls", "logits_release"), ("h5_extreme_cls", "softmax_spike"),
    # loss.backward(retain_graph=True) keeps the logits and their softmax for the second backward:
    # vocabulary-sized blocks are freed in backward (the logits' gradient) but there is no release
    ("h5_two_losses", "logits_release"),
    # the optimizer runs inside backward, cutting it into 28 runs: the truth counts a release in each run
    # that frees a vocabulary-sized block (5), phasemem one where backward starts at the loss
    ("h6_optim_in_backward", "logits_release"),
    # save_on_cpu: the logits saved for backward come back from the host as a new block, freed in pieces
    ("h6_save_on_cpu", "logits_release"),
    # reduce-overhead CUDA graphs make the gradients in the graph's pool: none is allocated in the trace
    ("h8_compile_reduce_overhead", "gradients"),
    # a hand-written Adam on an fp32 master copy, its state made before recording; the truth's frames
    # rule sees the last parameter's upcast gradient, kept by the loop's variable into the next step
    ("h8_master_weights", "optimizer_state_init"),
    # written-out attention: 512 MiB score tensors dwarf the 8 MiB logits of a 256-way vocabulary, so the
    # vocabulary-sized blocks are no logits by VOCAB_SHARE
    ("h9_char_gpt_math_attention", "logits"), ("h9_char_gpt_math_attention", "softmax_spike"),
    ("h9_char_gpt_math_attention", "logits_release"),
    # vmap(grad) per-sample gradients are no .grad: the truth's rule (a backward and an optimizer) counts them
    ("h9_per_sample_dpsgd", "gradients"),
    # cuDNN's LSTM keeps a 92 MB reserve for backward in the body of forward from the second step on: the
    # 82 MB logits are no longer 1.5x everything before them, and the detector stays silent there
    ("h11_tbptt_lstm", "logits"), ("h11_tbptt_lstm", "softmax_spike"), ("h11_tbptt_lstm", "logits_release"),
    # a selective policy saves the matmuls: no run of repeated sizes, and detected() has no frames to count by
    ("h15_selective_ac", "checkpoint_recompute"),
    # autograd.grad per micro-batch, summed into the loop's own buffers and dropped before the update: no
    # gradient lives to be read by the optimizer (facts.update_gradients); the truth's rule counts any backward
    ("h16_accum_grad_buffers", "gradients"),
    # vocabulary-sized scores the detector does not call logits (recall, docs/accuracy.md heldout16): the
    # compiled graph's fused cross-entropy; DINO's 8,192 prototype scores, smaller than the ViT's
    # activations; GRPO's log-softmax over a slice of the positions, gathered; SigLIP's batch x batch
    # similarities under a sigmoid loss (no cross-entropy)
    ("h16_compiled_fused", "logits"), ("h16_compiled_fused", "logits_release"),
    ("h16_dino_multicrop", "logits"), ("h16_dino_multicrop", "logits_release"), ("h16_dino_multicrop", "softmax_spike"),
    ("h16_grpo", "logits"), ("h16_grpo", "logits_release"),
    ("h16_siglip", "logits"), ("h16_siglip", "logits_release"), ("h16_siglip", "softmax_spike"),
}
# The truth counts a release only where zero_grad frees 90 % of all parameter bytes; with a frozen
# base (LoRA) or a frozen teacher (distillation) the trained gradients are fewer, and their release real.
NARROW_TRUTH = {("heldout_gpt_lora", "gradients(release)"), ("heldout3_distill_kl", "gradients(release)"),
                # LBFGS's closure runs zero_grad up to 4 times a step: each releases, the truth counts one
                ("truth_lbfgs", "gradients(release)"), ("truth_lbfgs", "optimizer_temporaries"),  # per run
                # the frozen reference model's parameters count in the truth's 90 %: the policy's gradients are fewer
                ("truth_dpo_reference", "gradients(release)"),
                # a GAN's two zero_grads each free one network's gradients, below 90 % of both
                ("h5_wgan_gp", "gradients(release)"),
                # a sparse embedding's gradient is 32 MiB for a 488 MiB weight: its release is far below 90 %
                ("h6_sparse_two_opt", "gradients(release)"),
                # a hand-written momentum SGD makes its buffers in step 0 inside gt::optimizer: state made,
                # which the truth's frames rule (torch/optim/) does not see; read so since the annotated
                # range keeps its events (issue 40: no inferred forward takes an update's events)
                ("h9_per_sample_dpsgd", "optimizer_state_init"),
                # detected() strips the frames: activations copied back from the host (save_on_cpu) echo
                # forward's sizes as recompute does, and the claim then names both (docs/patterns.md)
                ("h6_save_on_cpu", "checkpoint_recompute"),
                # gradient caching encodes every chunk again in its backward: the ripples without checkpointing,
                # which the truth's rule requires; without frames the claim names the program's own re-run too
                ("h15_gradcache_contrastive", "checkpoint_recompute"),
                # LoRA: the frozen base counts in the truth's 90 %; SAC: each zero_grad frees one network's
                ("h7_peft_lora", "gradients(release)"), ("h7_sac", "gradients(release)"),
                # frozen weights in the meta's parameter bytes (an int8 base's fp32 embeddings, DINO's EMA
                # teacher, GRPO's reference and reward models) or a sparse embedding's gradient (GraphSAGE)
                ("h16_int8_lora", "gradients(release)"), ("h16_int8_lora_redequant", "gradients(release)"),
                ("h16_dino_multicrop", "gradients(release)"),
                ("h16_grpo", "gradients(release)"), ("h16_graphsage_sampled", "gradients(release)")}

_cache: dict = {}


def _compare(path: Path):
    """(the truth, the steps scored, what the detectors find without frames, the meta, the prefix); the
    two analyses are the session's (helpers.analyses), shared with the other files."""
    if path not in _cache:
        snap, meta, prefix = load(path)
        gt, scored = truth(snap, meta, prefix, analyzed(path, marker_prefix=prefix))
        det = detected(snap, prefix, analyzed(path, "no_frames", marker_prefix=prefix))
        _cache[path] = (gt, scored, det, meta, prefix)
    return _cache[path]


def _name(p: Path) -> str:
    return p.name.split(".")[0]


def test_every_kind_has_truth_to_meet():
    """Non-vacuous: each kind is expected somewhere, so a detector that finds nothing fails below."""
    total = Counter()
    for path in TRACES:
        gt, scored, *_ = _compare(path)
        for (kind, step), n in gt.items():
            if step in scored:
                total[kind] += n
    assert len(TRACES) >= 50
    assert {k for k in KINDS if total[k] == 0} == set()  # h6_kept_logits leaks (patterns/test_leak.py mutates others)


@pytest.mark.parametrize("path", TRACES, ids=_name)
def test_shapes_are_the_truth(path):
    gt, scored, det, meta, *_ = _compare(path)
    name = _name(path)
    for kind in KINDS:
        for step in sorted(scored):
            g, d = gt[kind, step], det[kind, step]
            if (name, kind) in MISSES:
                assert d <= g, (kind, step, g, d)
            elif (name, kind) in NARROW_TRUTH:
                assert d >= g, (kind, step, g, d)
            else:
                assert d == g, (kind, step, g, d)


@pytest.mark.parametrize("path", TRACES, ids=_name)
def test_vocabulary_shapes_have_the_model_sizes(path):
    """Logits are batch × sequence × vocabulary in bf16 or fp32; the softmax spike is some of the
    vocabulary-sized tensors alive at its top above where memory settles, never the whole level
    (sizes from the recorded model's dims; a distillation's KL holds six)."""
    *_, meta, prefix = _compare(path)
    if not meta.get("vocab"):
        pytest.skip("no vocabulary in the recording's meta")
    sizes = vocabulary_sizes(meta)
    report = analyzed(path, marker_prefix=prefix)
    for p in report.patterns_of("logits"):
        assert p.bytes in sizes, p.bytes
    for p in report.patterns_of("softmax_spike"):
        assert 0.45 * min(sizes) <= p.bytes <= p.details["tensors"] * max(sizes) + (1 << 21), p.bytes
        level = report.analysis.timeline.level
        assert p.bytes < level[p.peak_event]
        # its peak is the top of its range, where both vocabulary tensors are alive
        assert level[p.peak_event] == level[p.start_event:p.end_event + 1].max()


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "leak"])
def test_knocking_out_a_detector_is_caught(kind, knock_out):
    """With one detector's output removed, the comparison with the truth must fail somewhere."""
    base = "gradients" if kind.startswith("gradients") else kind
    compared = [_compare(path) for path in TRACES]  # the truth, before the knock-out
    knock_out(base)
    for path, (gt, scored, *_, prefix) in zip(TRACES, compared):
        if any(gt[kind, s] for s in scored):
            det = detected(load(path)[0], prefix)
            assert any(det[kind, s] != gt[kind, s] for s in scored)
            return
    pytest.fail(f"no trace expects {kind}")


def test_every_detector_kind_is_knocked_out_somewhere():
    """The registry's kinds all have a knock-out: the truth's here, the leak's, the workspace's and
    forward_rerun's (it needs the frames detected() strips) beside the tests they break
    (patterns/test_leak.py, test_scaler_clip_workspace.py, test_recompute.py)."""
    covered = {k if not k.startswith("gradients") else "gradients" for k in KINDS} | {"workspace", "forward_rerun"}
    assert set(DETECTOR_KINDS) <= covered


def test_fsdp2_parameters_are_the_sharded_parameters():
    """FSDP2's gradients are flat reduce-scatter buffers that pair with no parameter by size: the
    blocks alive from before recording must stay parameters, all of them (the recording script
    counted the parameter bytes; categories.py's flat-buffer guard)."""
    path = ROOT / "fixtures" / "heldout4" / "heldout4_gpt_fsdp2_bf16.pkl.xz"
    snap, meta, prefix = load(path)
    for e in snap["device_traces"][0]:
        e["frames"] = []
    report = phasemem.analyze(snap, marker_prefix=prefix)
    assert report.by_category["parameter"] == pytest.approx(meta["param_bytes"], rel=0.02)
