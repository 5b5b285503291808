"""Programs recorded with torch's own defaults that phasemem was not built on (fixtures/heldout5,
fixtures/record_heldout5.py): what it says of them must be true. Each truth here comes from the raw
trace — the workload's own source lines in the events' frames, the gt:: ranges — not from phasemem.

Analysed twice: with the gt:: ranges as markers, and as a user would hand them over (the ranges
removed, PyTorch's own annotations and the stack frames kept: what a plain recording holds).
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import phasemem
from phasemem.vocab import C
from heldout_sets import as_handed_over, marked_and_plain, recording

ROOT = Path(__file__).resolve().parents[1]
HELDOUT5 = ROOT / "fixtures" / "heldout5"
SCRIPT = ROOT / "fixtures" / "record_heldout5.py"


def _snap(name: str) -> dict:
    return recording(HELDOUT5, name)


_plain = as_handed_over


def _both(name: str):
    return marked_and_plain(_snap(name))


def _line_of(function: str, text: str) -> int:
    """The line of ``text`` inside ``def function`` of the recording script."""
    lines = SCRIPT.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith(f"def {function}("))
    return next(i for i in range(start, len(lines)) if text in lines[i]) + 1


def _made_at(snap: dict, function: str, line: int) -> set[int]:
    """Alloc events whose innermost Python frame is ``function`` at ``line`` of the recording script."""
    out = set()
    for i, e in enumerate(snap["device_traces"][0]):
        if e["action"] != "alloc":
            continue
        py = [f for f in e.get("frames") or [] if f["filename"].endswith(".py")]
        if py and py[0]["filename"].endswith("record_heldout5.py") and py[0]["name"] == function and py[0]["line"] == line:
            out.add(i)
    return out


def _category_events(report, cat: str) -> set[int]:
    life = report.analysis.timeline.lifetimes
    codes = np.asarray(report.analysis.categories.codes)
    return set(life.alloc_event[(codes == C[cat]) & (life.alloc_event >= 0)].tolist())


@pytest.mark.parametrize("name", ["h5_wgan_gp", "h5_two_losses"])
def test_no_leak_and_no_accumulation_where_there_is_none(name):
    """WGAN-GP: the generator's Adam makes its state in its own first step and the loop's last
    tensors stay referenced: two steps keep different tensors, no leak. Its gradient penalty
    (autograd.grad) and two_losses' second backward on one forward are no micro-batches."""
    for how, r in _both(name):
        assert r.patterns_of("leak") == [], how
        assert r.patterns_of("gradient_accumulation") == [], how


@pytest.mark.parametrize("name", ["h5_two_losses", "h5_vae_handadam", "h5_gpt_varlen_ema"])
def test_inputs_are_the_batches_copied_to_the_device(name):
    """'input' is the batch: exactly the blocks the workload's `.to(a.device)` line made — not the
    loss computed outside the model (two_losses), not a hand-written optimizer's state (the VAE)."""
    snap = _snap(name)
    fn = "w_" + name[3:]
    text = "x, y = x.to(a.device), y.to(a.device)" if name != "h5_vae_handadam" else "x = x.to(a.device)"
    batches = _made_at(snap, fn, _line_of(fn, text))
    assert len(batches) == (3 if name == "h5_vae_handadam" else 6)
    for how, r in _both(name):
        assert _category_events(r, "input") == batches, how


@pytest.mark.parametrize("name, function, text, count", [
    ("h5_vit_infer_bf16", "w_vit_infer_bf16", "x = x.to(a.device, torch.bfloat16)", 3),
    ("h5_gpt_decode_kv", "w_gpt_decode_kv", "idx = p.to(a.device)", 2)])
