"""Snapshots other people recorded and published (../shared/wild, never committed): what phasemem
says about each must be true of the program that recorded it.

The truth is the recording program's source, read at the commit ../shared/wild/SOURCES.md names
(docs/wild.md has one row per file: repository, path, what the program did). Sizes below come from
the model dimensions in that source, never from phasemem. Every test skips when ../shared/wild is
absent.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

import phasemem
from phasemem.vocab import PHASES

WILD = Path(__file__).resolve().parents[2] / "shared" / "wild"
LM_SHAPES = {"logits", "softmax_spike", "logits_release"}
OPTIMIZER_SHAPES = {"optimizer_state_init", "optimizer_temporaries"}

# What each program did, from its source (docs/wild.md): forward, backward, optimizer, vocabulary-sized
# cross-entropy, and the logits' size where the source gives batch × context × vocabulary × bytes.
PROGRAMS = {
    "magma27_cs336": dict(backward=True, optimizer=False, ce=True, logits=32 * 256 * 10000 * 4),
    "bcrafton_cs336": dict(backward=True, optimizer=True, ce=True, logits=1 * 64 * 50257 * 4, rebinds_state=True),
    "wedsonlin_medium512_train": dict(backward=True, optimizer=True, ce=True, rebinds_state=True),
    "kkaitlyn_ctx128_fullstep": dict(backward=True, optimizer=True, ce=True, state_created=True),
    "nothanmin_cs336": dict(backward=True, optimizer=True, ce=False),  # loss = logits.sum()
    "cranberrii_ftcourse": dict(backward=True, optimizer=False, ce=True),
    "silmont_mem_snapshot": dict(backward=True, optimizer=False, ce=False),  # toy attention, .sum()
    "silmont_memory_forward_bf16_128": dict(backward=False, optimizer=False, ce=False),
    "silmont_memory_forward_fp32_128": dict(backward=False, optimizer=False, ce=False),
    "kkaitlyn_ctx256_forward_mixed": dict(backward=False, optimizer=False, ce=False),
    "octreenca_mysnap": dict(backward=False, optimizer=False, ce=False),  # a cellular automaton
    "sqattn_cuda": dict(backward=False, optimizer=False, ce=False),  # layer-by-layer calibration
}


def _path(name: str) -> Path:
    p = WILD / f"{name}.pickle"
    if not p.exists():
        pytest.skip(f"{p} is not here (../shared/wild is never committed)")
    return p


_reports: dict = {}


def _report(name: str):
    if name not in _reports:
        _reports[name] = phasemem.analyze(_path(name))
    return _reports[name]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_no_optimizer_claim_without_an_optimizer(name):
    r, truth = _report(name), PROGRAMS[name]
    kinds = {p.kind for p in r.patterns}
    if not truth["optimizer"]:
        assert "optimizer" not in r.phases
        assert not kinds & OPTIMIZER_SHAPES
    else:
        assert "optimizer" in r.phases


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_language_model_shapes_only_where_a_cross_entropy_ran(name):
    r, truth = _report(name), PROGRAMS[name]
    kinds = {p.kind for p in r.patterns}
    if not truth["ce"]:
        assert not kinds & LM_SHAPES, [p.kind for p in r.patterns]
    if truth.get("logits"):
        assert [p.bytes for p in r.patterns_of("logits")] == [truth["logits"]]


@pytest.mark.parametrize("name", sorted(n for n, t in PROGRAMS.items() if not t["backward"]))
def test_forward_only_runs_are_forward_and_one_step(name):
    r = _report(name)
    assert "backward" not in r.phases and "optimizer" not in r.phases
    assert len(r.steps) == 1
    # the forward passes are forward: most allocations are labelled so (sqattn's others move weights
    # to the GPU between layers: 'other'), and none a phase that never ran
    allocs = r.analysis.trace.action == 0
    assert set(r.labels[allocs]) <= {"forward", "other"}
    assert np.mean(r.labels[allocs] == "forward") >= 0.85
    assert any("forward passes only" in n for n in r.notes)


@pytest.mark.parametrize("name", ["wedsonlin_medium512_train", "bcrafton_cs336"])
def test_state_rebound_every_step_is_not_created_state(name):
    """A hand-written AdamW that assigns new state["m"], state["v"] each step, one step after warm-up:
    the old state existed before recording and is freed as the new one is made."""
    assert not _report(name).patterns_of("optimizer_state_init")


def test_state_created_in_the_recorded_first_step():
    """kkaitlyn_ctx128_fullstep records the first step ever: its AdamW makes m and v (zeros_like) there."""
    r = _report("kkaitlyn_ctx128_fullstep")
    (init,) = r.patterns_of("optimizer_state_init")
    assert init.details["ratio_to_gradients"] == pytest.approx(2.0, abs=0.01)


def test_hand_written_optimizer_is_not_told_to_pass_fused():
    for name in ("nothanmin_cs336", "wedsonlin_medium512_train", "bcrafton_cs336"):
        for p in _report(name).patterns_of("optimizer_temporaries"):
            assert "Pass fused=True" not in p.explanation and p.details["own_code"]


def test_windows_frames_are_read():
    """magma27 ran on Windows (backslashes): its forward is forward by frames, its backward backward."""
    r = _report("magma27_cs336")
    assert r.phases["forward"].source == "inferred" and r.phases["forward"].n_events > 1000
    assert r.phases["backward"].n_events > 3000


def test_moved_layer_weights_are_parameters():
    """sqattn moves each decoder layer to the GPU (module.to) before running it twice."""
    r = _report("sqattn_cuda")
    assert r.by_category["input"] == 0 and r.by_category["parameter"] > 0


def test_out_of_memory_on_another_device_is_the_first_line():
    r = _report("constructorsun_codeloc")
    raw = pickle.loads(_path("constructorsun_codeloc").read_bytes())
    ooms = [(d, i, e) for d, t in enumerate(raw["device_traces"]) for i, e in enumerate(t) if e["action"] == "oom"]
    assert len(ooms) == 1
    d, i, e = ooms[0]
    assert r.device != f"cuda:{d}"  # the busiest device is another one...
    (o,) = r.ooms  # ... and the OOM is still reported, first
    assert (o.device, o.event, o.requested_bytes, o.device_free_bytes) == (f"cuda:{d}", i, e["size"], e["device_free"])
    assert str(r).splitlines()[0].startswith(f"OUT OF MEMORY on cuda:{d} at event {i}")
    assert {s.device for s in r.other_devices} == {f"cuda:{k}" for k in range(len(raw["device_traces"]))
                                                    if raw["device_traces"][k]} - {r.device}


def test_default_device_is_where_the_memory_is():
    """layoutedit_dump: one trace entry on each of two devices, every segment on cuda:1."""
    raw = pickle.loads(_path("layoutedit_dump").read_bytes())
    devices = {s["device"] for s in raw["segments"]}
    assert devices == {1}
    assert _report("layoutedit_dump").device == "cuda:1"


@pytest.mark.parametrize("path", sorted(WILD.glob("*.pickle")) if WILD.exists() else [], ids=lambda p: p.stem)
def test_the_report_tells_the_truth_about_itself(path):
    try:
        r = phasemem.analyze(path)
    except phasemem.PhasememError:
        return  # a one-line refusal is a true statement (the empty snapshot)
    text = str(r)
    assert "None" not in text
    for p in r.patterns:
        if p.kind != "leak":  # a shape's phase is the phase its events carry
            assert p.phase == PHASES[int(r.analysis.labels[p.start_event])]


def test_out_of_memory_is_marked_in_the_picture():
    r = phasemem.analyze(_path("constructorsun_codeloc"), device=1)
    fig = r.plot()
    lines = [a for a in fig.findobj() if a.get_gid() == "oom"]
    (o,) = [o for o in r.ooms if o.device == r.device]
    assert len(lines) == 1 and lines[0].get_xdata()[0] == o.event
    assert any(t.get_text().startswith("OUT OF MEMORY: asked ") for t in fig.axes[0].texts)


LEGACY = ["yiyi_oom", "yiyi_opt1.3b", "yiyi_opt1.3b_log1", "diffusion_mysnap", "sketchkv_mysnap", "layoutedit_dump",
          "layoutedit_memsnap"]


@pytest.mark.parametrize("name", LEGACY)
def test_legacy_snapshots_say_they_hold_no_history(name):
    """Legacy recordings (one trace entry) and a bare segment list: the report says there is no history
    and gives the live memory, the active blocks' bytes counted here from the raw pickle."""
    raw = pickle.loads(_path(name).read_bytes())
    segments = raw if isinstance(raw, list) else raw["segments"]
    r = _report(name)
    assert r.live is not None and not r.steps and not r.patterns
    dev = r.live.device
    want = sum(b.get("requested_size", b["size"]) for s in segments if s["device"] == dev for b in s["blocks"]
               if b["state"] in ("active_allocated", "active_pending_free"))
    assert r.live.allocated_bytes == want == r.peak_bytes
    assert str(r).splitlines()[0].endswith("this snapshot holds no allocation history")
    # nothing is called a parameter that no stack says is one (diffusion_mysnap's module.to() blocks are)
    said = r.live.by_category.get("parameter", 0)
    assert ("made of (where the allocating stack says) parameter" in str(r)) == bool(said)


