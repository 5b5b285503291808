"""Which shapes each real H200 trace holds, derived without phasemem's detectors: from the phase
markers recorded with it, the model dimensions in its metadata (batch, sequence, vocabulary, layers,
checkpointing, micro-batches, optimizer) and the stack frames of the raw events. The detectors
run on a copy with every stack frame removed (``detected``). Used by tests/patterns/test_pattern_truth.py
and docs/eval_patterns.py.
"""
from __future__ import annotations

import copy
import lzma
import pickle
from collections import Counter
from pathlib import Path

import numpy as np

import phasemem
from phasemem.vocab import P

KINDS = ("logits", "softmax_spike", "logits_release", "checkpoint_recompute", "gradients",
         "gradients(release)", "gradient_accumulation", "optimizer_state_init", "optimizer_temporaries",
         "amp_unscale", "grad_clip", "leak")

# The shared snapshots carry no dimensions in their metadata; these come from their README.
SHARED_META = {
    "gpt_adamw_foreach": dict(batch=4, seq=1024, vocab=50304, layers=6, checkpointing=False, micro_batches=1),
    "gpt_ckpt_fused_seedlike": dict(batch=4, seq=1024, vocab=151936, layers=8, checkpointing=True, micro_batches=1),
    "mlp_fp16_scaler": dict(batch=0, seq=0, vocab=0, layers=8, checkpointing=False, micro_batches=1),
}


# What a recording's meta does not say, from its script (fixtures/record_heldout13.py): the validation
# graphs kept every step are a leak; the segmentation net's per-pixel scores (21 classes, fp32 from
# F.interpolate) are its logits, batch × pixels × classes at each of the three sizes.
EXTRA_META = {
    "h13_eval_graph_leak": dict(leak=True),
    "h13_multiscale_seg": dict(vocab=21, seqs=[256 * 256, 384 * 384, 512 * 512]),
}


def load(path: Path) -> tuple[dict, dict, str]:
    obj = pickle.loads(lzma.decompress(path.read_bytes()))
    if "snapshot" in obj:  # the shared files wrap the snapshot
        meta = {**obj["meta"], **SHARED_META[obj["meta"]["name"]]}
        return obj["snapshot"], meta, "gt::"
    meta = obj["phasemem"]["meta"]
    if "config" in meta:  # fixtures/record_pairs.py keeps the dimensions under "config"
        cfg = meta["config"]
        meta = {**cfg, "checkpointing": cfg.get("ckpt"), **meta}
    meta = {**meta, **EXTRA_META.get(str(meta.get("workload")), {})}
    return obj, meta, obj["phasemem"].get("markers", "phasemem::")