def test_inference_inputs_are_the_copies_to_the_device(name, function, text, count):
    """Forward only, every call of the model in one step: the batches are the blocks C++ frames show
    copied (``_to_copy``)."""
    snap = _snap(name)
    batches = _made_at(snap, function, _line_of(function, text))
    assert len(batches) == count
    for how, r in _both(name):
        # the decode loop copies its prompt inside its gt::forward range: marked, that is forward's
        inside_forward = how == "marked" and name == "h5_gpt_decode_kv"
        assert _category_events(r, "input") == (set() if inside_forward else batches), how
    # recorded without C++ frames (stacks="python"): a block one call alone reads is the batch; the
    # decode loop's prompt is read by all 48 calls of its request, as the cache is: neither is
    bare = _plain(snap)
    for e in bare["device_traces"][0]:
        e["frames"] = [f for f in e.get("frames") or [] if f["filename"].endswith(".py")]
    got = _category_events(phasemem.analyze(bare), "input")
    if name == "h5_gpt_decode_kv":  # a sampled token that the next call reads may be; the prompt not
        assert not (got & batches) and all(bare["device_traces"][0][i]["size"] <= 512 for i in got)
    else:
        assert got == batches


def test_a_hand_written_optimizers_state_is_not_called_an_input_or_a_weight():
    """HandAdam (fixtures/record_heldout5.py) makes m and v with zeros_like on its first step: no
    torch.optim frame, and phasemem finds no optimizer phase without markers; then it must not call
    the state what it is not."""
    snap = _snap("h5_vae_handadam")
    state = _made_at(snap, "step", _line_of("step", "self.state[i] = (torch.zeros_like(p), torch.zeros_like(p))"))
    assert len(state) == 2 * 18  # two per parameter tensor (18 of them)
    for how, r in _both("h5_vae_handadam"):
        for cat in ("input", "parameter", "gradient", "activation", "temporary"):
            assert not (state & _category_events(r, cat)), (how, cat)
    marked = dict(_both("h5_vae_handadam"))["marked"]
    assert state <= _category_events(marked, "optimizer_state")


def test_an_ema_of_the_weights_is_not_optimizer_state():
    """The EMA copy was made before recording (gradient-sized blocks from before the trace) while
    AdamW made its state during it: optimizer state at the peak is AdamW's m and v only, the blocks
    made under torch/optim/ and never freed."""
    snap = _snap("h5_gpt_varlen_ema")
    ev = snap["device_traces"][0]
    state = 0
    for i, e in enumerate(ev):
        if e["action"] == "alloc" and any("torch/optim/" in f["filename"] for f in e.get("frames") or []):
            if not any(x["addr"] == e["addr"] and x["action"] == "free_completed" for x in ev[i + 1:]):
                state += e["size"]
    param_bytes = snap["phasemem"]["meta"]["param_bytes"]
    assert 1.99 * param_bytes <= state <= 2.01 * param_bytes  # m and v: two numbers per parameter
    for how, r in _both("h5_gpt_varlen_ema"):
        assert r.peak.by_category["optimizer_state"] == state, how


@pytest.mark.parametrize("name", ["h5_vit_infer_bf16", "h5_gpt_decode_kv"])
def test_inference_claims_nothing_of_training(name):
    """Forward only (inference_mode, a KV-cache decode loop): no gradients, no optimizer state, no
    training shapes; the KV cache is no input (made inside the model's call, not the batch)."""
    for how, r in _both(name):
        assert {p.kind for p in r.patterns} <= {"workspace"}, how
        assert r.peak.by_category["gradient"] == 0 and r.peak.by_category["optimizer_state"] == 0, how
        assert "optimizer" not in r.steps[0].phases and "backward" not in r.steps[0].phases, how


def test_a_kv_cache_is_not_an_input():
    snap = _snap("h5_gpt_decode_kv")
    line = _line_of("w_gpt_decode_kv", "cache = [(torch.empty(")  # keys there, values on the next line
    cache = _made_at(snap, "w_gpt_decode_kv", line) | _made_at(snap, "w_gpt_decode_kv", line + 1)
    assert len(cache) == 2 * 2 * 8  # per request, a key and a value block per layer
    for how, r in _both("h5_gpt_decode_kv"):
        assert not (cache & _category_events(r, "input")), how


def test_the_recording_script_names_every_fixture():
    names = set(re.findall(r'"(h5_[a-z0-9_]+)": w_', SCRIPT.read_text()))
    assert names == {p.name.split(".")[0] for p in HELDOUT5.glob("*.pkl.xz")}
