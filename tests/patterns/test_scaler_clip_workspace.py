"""The small shapes between backward and the update (amp_unscale, grad_clip) and cuBLAS's workspace:
named without frames where the recorded frames say they ran, and only there.
"""
from __future__ import annotations

import pytest

import phasemem
from helpers.paths import FIXTURES
from helpers.snapshots import load_snapshot


def test_knocking_out_the_workspace_detector_is_caught(knock_out):
    """Without the workspace detector's output the first test fails (no pattern truth counts
    workspaces: patterns/test_pattern_truth.py knocks out the others)."""
    knock_out("workspace")
    with pytest.raises(AssertionError):
        test_gradscaler_check_and_workspaces_named_where_frames_say_so()


def test_gradscaler_check_and_workspaces_named_where_frames_say_so():
    """Ground truth from frames (torch/amp/grad_scaler.py; the first recorded matmul), detection without."""
    from helpers.paths import FIXTURES

    for name, amp in (("mlp_fp16_scaler", True), ("gpt_fp16_accum", True), ("gpt_foreach", False)):
        path = FIXTURES / f"{name}.pkl.xz"
        snap = load_snapshot(path)
        events = snap["device_traces"][0]
        scaler = {i for i, e in enumerate(events) if e["action"] == "alloc"
                  and any("grad_scaler.py" in f["filename"] for f in e.get("frames") or [])}
        for e in events:
            e["frames"] = []
        report = phasemem.analyze(snap)
        found = report.patterns_of("amp_unscale")
        assert bool(found) == amp
        for p in found:
            made = [i for i in range(p.start_event, p.end_event + 1) if events[i]["action"] == "alloc"]
            assert set(made) <= scaler
        if name == "gpt_foreach":  # the first workload of its process: cuBLAS made its workspaces here
            ws = report.patterns_of("workspace")
            assert len(ws) == 1 and 32 << 20 in ws[0].details["sizes"]


@pytest.mark.parametrize("path", sorted((FIXTURES).glob("**/*.pkl.xz")),
                         ids=lambda p: p.name.split(".")[0])
def test_gradient_clipping_and_gradscaler_told_apart(path):
    """Both leave one-element tensors between backward and the optimizer; the recorded frames say
    which ran (torch/nn/utils/clip_grad.py, torch/amp/grad_scaler.py). Named without frames."""
    snap = load_snapshot(path)
    events = snap["device_traces"][0]

    prefix = (snap.get("phasemem") or {}).get("markers", "phasemem::")
    # where the loop marks scaler.step itself as its optimizer phase (h11_resnet50_amp_cl), the check
    # runs inside that phase and is the optimizer's (docs/patterns.md): only checks outside count
    marked, open_ = [], {}
    for a in snap.get("external_annotations") or []:
        if a["name"] == prefix + "optimizer":
            if a["stage"] == "START":
                open_[a["name"]] = a["time_us"]
            elif a["name"] in open_:
                marked.append((open_.pop(a["name"]), a["time_us"]))

    def ran(where, name=""):
        return any(where in f["filename"] and name in f["name"] and not any(t0 <= e["time_us"] <= t1 for t0, t1 in marked)
                   for e in events if e["action"] == "alloc" for f in e.get("frames") or [])

    # GradScaler's check is its unscale_ (scale() and update() allocate too, elsewhere in the step)
    clip, scaler = ran("clip_grad.py"), ran("grad_scaler.py", "unscale")
    for e in events:
        e["frames"] = []
    report = phasemem.analyze(snap, marker_prefix=prefix)
    assert bool(report.patterns_of("grad_clip")) == clip
    assert bool(report.patterns_of("amp_unscale")) == (scaler and not clip)
