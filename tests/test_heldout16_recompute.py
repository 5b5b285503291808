"""Repeated forwards on the H200 (fixtures/heldout16, fixtures/record_heldout16.py): no checkpoint_recompute.

``h16_accum4`` runs 4 micro-batches of identical sizes per step; ``h16_int8_lora``'s frozen base
dequantises every int8 weight to bf16 in every forward. Nothing is checkpointed. Checked as marked
(gt:: ranges), as handed over (inferred phases) and bare (no annotations, no frames). The repetition
itself is counted from the raw entries first, so that the test is about a trace that has it.

These recordings did not make today's sizes-only rule claim anything either (no backward run repeats
4 forward sizes in a row there): the claims the rule made on programs like them are in
tests/test_recompute_evidence.py (h9_char_gpt_math_attention and heldout3_clip_infonce without
frames, and hand-built micro-batch and int8 traces).
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

import phasemem
from heldout_sets import as_handed_over, bare, recording
from phasemem.analysis.patterns.recompute import own_forward

HELDOUT16 = Path(__file__).resolve().parents[1] / "fixtures" / "heldout16"


def _forward_allocs(snap: dict) -> list[list[int]]:
    """The sizes allocated inside each gt::forward range, in order."""
    anns = sorted((a["time_us"], a["stage"]) for a in snap["external_annotations"] if a["name"] == "gt::forward")
    spans = [(t0, t1) for (t0, s0), (t1, s1) in zip(anns[::2], anns[1::2]) if s0 == "START" and s1 == "END"]
    events = snap["device_traces"][0]
    return [[e["size"] for e in events if e["action"] == "alloc" and t0 <= e["time_us"] <= t1] for t0, t1 in spans]


def _variants(snap: dict):
    yield "marked", phasemem.analyze(copy.deepcopy(snap), marker_prefix="gt::")
    yield "plain", phasemem.analyze(as_handed_over(snap))
    yield "bare", phasemem.analyze(bare(snap))


def test_micro_batches_repeat_forward_and_are_no_recompute():
    snap = recording(HELDOUT16, "h16_accum4")
    meta = snap["phasemem"]["meta"]
    fwd = _forward_allocs(snap)
    n = meta["micro_batches"]
    assert len(fwd) == n * meta["nsteps"]
    # every micro-batch after a step's first repeats its forward's sizes exactly, in order
    for s in range(meta["nsteps"]):
        first = fwd[s * n]
        assert len(first) > 50 and all(fwd[s * n + k] == first for k in range(1, n))
    for how, r in _variants(snap):
        assert not r.patterns_of("checkpoint_recompute"), how
        assert not r.patterns_of("forward_rerun"), how
    # marked: each backward is read against the one forward just before it
    r = phasemem.analyze(copy.deepcopy(snap), marker_prefix="gt::")
    f = r.analysis.facts
    for s in range(meta["nsteps"]):
        fr, br = f.runs_of(s, "forward"), f.runs_of(s, "backward")
        assert len(fr) == len(br) == n
        assert [own_forward(fr, br, b0) for b0, _ in br] == [[x] for x in fr]


def test_weights_dequantised_every_forward_are_no_recompute():
    snap = recording(HELDOUT16, "h16_int8_lora")
    meta = snap["phasemem"]["meta"]
    # the blocks' Linear weights: qkv 3d x d, proj d x d, fc 4d x d, out d x 4d, int8; their bf16
    # copies are twice the bytes, made (cast, then scaled) in every forward
    d2 = meta["int8_weight_bytes"] // (12 * meta["layers"])
    bf16 = {2 * k * d2 for k in (1, 3, 4)}
    fwd = _forward_allocs(snap)
    assert len(fwd) == meta["nsteps"]
    for sizes in fwd:
        copies = [x for x in sizes if x in bf16]
        assert len(copies) >= 2 * meta["quantized_linears"]
        assert sum(copies) >= 2 * meta["dequantized_bytes_per_forward"]
    for how, r in _variants(snap):
        assert not r.patterns_of("checkpoint_recompute"), how
        assert not r.patterns_of("forward_rerun"), how