def test_the_last_gradient_is_not_called_the_embeddings_when_it_is_not():
    """cranberrii_ftcourse trains LoRA adapters on a frozen 8-bit TinyLlama: the last gradient is an
    adapter's (128 KiB), not the embedding's (frozen, 32000 × 2048)."""
    (g,) = [p for p in _report("cranberrii_ftcourse").patterns_of("gradients") if p.phase == "backward"]
    assert "embedding" not in g.explanation


def test_a_workspace_from_before_recording_is_not_a_weight():
    """kkaitlyn_ctx256_forward_mixed: the 2.7B CS336 model (d 2560, d_ff 10240, 32 layers, vocab
    10000; cs336_systems/benchmark.py's get_model_config) kept in fp32 under autocast, and cuBLAS's
    32 MiB workspace, whose stack in segments names getNewWorkspace, beside it."""
    r = _report("kkaitlyn_ctx256_forward_mixed")
    d, ff, layers, vocab = 2560, 10240, 32, 10000
    # fp32, as requested (the segments' requested_size, not the 2 MiB-rounded block)
    weights = 4 * (layers * (4 * d * d + 3 * d * ff) + 2 * vocab * d)
    param = r.by_category["parameter"]
    assert weights <= param <= weights + (4 << 20)  # plus the norms' small blocks
    assert r.by_category["other"] >= 32 << 20