def truth(snap: dict, meta: dict, prefix: str, report=None) -> tuple[Counter, set[int]]:
    """(kind, step) → count, from markers + dimensions + frames; and the steps to score (complete ones).
    ``report``: ``snap`` analysed with ``marker_prefix=prefix``, where the caller has it already."""
    # with frames; used for markers and lifetimes only
    r = report if report is not None else phasemem.analyze(snap, marker_prefix=prefix)
    ev = snap["device_traces"][0]
    n = len(ev)
    life = r.analysis.timeline.lifetimes
    born = life.alloc_event >= 0
    a, f, s = life.alloc_event[born], life.free_event[born], life.size[born]
    lab = r.analysis.labels
    vocab_sizes = set(vocabulary_sizes(meta))
    param_bytes = meta["param_bytes"]

    def frames(i, needle):
        return any(needle in fr["filename"] or needle in fr["name"] for fr in ev[i].get("frames") or [])

    # A hand-written optimizer (not under torch/optim/) is named by its file and function in the meta.
    own_file, own_name = meta.get("optimizer_frame") or ("torch/optim/", None)

    def in_optimizer(i):
        return frames(i, "torch/optim/") or any(own_file in fr["filename"] and fr["name"] == own_name
                                                for fr in ev[i].get("frames") or [])

    out: Counter = Counter()
    scored = {k for k, st in enumerate(r.steps) if st.complete}
    delta = r.analysis.timeline.delta
    has_frames = any(e.get("frames") for e in ev)
    first_bwd = next((k for k, st in enumerate(r.steps) if "backward" in st.phases), -1)
    first_opt = next((k for k, st in enumerate(r.steps) if "optimizer" in st.phases), -1)
    for k, st in enumerate(r.steps):
        runs = [(x0, x1, ph) for x0, x1, ph, sk in r.label_runs() if sk == k]
        fwd = [(x0, x1) for x0, x1, ph in runs if ph == "forward"]
        bwd = [(x0, x1) for x0, x1, ph in runs if ph == "backward"]
        for i, (f0, f1) in enumerate(fwd):
            stop = min([b0 for b0, _ in bwd if b0 > f1] + [fwd[i + 1][0] if i + 1 < len(fwd) else st.end_event + 1])
            in_mb = (a >= f0) & (a < stop) & np.isin(lab[np.minimum(a, n - 1)], [P["forward"], P["loss"]])
            voc = in_mb & np.isin(s, list(vocab_sizes))
            # The LM shapes are claimed only where a loss's backward follows (docs/patterns.md): an
            # inference or evaluation forward's logits are not called so.
            trained = any(b0 == stop for b0, _ in bwd)
            if voc.any() and trained:
                out["logits", k] += 1
                va, vf = a[voc], f[voc]
                both = any(((va <= t) & (vf > t)).sum() >= 2 for t in va)
                if both and (vf < stop).any():
                    out["softmax_spike", k] += 1
        for b0, b1 in bwd:
            voc = np.isin(s, list(vocab_sizes)) & (f >= b0) & (f <= b1)
            if voc.any():
                out["logits_release", k] += 1
            # a recording without any frame (lookalikes/ckpt_llama_noframes) says it only in its meta
            if meta.get("checkpointing") and (not has_frames or any(
                    frames(int(i), "checkpoint") for i in a[(a >= b0) & (a <= b1)])):
                out["checkpoint_recompute", k] += 1
        # set_to_none=False zeroes gradients in place: they are allocated in the first backward only
        keeps = "set_to_none=False" in str(meta.get("zero_grad", ""))
        # a CUDA-graphed model's gradients live in the graph's pool, allocated at capture (before recording)
        graphed = "make_graphed_callables" in str(meta.get("loop", ""))
        if bwd and not graphed and (meta.get("optimizer") is not None or "optimizer" in st.phases) and (
                not keeps or k == first_bwd):
            out["gradients", k] += 1
        zg = [(x0, x1) for x0, x1, ph in runs if ph == "zero_grad"]
        freed = -sum(int(delta[x0:x1 + 1][delta[x0:x1 + 1] < 0].sum()) for x0, x1 in zg)
        if zg and freed >= 0.9 * param_bytes:
            out["gradients(release)", k] += 1
        if len(bwd) >= 2 and meta.get("micro_batches", 1) > 1:
            out["gradient_accumulation", k] += 1
        # A loop that keeps a tensor of every step (h6_kept_logits: meta "leak") leaks in each step a
        # later one repeats; the last step's, held to the end, is not told from the loop's last tensors.
        if meta.get("leak") and 0 < k < len(r.steps) - 1:
            out["leak", k] += 1
        opt = [(x0, x1) for x0, x1, ph in runs if ph == "optimizer"]
        if bwd:  # between the last backward and the optimizer (the step's end if it made no events)
            gap = a[(a > bwd[-1][1]) & (a < (opt[0][0] if opt else st.end_event + 1))]
            if sum(frames(int(i), "torch/nn/utils/clip_grad.py") for i in gap) >= 2:
                out["grad_clip", k] += 1  # clip_grad_norm_, by its frames (GradScaler's check among them)
            elif sum(frames(int(i), "torch/amp/grad_scaler.py") for i in gap) >= 2:
                out["amp_unscale", k] += 1  # GradScaler.unscale_, by its frames
        if not has_frames:  # recorded without stacks: the optimizer's set-up says what it must do
            name = str(meta.get("optimizer") or "")
            stateful = "Adam" in name or "momentum" in name
            if opt and stateful and k == first_opt:
                out["optimizer_state_init", k] += 1
            if opt and "Adam" in name and "fused=True" not in name:
                out["optimizer_temporaries", k] += 1
            continue
        o_allocs = [int(i) for x0, x1 in opt for i in a[(a >= x0) & (a <= x1)] if in_optimizer(int(i))]
        kept = [i for i in o_allocs if f[np.searchsorted(a, i)] >= st.end_event + 1]
        temp = [i for i in o_allocs if f[np.searchsorted(a, i)] <= max(x1 for _, x1 in opt)]
        if kept:
            out["optimizer_state_init", k] += 1
        if len(temp) >= 2:
            out["optimizer_temporaries", k] += 1
    return out, scored


def vocabulary_sizes(meta: dict) -> list[int]:
    """Bytes of a batch × sequence × vocabulary tensor in bf16 and fp32, per sequence length the run
    used (``seqs`` where it changed from step to step)."""
    out = []
    for seq in meta.get("seqs") or [meta.get("seq") or 0]:
        for vocab in meta.get("score_widths") or [meta.get("vocab") or 0]:  # h10_moco_queue: q @ queue, then 1 + queue
            bt = meta.get("batch", 0) * seq * vocab
            out += [2 * bt, 4 * bt] if bt else []
    return out


def detected(snap: dict, prefix: str, report=None) -> Counter:
    """(kind, step) → count of what the detectors find with every stack frame removed; ``report``: that
    analysis (``marker_prefix=prefix``), where the caller has it already."""
    if report is None:
        bare = copy.deepcopy(snap)
        for e in bare["device_traces"][0]:
            e["frames"] = []
        report = phasemem.analyze(bare, marker_prefix=prefix)
    r = report
    out: Counter = Counter()
    for p in r.patterns:
        kind = "gradients(release)" if p.kind == "gradients" and p.phase == "zero_grad" else p.kind
        out[kind, p.step] += 1
    return out
