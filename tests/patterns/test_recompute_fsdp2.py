"""FSDP2's re-gathers are no recompute (issue 40; fixtures/plans, fixtures/record_plans.py: rank 0 of 8-rank
FSDP2 jobs on torch's fake process group, H100, torch 2.11; nothing checkpointed).

With ``reshard_after_forward``, backward gathers each layer's parameters again, in forward's order: the
gathered block, then each parameter's block copied out of it. Without stack frames those sizes repeated
forward's 13+ allocations in a row, and ``checkpoint_recompute`` was claimed from sizes in every step of
fsdp2 and fsdp2_bf16 (all four families but llama in fp32). The copy-outs are told from sizes and
lifetimes alone (``recompute_gathers.gathered``) and are no evidence.

Every truth here comes from the raw entries: FSDP2's own frames (``alloc_all_gather_outputs``,
``foreach_all_gather``), the recording's meta, checkpoint's frames.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

import phasemem
from helpers.paths import FIXTURES
from helpers.snapshots import recording, without_frames

PLANS = FIXTURES / "plans"
FSDP2 = sorted(p.name.removesuffix(".pkl.xz") for p in PLANS.glob("*__fsdp2*.pkl.xz"))


def _events(snap: dict) -> list[dict]:
    return max(snap["device_traces"], key=len)


def _reading(snap: dict, marks: bool, frames: bool) -> dict:
    """The trace as a user could hand it over: without annotations (and phasemem's key) unless ``marks``,
    without any stack frame unless ``frames``."""
    s = copy.deepcopy(snap)
    if not marks:
        s.pop("phasemem", None)
        s["external_annotations"] = []
    return s if frames else without_frames(s)


READINGS = {"as recorded": (True, True), "annotations removed": (False, True),
            "frames removed": (True, False), "frames and annotations removed": (False, False)}


def _names(e: dict) -> set[str]:
    return {f["name"] for f in e.get("frames") or []}


def _copy_outs(snap: dict) -> list[tuple[int, list[int]]]:
    """(gathered block, parameters' blocks) of every copy-out backward made, as events, from FSDP2's frames:
    the parameters' blocks are alloc_all_gather_outputs' allocations under pre_backward, a copy-out each
    stretch of them (no other allocation between); its gathered block is foreach_all_gather's latest
    allocation before it that is not freed by then."""
    ev = _events(snap)
    stretches, gathers, stretch = [], [], []
    frees: dict[int, list[int]] = {}
    for i, e in enumerate(ev):
        if e["action"] == "free_requested":
            frees.setdefault(e["addr"], []).append(i)
        if e["action"] != "alloc":
            continue
        names = _names(e)
        if "alloc_all_gather_outputs" in names and "pre_backward" in names:
            stretch.append(i)
            continue
        if stretch:
            stretches.append(stretch)
            stretch = []
        if "foreach_all_gather" in names:
            gathers.append(i)
    stretches += [stretch] if stretch else []
    out = []
    for pieces in stretches:
        alive = [g for g in gathers if g < pieces[0]
                 and not any(g < f < pieces[0] for f in frees.get(ev[g]["addr"], []))]
        out.append((alive[-1], pieces))
    return out


def _batch(name: str) -> int:
    return int(name.rsplit("__b", 1)[1])


# every trace without frames (where the claim was made); with frames (never claimed: no checkpoint
# frame), the smaller batch of each family and plan
FIRST = {n for n in FSDP2 if _batch(n) == min(_batch(m) for m in FSDP2 if m.split("__")[:2] == n.split("__")[:2])}
CASES = [(n, how) for n in FSDP2 for how, (_, frames) in READINGS.items() if not frames or n in FIRST]


@pytest.mark.parametrize("name,how", CASES)
def test_fsdp2_regathers_are_no_recompute(name, how):
    snap = recording(PLANS, name)
    ev = _events(snap)
    files = {f["filename"].replace("\\", "/") for e in ev for f in e.get("frames") or []}
    assert any("/_fully_shard/" in f for f in files)  # FSDP2's own frames: it ran
    assert not any(f.endswith(("torch/utils/checkpoint.py", "torch/_prims/rng_prims.py")) for f in files)
    r = phasemem.analyze(_reading(snap, *READINGS[how]))
    assert not r.patterns_of("checkpoint_recompute"), [p.details for p in r.patterns_of("checkpoint_recompute")]
    assert not r.patterns_of("forward_rerun")


@pytest.mark.parametrize("name", [n for n in FSDP2 if "_keep" not in n])
def test_backward_gathers_again_what_forward_freed(name):
    """What made the false claim is in the trace: with reshard_after_forward, every step's backward copies
    each layer's parameters out of a gathered block again, in blocks that add up to it exactly."""
    snap = recording(PLANS, name)
    ev = _events(snap)
    outs = _copy_outs(snap)
    steps = int(snap["phasemem"]["calls"]["phasemem::backward"])
    assert len(outs) >= 2 * steps
    for g, pieces in outs:
        assert len(pieces) >= 3
        assert sum(ev[i]["size"] for i in pieces) == ev[g]["size"]  # GATHER_SLACK = 0
        assert len({ev[i]["size"] for i in pieces}) > 1  # a layer's parameters are of more than one size


@pytest.mark.parametrize("name", FSDP2)
def test_copy_outs_are_told_from_sizes_alone(name):
    """Every backward copy-out is found without frames or annotations, and nothing found is not FSDP2's."""
    from phasemem.analysis.core import Analysis
    from phasemem.analysis.patterns.recompute_gathers import gathered
    from phasemem.read import read

    snap = recording(PLANS, name)
    ev = _events(snap)
    got = read(_reading(snap, marks=False, frames=False), trusted=True)
    ctx = Analysis.of(got.trace, got.prefix).facts
    found = set(ctx.alloc[gathered(ctx, np.arange(len(ctx.size)))].tolist())
    want = {i for g, pieces in _copy_outs(snap) for i in [g, *pieces]}
    assert want <= found, len(want - found)
    fsdp = {"alloc_all_gather_outputs", "init_all_gather_outputs", "foreach_all_gather"}
    assert all(_names(ev[i]) & fsdp for i in found)
    if "_keep" in name:
        assert not want  # parameters kept after forward: backward gathers nothing


NOT_FSDP = sorted({str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*ckpt*.pkl.xz")}
                  | {"heldout15/h15_selective_ac.pkl.xz", "integrations/hf_compile_accum.pkl.xz",
                     "plans/gpt__single_fp32__n1_r0__b4.pkl.xz", "plans/llama__zero2__n8_r0__b4.pkl.xz"})


@pytest.mark.parametrize("rel", NOT_FSDP)
def test_no_copy_out_without_fsdp(rel):
    """Checkpointed programs (whose recompute must stay told), and hf_compile_accum, whose backward makes
    4 blocks adding up to one freed right after (of one size, and held 287 allocations): nothing found."""
    from phasemem.analysis.core import Analysis
    from phasemem.analysis.patterns.recompute_gathers import gathered
    from phasemem.read import read

    snap = recording((FIXTURES / rel).parent, (FIXTURES / rel).name.removesuffix(".pkl.xz"))
    assert not any("/_fully_shard/" in f["filename"] for e in _events(snap) for f in e.get("frames") or [])
    got = read(_reading(snap, marks=False, frames=False), trusted=True)
    ctx = Analysis.of(got.trace, got.prefix).facts
    assert not len(gathered(ctx, np.arange(len(ctx.size))))