def test_a_bare_function_has_no_weights():
    """silmont_mem_snapshot: trace_peak_memory.py (133f064) makes Q, K, V (8×4096×16, requires_grad)
    and runs an attention function with no module: nothing there is a parameter."""
    r = _report("silmont_mem_snapshot")
    assert r.by_category["parameter"] == 0
    qkv = 3 * 8 * 4096 * 16 * 4
    assert r.by_category["other"] + r.by_category.get("input", 0) >= qkv


def test_the_autograd_threads_workspace_is_no_gradient_of_the_27b_model():
    """kkaitlyn_ctx128_fullstep: the same 2.7B config (cs336_systems/benchmark.py at 46eae3f8), one full
    step. The first backward makes the autograd thread's 32 MiB cuBLAS workspace (getNewWorkspace under
    getCurrentCUDABlasHandle in this torch's stack) and keeps it; it was counted among the gradients
    (13.66 GB for 13.63 GB of weights)."""
    path = _path("kkaitlyn_ctx128_fullstep")
    with open(path, "rb") as f:
        snap = pickle.load(f)
    ev = snap["device_traces"][0]
    freed = {e["addr"] for e in ev if e["action"] == "free_completed"}
    kept_ws = sum(e["size"] for e in ev if e["action"] == "alloc" and e["addr"] not in freed
                  and any("getCurrentCUDABlasHandle" in fr["name"] for fr in e.get("frames") or []))
    assert kept_ws >= 32 << 20
    r = _report("kkaitlyn_ctx128_fullstep")
    d, ff, layers, vocab = 2560, 10240, 32, 10000
    weights = 4 * (layers * (4 * d * d + 3 * d * ff) + 2 * vocab * d)
    (grads,) = [p for p in r.patterns if p.kind == "gradients" and not p.details.get("release")]
    assert weights <= grads.bytes <= weights + (4 << 20)  # plus the norms' small ones
    (init,) = r.patterns_of("optimizer_state_init")
    assert init.bytes == 2 * grads.bytes


def test_logits_held_to_the_dump_are_not_said_to_be_freed():
    """magma27_cs336 dumps its snapshot inside the loop, while `lm_head` still holds the recorded step's
    logits: the trace never frees them. The logits' release said they were held "until event 5162", a
    free the trace does not show; it names the recording's end as such."""
    path = _path("magma27_cs336")
    with open(path, "rb") as f:
        events = pickle.load(f)["device_traces"][0]
    report = _report("magma27_cs336")
    (logits,) = [p for p in report.patterns if p.kind == "logits"]
    addr = events[logits.start_event]["addr"]  # the logits' block, its alloc from the raw trace
    assert events[logits.start_event]["action"] == "alloc"
    assert not any(e["addr"] == addr and e["action"].startswith("free") for e in events[logits.start_event + 1:])
    (release,) = [p for p in report.patterns if p.kind == "logits_release"]
    assert f"to the end of the recording (event {len(events) - 1}; the trace never frees them)" in release.explanation
    assert "until event" not in release.explanation
