"""Held-out set 7 (fixtures/heldout7, fixtures/record_heldout7.py): recordings cut as users cut them
(a ring buffer that wrapped, a state-only snapshot) and programs with frozen, copied or alternating
weights. Each truth comes from the raw snapshot — the gt:: ranges, the blocks' own frames, the
recording's meta — not from phasemem.
"""
from __future__ import annotations

import lzma
import pickle
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import phasemem
from heldout_sets import as_handed_over, marked_and_plain, recording

ROOT = Path(__file__).resolve().parents[1]
HELDOUT7 = ROOT / "fixtures" / "heldout7"


def _snap(name: str) -> dict:
    return recording(HELDOUT7, name)


_plain = as_handed_over
_both = marked_and_plain


def test_wrapped_ring_numbers_the_steps_it_kept_and_says_so():
    """max_entries=2500 kept the end of a 6-step run: the steps are numbered as the loop numbered them
    (the gt::stepN ranges that end inside the kept events), and the baseline is not called memory
    from before recording."""
    snap = _snap("h7_ring_wrapped")
    t0 = snap["device_traces"][0][0]["time_us"]
    ends = {}
    for a in snap["external_annotations"]:
        m = re.fullmatch(r"gt::step(\d+)", a["name"])
        if m and a["stage"] == "END":
            ends[int(m.group(1))] = a["time_us"]
    kept = sorted(k for k, t in ends.items() if t >= t0)
    assert kept[0] > 0 and len(kept) < snap["phasemem"]["meta"]["nsteps"]
    for how, r in _both(snap):
        assert [s.number for s in r.steps] == kept, how
        assert not r.steps[0].complete and all(s.complete for s in r.steps[1:]), how
        line = str(r).splitlines()[1]
        assert "before the trace's first event (the ring buffer dropped" in line and "before recording" not in line, how


def test_state_only_snapshot_names_its_sites_from_the_frames():
    """enabled="state" keeps no history: the report says how it was taken (not the legacy call, which
    records a trace), and a block made by backward on the autograd thread (C++ frames only) is
    listed under the autograd node its frames name, as many bytes as the raw blocks hold."""
    snap = _snap("h7_state_only")
    node = re.compile(r"^torch::autograd::generated::(\w+)::apply\(")
    want: Counter = Counter()
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            fr = b.get("frames") or []
            if b["state"] == "active_allocated" and fr and not any(f["filename"].endswith(".py") for f in fr):
                names = [m.group(1) for f in fr if (m := node.match(f["name"]))]
                if names:
                    want[f"{names[0]} (backward, autograd thread)"] += b["requested_size"]
    assert len(want) >= 3
    r = phasemem.analyze(snap)
    assert r.live is not None
    text = str(r)
    assert 'enabled="state"' in text and "legacy" not in text
    got = {site: n for site, n, _ in r.live.by_site}
    for site, n in want.items():
        assert got.get(site) == n, site


def _param_blocks(snap: dict) -> int:
    return snap["phasemem"]["meta"]["param_bytes"]


def test_alternating_optimizers_name_every_trained_weight():
    """SAC trains its critics and its actor in turns, with one Adam each; the actor's 4 MiB weight has
    the critics' size. Every trained weight is a parameter (the critics' and the actor's: all but
    the two target critics, frozen copies updated by Polyak averaging), and the steps are the
    gt::step ranges."""
    snap = _snap("h7_sac")
    total = _param_blocks(snap)
    # actor + 2 critics trained; 2 target critics of the critics' size are not (record_heldout7.w_sac)
    obs, act, hidden = 64, 8, 1024
    critic = (obs + act) * hidden + hidden + hidden * hidden + hidden + hidden + 1
    actor = obs * hidden + hidden + hidden * hidden + hidden + hidden * 2 * act + 2 * act
    assert (actor + 4 * critic) * 4 == total
    for how, r in _both(snap):
        # exact but for scalars: a 4-byte block from before recording has a 1-element bias's size
        assert abs(r.by_category["parameter"] - (actor + 2 * critic) * 4) <= 512, how
        assert len(r.steps) == 6, how
        # each Adam makes its state in its own first step: the critics' in step 0, the actor's in step 1
        state = {p.step: p.bytes for p in r.patterns_of("optimizer_state_init")}
        assert state == {0: 2 * 2 * critic * 4, 1: 2 * actor * 4}, how


def test_gan_parameters_are_both_networks():
    """WGAN-GP (heldout5): the critic's and the generator's weights share sizes and take turns; all
    of both are parameters, as many bytes as the model has (was 11.1 MB of 13.8 MB)."""
    path = ROOT / "fixtures" / "heldout5" / "h5_wgan_gp.pkl.xz"
    if not path.exists():
        pytest.skip(f"{path} is missing")
    snap = pickle.loads(lzma.decompress(path.read_bytes()))
    for how, r in _both(snap):
        assert r.by_category["parameter"] == _param_blocks(snap), how


def test_ema_copy_is_neither_parameter_nor_state():
    """AveragedModel's copy of the weights (made before recording, updated after each step) is not
    optimizer state and not the model's parameters: those are exactly the trained weights."""
    snap = _snap("h7_swa_ema_bf16")
    for how, r in _both(snap):
        life = r.analysis.timeline.lifetimes
        codes = np.asarray(r.analysis.categories.codes)
        kept = life.free_event >= r.n_events
        from phasemem.vocab import C
        assert int(life.size[kept & (codes == C["parameter"])].sum()) == _param_blocks(snap), how
        assert not r.patterns_of("leak"), how


def test_lora_parameters_are_the_adapters_and_the_frozen_base_is_said():
    snap = _snap("h7_peft_lora")
    meta = snap["phasemem"]["meta"]
    for how, r in _both(snap):
        assert r.by_category["parameter"] == meta["trainable_bytes"], how
        assert any("pair with no gradient" in n for n in r.notes), how


def test_inference_that_keeps_outputs_is_a_leak_only_where_requests_are_marked():
    """Forward-only without markers is one step, and a step's growth is no leak; with the gt::step
    ranges, every request leaves one tensor of the kept states' size."""
    snap = _snap("h7_decode_keeps_outputs")
    meta = snap["phasemem"]["meta"]
    kept = meta["batch"] * (meta["seq"] + 16) * 768 * 4  # batch x (prompt + 16 new) x width, fp32
    marked, plain = (r for _, r in _both(snap))
    assert [p.bytes for p in marked.patterns_of("leak")] and all(p.bytes == kept for p in marked.patterns_of("leak"))
    assert not plain.patterns_of("leak") and len(plain.steps) == 1
