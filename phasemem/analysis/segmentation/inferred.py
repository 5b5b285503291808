"""Phases inferred where no marker placed them (``infer/``: frames, else lifetimes), and how sure they are."""
from __future__ import annotations

import numpy as np

from ...read.trace import Trace
from ...vocab import PHASES, P
from .. import infer
from ..infer.flat_updates import flat_updates
from ..spans import phase_runs as runs

# An inferred phase's confidence: the share of the events it labels that the markers label the same,
# pooled over the 55 real H200 traces of tests/segmentation/test_infer.py (fixtures/, ../shared, the first four
# held-out sets), measured by docs/eval_inference.py on 2026-12-02 (frames 0.999-1.000, given as 0.99:
# never certain); lifetimes refitted 2026-12-04 after the frameless rules of docs/accuracy.md
# ("Frameless, over every marked trace"), over the traces without doubts (the doubted ones get
# DOUBTFUL): 0.900 / 0.698 / 0.999 / 0.985 / 0.876 there; over all 146 marked traces without doubts
# (docs/eval_frameless.py) 0.93 / 0.71 / 0.996 / 0.97 / 0.855.
# Refitted 2026-12-05 after the third frameless round (docs/accuracy.md "Third round"): over the 55
# 0.932 / 0.739 / 1.000 / 0.998 / 0.980 (none doubted), over the 206 of 215 marked traces without
# doubts 0.951 / 0.739 / 1.000 / 0.999 / 0.978.
# Lifetimes' loss refitted 2026-12-07 when the markers stopped calling frees alone a loss (markers.py
# ``_computing``; issue 40): over the 55, 1,108 of the 2,171 events it labels (0.510, was 1,604); the
# 496 lost are the frees after a loss computed inside the model (llama_hf, its checkpointed kin, qwen,
# heldout bert/t5/distilbert/gpt2), which the markers now leave 'other' and the lifetimes still read as
# the loss's tail, as they read that model's cross-entropy as the loss.
# Recompute it there when the inference changes; tests/segmentation/test_infer.py checks it.
CONFIDENCE = {
    "frames": {"forward": 0.99, "loss": 0.99, "zero_grad": 0.99, "backward": 0.99, "optimizer": 0.99},
    "lifetimes": {"forward": 0.93, "loss": 0.51, "zero_grad": 0.99, "backward": 0.99, "optimizer": 0.97},
}

#: An inferred phase's confidence where the lifetimes contradict themselves (``find_doubts``): the pooled
#: precision of each phase over the marked traces so flagged (docs/eval_frameless.py, 2026-12-05, third
#: round with its last traces: 7 of 215, forward 0.734, backward 0.950, optimizer 0.663; second round 14
#: of 149: forward 0.392, optimizer 0.248). Their loss (1.00) and zero_grad (0.984) are no worse than
#: elsewhere and keep CONFIDENCE's; the 208 others: forward 0.961, backward 0.999, optimizer 0.976.
DOUBTFUL = {"forward": 0.73, "backward": 0.95, "optimizer": 0.66}


def infer_phases(trace: Trace, timeline, labels: np.ndarray, sources: dict[str, str],
                 confidence: dict[str, float]) -> tuple[np.ndarray, str, list[int] | None]:
    """Labels with the inferred phases merged in; how they were inferred ("frames", "lifetimes" or
    "none"); step starts if known. Each phase found so is entered in ``sources`` as "inferred", with
    its CONFIDENCE."""
    labels, how, starts = _infer(trace, timeline, labels,
                                 [ph for ph, src in sources.items() if src == "annotations"])
    for code in np.unique(labels).tolist():
        ph = PHASES[code]
        if ph != "other" and ph not in sources:
            sources[ph] = "inferred"
            confidence[ph] = CONFIDENCE.get(how, {}).get(ph, 0.5)
    return labels, how, starts


