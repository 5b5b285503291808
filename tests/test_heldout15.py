"""Held-out set 15 (fixtures/heldout15, fixtures/record_heldout15.py): known shapes made in unusual ways.
Truth from the raw snapshot (its gt:: ranges, the stacks of its allocations) and from the recording's
meta (the models' own byte counts, the number of chunks, blocks and requests)."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

import phasemem
from heldout_sets import bare, marked_and_plain, recording

ROOT = Path(__file__).resolve().parents[1]
HELDOUT15 = ROOT / "fixtures" / "heldout15"


def _frames_of(snap: dict, event: int) -> list[str]:
    return [f["filename"] + ":" + f["name"] for f in snap["device_traces"][0][event].get("frames") or []]


def test_gradient_caching_is_not_called_activation_checkpointing():
    """GradCache encodes each chunk again with grad inside its backward phase: the ripples are the
    program's own forwards (module calls from its loop, no torch/utils/checkpoint.py frame)."""
    snap = recording(HELDOUT15, "h15_gradcache_contrastive")
    meta = snap["phasemem"]["meta"]
    marked = phasemem.analyze(copy.deepcopy(snap), marker_prefix="gt::")
    assert not any(p.kind == "checkpoint_recompute" for p in marked.patterns)
    rec = [p for p in marked.patterns if p.kind == "forward_rerun"]
    assert len(rec) == 3 and all(p.details["count"] == meta["chunks"] for p in rec)
    for p in rec:
        assert "checkpointing" not in p.explanation.split("not by")[0]
        frames = [_frames_of(snap, int(marked.analysis.facts.alloc[m])) for m in p.members]
        assert not any("torch/utils/checkpoint.py" in f for fr in frames for f in fr)
        # made by the loop's own encoder calls (all but the odd block of the chunk's backward among them)
        assert sum(any("record_heldout15.py:w_gradcache_contrastive" in f for f in fr) for fr in frames) >= 0.99 * len(frames)


def _autograd_workspace(snap: dict) -> int:
    """Bytes the first backward's cuBLAS handle set-up allocates and never frees."""
    ev = snap["device_traces"][0]
    freed = {e["addr"] for e in ev if e["action"] == "free_completed"}
    return sum(e["size"] for e in ev if e["action"] == "alloc" and e["addr"] not in freed
               and any("setWorkspaceForHandle" in f["name"] for f in e.get("frames") or []))


def test_the_autograd_threads_workspace_is_no_gradient():
    """The first backward's cuBLAS workspace (32 MiB) has the embedding's size: it was a 51st
    'gradient' (112 MiB for 80 MiB of weights) and made the optimizer state 1.43x the gradients."""
    snap = recording(HELDOUT15, "h15_gradcache_contrastive")
    meta = snap["phasemem"]["meta"]
    assert _autograd_workspace(snap) >= 32 << 20
    for how, r in marked_and_plain(snap):
        grads = [p for p in r.patterns if p.kind == "gradients" and not p.details.get("release")]
        assert grads and all(p.bytes == meta["param_bytes"] for p in grads), how
        (state,) = [p for p in r.patterns if p.kind == "optimizer_state_init"]
        assert state.bytes == 2 * meta["param_bytes"], how
        assert r.by_category["gradient"] in (0, meta["param_bytes"]), how


@pytest.mark.parametrize("name,key", [("h15_selective_ac", "layers"), ("h15_chunked_ce", "chunks")])
def test_recompute_told_by_checkpoints_frames(name, key):
    """A selective policy saves the matmuls, a checkpointed loss chunk makes two blocks: no run of
    sizes repeats, but checkpoint's frames count the recomputes (6 blocks; 8 loss chunks)."""
    snap = recording(HELDOUT15, name)
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain(snap):
        rec = [p for p in r.patterns if p.kind == "checkpoint_recompute"]
        assert len(rec) == 3 and all(p.details["count"] == meta[key] for p in rec), how
        facts = r.analysis.facts
        for p in rec:
            assert all(any("torch/utils/checkpoint.py" in f for f in _frames_of(snap, int(facts.alloc[m])))
                       for m in p.members), how
            assert not any("Workspace" in f for m in p.members for f in _frames_of(snap, int(facts.alloc[m]))), how


def test_a_chunked_loss_is_not_told_to_chunk_its_loss():
    """The batch x sequence x vocabulary logits never exist (no allocation of their size); nothing
    says 'compute the loss in chunks' of a loss computed in chunks."""
    snap = recording(HELDOUT15, "h15_chunked_ce")
    meta = snap["phasemem"]["meta"]
    full = meta["batch"] * meta["seq"] * meta["vocab"] * 4
    assert not any(e["size"] >= full for e in snap["device_traces"][0] if e["action"] == "alloc")
    for how, r in marked_and_plain(snap):
        assert not any("in chunks" in p.explanation for p in r.patterns if p.kind != "checkpoint_recompute"), how
        assert not any(p.bytes >= full for p in r.patterns if p.kind == "logits"), how
        assert r.by_category["parameter"] == meta["param_bytes"], how


@pytest.mark.parametrize("name", ["h15_beam_search", "h15_speculative_decode"])
def test_decoding_is_forward_only_with_all_its_weights(name):
    """Beam search (its cache reordered every token) and a draft + target pair: the weights of both
    models, no training shapes, one step per request where marked."""
    snap = recording(HELDOUT15, name)
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain(snap):
        assert r.by_category["parameter"] == meta["param_bytes"], how
        assert not {p.kind for p in r.patterns} & {"logits", "gradients", "optimizer_state_init",
                                                   "checkpoint_recompute"}, how
    marked, plain = (r for _, r in marked_and_plain(snap))
    assert len(marked.steps) == meta["requests"]
    assert len(plain.steps) == 1 and any("forward passes only" in n for n in plain.notes)


@pytest.mark.parametrize("name", ["h15_shared_layers", "h15_func_ensemble"])
def test_shared_and_stacked_weights(name):
    """One block used 12 times has one gradient per weight, accumulated in place (no micro-batches);
    an ensemble's stacked weights (made before recording) are the parameters, Adam's state twice them."""
    snap = recording(HELDOUT15, name)
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain(snap):
        assert r.by_category["parameter"] == meta["param_bytes"], how
        grads = [p for p in r.patterns if p.kind == "gradients" and not p.details.get("release")]
        assert len(grads) == 3 and all(p.bytes == meta["param_bytes"] for p in grads), how
        assert not any(p.kind == "gradient_accumulation" for p in r.patterns), how
        (state,) = [p for p in r.patterns if p.kind == "optimizer_state_init"]
        assert state.bytes == 2 * meta["param_bytes"], how


@pytest.mark.parametrize("name", ["h15_shared_layers", "h15_selective_ac"])
def test_the_embeddings_late_gradient_without_frames(name):
    """Without frames or annotations: the embedding's backward runs after the last activation is
    freed, and its gradient (a weight's size, freed by the next zero_grad with the others) began the
    optimizer: 'parameters' short by the embedding (114 of 178 MiB), state 2.74x the gradients."""
    snap = recording(HELDOUT15, name)
    meta = snap["phasemem"]["meta"]
    marked = phasemem.analyze(copy.deepcopy(snap), marker_prefix="gt::")
    r = phasemem.analyze(bare(snap))
    assert r.by_category["parameter"] == meta["param_bytes"]
    # the optimizer of the first step starts where the marks say
    opt = marked.steps[0].phases["optimizer"].start_event
    assert r.steps[0].phases["optimizer"].start_event == opt
    assert r.analysis.labels[opt - 1] != r.analysis.labels[opt]
