"""Forward-only programs (inference, generation, serving, evaluation) claim nothing of training: no
gradients, no optimizer state or update, no LM shapes of a loss that never ran.

Truth from the raw snapshot (its gt:: and Optimizer.step ranges, the stacks of its allocations) and
the recording's meta (the model's own byte counts), never from phasemem. The held-out recordings
(fixtures/heldoutN, fixtures/record_heldoutN.py) are analysed twice: with the gt:: ranges as markers,
and as a user would hand them over (helpers.analyses.marked_and_plain); the ../shared/wild ones as
published (helpers.wild).
"""
from __future__ import annotations

import pytest

from helpers.analyses import analyzed, marked_and_plain
from helpers.snapshots import heldout


@pytest.mark.parametrize("name", ["h5_vit_infer_bf16", "h5_gpt_decode_kv"])
def test_inference_claims_nothing_of_training(name):
    """Forward only (inference_mode, a KV-cache decode loop): no gradients, no optimizer state, no
    training shapes; the KV cache is no input (made inside the model's call, not the batch)."""
    for how, r in marked_and_plain(name):
        assert {p.kind for p in r.patterns} <= {"workspace"}, how
        assert r.peak.by_category["gradient"] == 0 and r.peak.by_category["optimizer_state"] == 0, how
        assert "optimizer" not in r.steps[0].phases and "backward" not in r.steps[0].phases, how


def test_generate_claims_nothing_of_training():
    for how, r in marked_and_plain("h6_hf_generate"):
        assert not r.patterns, how  # no leak (the cache grows inside a request), no optimizer, no gradients
        assert r.by_category["gradient"] == r.by_category["optimizer_state"] == 0, how


@pytest.mark.parametrize("name", ["h14_compiled_infer_dynamic"])
def test_compiled_inference_is_forward_only_with_its_weights(name):
    snap = heldout(name)
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain(name):
        assert r.by_category["parameter"] == meta["param_bytes"], how
        assert not {p.kind for p in r.patterns} & {"logits", "gradients", "optimizer_state_init"}, how
    plain = marked_and_plain(name)[1][1]
    assert len(plain.steps) == 1 and any("forward passes only" in n for n in plain.notes)


@pytest.mark.parametrize("name", ["h15_beam_search", "h15_speculative_decode"])
def test_decoding_is_forward_only_with_all_its_weights(name):
    """Beam search (its cache reordered every token) and a draft + target pair: the weights of both
    models, no training shapes, one step per request where marked."""
    snap = heldout(name)
    meta = snap["phasemem"]["meta"]
    for how, r in marked_and_plain(name):
        assert r.by_category["parameter"] == meta["param_bytes"], how
        assert not {p.kind for p in r.patterns} & {"logits", "gradients", "optimizer_state_init",
                                                   "checkpoint_recompute"}, how
    marked, plain = (r for _, r in marked_and_plain(name))
    assert len(marked.steps) == meta["requests"]
    assert len(plain.steps) == 1 and any("forward passes only" in n for n in plain.notes)


def test_a_serving_engine_without_frames_has_no_optimizer():
    """Its KV pages, freed in bursts, come in too few of the parameters' sizes to be an update's
    (infer/other_work.covers_an_update)."""
    r = analyzed("h16_serve_paged", "bare")
    assert not {p.kind for p in r.patterns} & {"optimizer_temporaries", "optimizer_state_init", "gradients"}
