"""Inputs: the batch, exactly the blocks the program's copy to the device made; never a KV cache or
pool, a loss or an optimizer's state.

Truth from the raw snapshot (its gt:: and Optimizer.step ranges, the stacks of its allocations) and
the recording's meta (the model's own byte counts), never from phasemem. The held-out recordings
(fixtures/heldoutN, fixtures/record_heldoutN.py) are analysed twice: with the gt:: ranges as markers,
and as a user would hand them over (helpers.analyses.marked_and_plain); the ../shared/wild ones as
published (helpers.wild).
"""
from __future__ import annotations

import re

import pytest

import phasemem
from helpers.analyses import category_events, marked_and_plain
from helpers.paths import FIXTURES
from helpers.raw import line_of, made_at
from helpers.snapshots import as_handed_over, heldout

SCRIPT5 = FIXTURES / "record_heldout5.py"  # the heldout5 programs' source: its lines are the truth


@pytest.mark.parametrize("name", ["h5_two_losses", "h5_vae_handadam", "h5_gpt_varlen_ema"])
def test_inputs_are_the_batches_copied_to_the_device(name):
    """'input' is the batch: exactly the blocks the workload's `.to(a.device)` line made — not the
    loss computed outside the model (two_losses), not a hand-written optimizer's state (the VAE)."""
    snap = heldout(name)
    fn = "w_" + name[3:]
    text = "x, y = x.to(a.device), y.to(a.device)" if name != "h5_vae_handadam" else "x = x.to(a.device)"
    batches = made_at(snap, SCRIPT5, fn, line_of(SCRIPT5, fn, text))
    assert len(batches) == (3 if name == "h5_vae_handadam" else 6)
    for how, r in marked_and_plain(name):
        assert category_events(r, "input") == batches, how


@pytest.mark.parametrize("name, function, text, count", [
    ("h5_vit_infer_bf16", "w_vit_infer_bf16", "x = x.to(a.device, torch.bfloat16)", 3),
    ("h5_gpt_decode_kv", "w_gpt_decode_kv", "idx = p.to(a.device)", 2)])
def test_inference_inputs_are_the_copies_to_the_device(name, function, text, count):
    """Forward only, every call of the model in one step: the batches are the blocks C++ frames show
    copied (``_to_copy``)."""
    snap = heldout(name)
    batches = made_at(snap, SCRIPT5, function, line_of(SCRIPT5, function, text))
    assert len(batches) == count
    for how, r in marked_and_plain(name):
        # the decode loop copies its prompt inside its gt::forward range: marked, that is forward's
        inside_forward = how == "marked" and name == "h5_gpt_decode_kv"
        assert category_events(r, "input") == (set() if inside_forward else batches), how
    # recorded without C++ frames (stacks="python"): a block one call alone reads is the batch; the
    # decode loop's prompt is read by all 48 calls of its request, as the cache is: neither is
    bare = as_handed_over(snap)
    for e in bare["device_traces"][0]:
        e["frames"] = [f for f in e.get("frames") or [] if f["filename"].endswith(".py")]
    got = category_events(phasemem.analyze(bare), "input")
    if name == "h5_gpt_decode_kv":  # a sampled token that the next call reads may be; the prompt not
        assert not (got & batches) and all(bare["device_traces"][0][i]["size"] <= 512 for i in got)
    else:
        assert got == batches


def test_a_kv_cache_is_not_an_input():
    snap = heldout("h5_gpt_decode_kv")
    line = line_of(SCRIPT5, "w_gpt_decode_kv", "cache = [(torch.empty(")  # keys there, values on the next line
    cache = made_at(snap, SCRIPT5, "w_gpt_decode_kv", line) | made_at(snap, SCRIPT5, "w_gpt_decode_kv", line + 1)
    assert len(cache) == 2 * 2 * 8  # per request, a key and a value block per layer
    for how, r in marked_and_plain("h5_gpt_decode_kv"):
        assert not (cache & category_events(r, "input")), how


def test_the_recording_script_names_every_fixture():
    names = set(re.findall(r'"(h5_[a-z0-9_]+)": w_', SCRIPT5.read_text()))
    assert names == {p.name.split(".")[0] for p in (FIXTURES / "heldout5").glob("*.pkl.xz")}


def _pool(snap: dict) -> int:
    """The engine's block pool: the one block of the meta's pool size the trace allocates."""
    size = snap["phasemem"]["meta"]["pool_bytes"]
    (i,) = [i for i, e in enumerate(snap["device_traces"][0]) if e["action"] == "alloc" and e["size"] == size]
    return i


def test_a_kv_block_pool_is_no_input():
    """The serving engine's paged KV pool (768 MiB) is made at start-up, before the first marked
    forward, and read by all 137 engine iterations: it was 'inputs 768 MiB' with the marks."""
    snap = heldout("h16_serve_paged")
    meta = snap["phasemem"]["meta"]
    first_fwd = min(a["time_us"] for a in snap["external_annotations"] if a["name"] == "gt::forward")
    assert snap["device_traces"][0][_pool(snap)]["time_us"] < first_fwd
    for how, r in marked_and_plain("h16_serve_paged"):
        assert r.by_category["input"] < meta["pool_bytes"], how
        assert r.by_category["parameter"] == meta["param_bytes"], how
        assert not {p.kind for p in r.patterns} & {"gradients", "optimizer_state_init", "logits"}, how