def _infer(trace: Trace, timeline, labels: np.ndarray, annotated=()) -> tuple[np.ndarray, str, list[int] | None]:
    """Inferred labels where annotations left 'other'; how they were inferred; step starts if known."""
    if infer.has_usable_frames(trace):
        inferred, how, starts = infer.labels_from_frames(trace, timeline), "frames", None
    elif timeline is not None:
        inferred, starts = infer.labels_from_lifetimes(trace, timeline)
        how = "lifetimes"
    else:
        return labels, "none", None
    # PyTorch's own optimizer/zero_grad annotations stay authoritative, except for the phases they
    # nest: optimizer.step(closure) (Lightning, LBFGS) runs zero_grad, forward, the loss and backward
    # inside torch's Optimizer.step range, and those win there, as nested markers do; only there: a
    # range holding no inferred forward and backward is an update, whatever inference read it as.
    closure = closure_ranges(labels, inferred)
    nested = closure & np.isin(inferred, [P["forward"], P["backward"], P["zero_grad"]])
    keep = (labels != P["other"]) & ~nested
    merged = np.where(keep, labels, inferred).astype(np.int8)
    infer.finish(trace, timeline, merged)
    if how == "lifetimes":
        flat_updates(trace, merged)
    # ... for the phases they cover: none of those outside them
    for ph in annotated:
        merged[(merged == P[ph]) & ~keep & ~nested] = P["other"]
    back = keep & ~(closure & (merged == P["loss"]))  # a closure's loss stays the loss
    merged[back] = labels[back]
    return merged, how, starts


def closure_ranges(labels: np.ndarray, inferred: np.ndarray) -> np.ndarray:
    """Per event: is it an annotated optimizer event inside a run of annotated events where the inferred
    labels hold both a forward and a backward: a closure the step evaluated (``optimizer.step(closure)``).
    Elsewhere the range is the update, whatever inference read it as (the traces: docs/accuracy.md)."""
    idx = np.flatnonzero(np.isin(labels, [P["optimizer"], P["zero_grad"]]))
    out = np.zeros(len(labels), bool)
    if not len(idx):
        return out
    starts = np.flatnonzero(np.diff(idx, prepend=-2) != 1)  # where each run of them begins, in idx
    code = inferred[idx]
    both = np.logical_or.reduceat(code == P["forward"], starts) & np.logical_or.reduceat(code == P["backward"], starts)
    out[idx] = np.repeat(both, np.diff(np.append(starts, len(idx))))
    return out & (labels == P["optimizer"])


def find_doubts(trace: Trace, timeline, labels: np.ndarray, steps: list) -> list[str]:
    """Why phases read from lifetimes alone are less sure than usual, on evidence that contradicts them
    (each lowers the inferred forward and optimizer to DOUBTFUL; the labels stay): gradients kept or an
    optimizer's bursts in a trace read without a backward; steps that follow no one order of phases.
    The traces: docs/accuracy.md.
    """
    out = []
    if not (labels == P["backward"]).any() and timeline is not None and (
            (labels == P["optimizer"]).any() or infer.lifetimes.gradients_unplaced(trace, timeline)):
        out.append("the trace shows a training loop's gradients or updates, but no backward was placed")
    whole = [(a, b) for a, b, complete in steps if complete]
    orders = set()
    for a, b in whole[1:-1] if len(whole) > 2 else whole:
        _, _, code, _ = runs(labels[a:b], np.zeros(b - a, np.int32))
        code = code[code != P["other"]]
        orders.add(tuple(code[np.concatenate([[True], code[1:] != code[:-1]])].tolist()) if len(code) else ())
    # ... and whole steps after the first hold different numbers of backward runs (LBFGS evaluating its
    # closure again: 2, 4 and 3 in truth_lbfgs; a GAN's turns); accumulation holds the same number each
    bwd_runs = set()
    for a, b in whole[1:]:
        _, _, code, _ = runs(labels[a:b], np.zeros(b - a, np.int32))
        bwd_runs.add(int((code == P["backward"]).sum()))
    # ... or the gradients' sets overruled passes read as training and counted other steps (h6_ppo)
    if len(orders) > 1 or len(bwd_runs) > 1 or (timeline is not None and infer.lifetimes.anchored_over_passes(trace, timeline)):
        out.append("the steps found do not follow one order of phases")
    return out


def lower_where_doubted(confidence: dict[str, float], sources: dict[str, str], doubts: list[str]) -> None:
    """Lower each inferred phase's confidence to DOUBTFUL's where there are doubts."""
    for ph in [p for p, src in sources.items() if src == "inferred"] if doubts else []:
        confidence[ph] = min(confidence[ph], DOUBTFUL.get(ph, 1.0))
