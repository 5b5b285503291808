"""Shapes and categories on real H200 traces, with every stack frame removed.

Ground truth comes from how the snapshots were recorded (../shared/gpu-snapshots/README.md and
each file's meta), never from the detectors.
"""
from pathlib import Path

import numpy as np
import pytest

import phasemem

from conftest import load_snapshot, shared_paths

# From the recording README: model dimensions and training set-up of each shared snapshot.
KNOWN = {
    "gpt_adamw_foreach": dict(logits=4 * 1024 * 50304 * 4, layers=6, ckpt=False, fused=False),
    "gpt_ckpt_fused_seedlike": dict(logits=4 * 1024 * 151936 * 2, layers=8, ckpt=True, fused=True),
    "mlp_fp16_scaler": dict(logits=None, layers=8, ckpt=False, fused=False),
}


def _analyse(path):
    import lzma, pickle

    meta = pickle.loads(lzma.decompress(path.read_bytes()))["meta"]
    snap = load_snapshot(path)
    for e in snap["device_traces"][0]:
        e["frames"] = []
    return phasemem.analyze(snap, marker_prefix="gt::"), meta, KNOWN[path.name.split(".")[0]]


@pytest.fixture(params=shared_paths() or [None], ids=lambda p: p.name.split(".")[0] if p else "missing")
def analysed(request):
    if request.param is None:
        pytest.skip("no real GPU snapshots")
    return _analyse(request.param)


def _close(a, b, tol=0.02):
    return abs(a - b) <= tol * b


def test_logits_only_with_an_lm_head_shared(analysed):
    report, _, known = analysed
    logits = report.patterns_of("logits")
    if known["logits"] is None:
        assert logits == [] and report.patterns_of("softmax_spike") == []
        return
    assert [p.step for p in logits] == list(range(len(report.steps)))
    assert all(p.bytes == known["logits"] for p in logits)
    for p in logits:
        assert 0 < p.details["vocab_share_of_peak"] <= 1
        assert report.analysis.labels[p.start_event] == 1  # made in forward
    # The spike sits on the logits and sets the forward's peak; the release opens backward.
    for spike, st in zip(report.patterns_of("softmax_spike"), report.steps):
        assert spike.peak_event == st.phases["forward"].peak_event
    for rel, st in zip(report.patterns_of("logits_release"), report.steps):
        assert rel.start_event == st.phases["backward"].start_event
        assert rel.bytes >= known["logits"]


def test_checkpoint_recompute_counts_layers_shared(analysed):
    report, _, known = analysed
    found = report.patterns_of("checkpoint_recompute")
    if not known["ckpt"]:
        assert found == []
        return
    assert [p.details["count"] for p in found] == [known["layers"]] * len(report.steps)


def test_gradients_are_the_parameters_shared(analysed):
    report, meta, _ = analysed
    grads = [p for p in report.patterns_of("gradients") if p.phase == "backward"]
    assert len(grads) == len(report.steps)
    assert all(_close(p.bytes, meta["param_bytes"]) for p in grads)
    released = [p for p in report.patterns_of("gradients") if p.phase == "zero_grad"]
    assert [p.step for p in released] == list(range(1, len(report.steps)))  # step 0 has nothing to free


def test_adam_state_once_and_temporaries_unless_fused_shared(analysed):
    report, meta, known = analysed
    state = report.patterns_of("optimizer_state_init")
    assert [p.step for p in state] == [0]
    assert _close(state[0].bytes, 2 * meta["param_bytes"])
    temps = report.patterns_of("optimizer_temporaries")
    if known["fused"]:
        assert [p.step for p in temps] == []
    else:
        assert [p.step for p in temps] == list(range(len(report.steps)))
        for p in temps:
            assert 0 < p.details["flagpole_bytes"] <= p.bytes
            assert report.analysis.labels[p.peak_event] == 5  # optimizer
    assert report.patterns_of("leak") == []


def test_categories_sum_to_the_curve_and_match_the_model_shared(analysed):
    report, meta, _ = analysed
    tl = report.analysis.timeline
    every = report.analysis.categories.at_level(np.arange(report.n_events), tl)
    assert (every.sum(axis=1) == tl.level).all()
    cats = report.categories()
    assert _close(cats["parameter"], meta["param_bytes"])
    assert _close(report.phases["optimizer"].by_category["optimizer_state"], 2 * meta["param_bytes"])
    # During the optimizer step the gradients are all alive.
    assert _close(report.phases["optimizer"].by_category["gradient"], meta["param_bytes"])
    assert sum(cats.values()) == report.peak_bytes


def test_categories_at_a_few_points_equal_the_curves_over_every_event_shared(analysed):
    """CategoryCurves.at sorts the blocks between the asked points (few points) or sums every event
    per category (many): both paths give the same bytes."""
    report, _, _ = analysed
    cc = report.analysis.categories
    pts = np.random.default_rng(0).integers(0, report.n_events + 1, 300)
    assert np.array_equal(cc.at(pts), cc.at(np.arange(report.n_events + 1))[pts])
    assert np.array_equal(cc.at(pts), cc._at_by_cumsum(pts))


def test_report_names_each_shape_once_with_an_explanation_shared(analysed):
    report, _, _ = analysed
    text = str(report)
    for kind in {p.kind for p in report.patterns}:
        assert kind in text
    for p in report.patterns:
        assert 2 <= p.explanation.count(". ") + 1 <= 5
        assert p.start_event <= p.peak_event <= max(p.end_event, p.peak_event)
    d = report.to_dict()
    assert len(d["patterns"]) == len(report.patterns)
    assert set(d["category_curve"]) >= {"event", "parameter", "gradient", "optimizer_state", "activation"}


def test_leak_found_where_frees_were_removed_and_nowhere_else_shared():
    """Replicate a real trace's steady steps, then drop the frees of one forward tensor in some steps
    (a tensor kept across steps, as a loss accumulated without .item() keeps its graph)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_analyze import replicate_steps

    paths = [p for p in shared_paths() if p.name.startswith("gpt_adamw_foreach")]
    if not paths:
        pytest.skip("no real GPU snapshots")
    snap = replicate_steps(load_snapshot(paths[0]), 4)  # step 0, 4 copies of steps 1-2, ...
    clean = phasemem.analyze(snap, marker_prefix="gt::")
    assert clean.patterns_of("leak") == []
    events = snap["device_traces"][0]
    leaked = {}
    for st in clean.steps[2:-2]:  # middle steps whose addresses are their own
        fwd = st.phases["forward"]
        # the first allocation of this forward that forward itself frees again
        life = clean.analysis.timeline.lifetimes
        pick = [(a, f) for a, f in zip(life.alloc_event.tolist(), life.free_event.tolist())
                if fwd.start_event <= a <= fwd.end_event and f <= fwd.end_event]
        a, f = pick[0]
        leaked[st.index] = events[a]["size"]
        addr = events[a]["addr"]
        for i in range(a + 1, f + 1):
            if events[i]["addr"] == addr and events[i]["action"] in ("free_requested", "free_completed"):
                events[i]["action"] = "snapshot"  # an entry that changes nothing: the free is gone
        # A block never freed is never handed out again: give it an address of its own.
        events[a]["addr"] = (1 << 50) + st.index * 4096
    report = phasemem.analyze(snap, marker_prefix="gt::")
    found = {p.step: p.bytes for p in report.patterns_of("leak")}
    assert found == leaked
    assert all(p.phase == "forward" for p in report.patterns_of("leak"))


def test_every_pattern_sits_in_its_own_step_and_phase(real_snapshot):
    """A callout points at peak_event: it must be in the step and phase the pattern names, also when
    the loop keeps the logits alive into the next step (fixtures/gpt_foreach)."""
    _, snap, prefix = real_snapshot
    report = phasemem.analyze(snap, marker_prefix=prefix)
    for p in report.patterns:
        if p.kind in ("leak", "gradient_accumulation") or not report.steps[p.step].complete:
            continue
        assert report.analysis.step_of[p.peak_event] == p.step, p
        assert p.start_event <= p.peak_event, p
        # an evaluation forward has no backward after it, so its loss stays "other"
        want = {"logits": ("forward", "loss", "other"), "softmax_spike": ("forward", "loss", "other"),
                "logits_release": ("backward",), "checkpoint_recompute": ("backward",),
                "optimizer_state_init": ("optimizer",), "optimizer_temporaries": ("optimizer",)}.get(p.kind)
        if p.kind == "gradients":
            want = (p.phase,)
        if want and p.peak_event is not None and report.steps[p.step].phases.get(p.phase, None):
            assert report.labels[p.peak_event] in want, p


def test_gradscaler_check_and_workspaces_named_where_frames_say_so():
    """Ground truth from frames (torch/amp/grad_scaler.py; the first recorded matmul), detection without."""
    from conftest import FIXTURES

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


def _fixture_metas():
    from conftest import fixture_paths

    # wrapped: part of the run is gone; inference: nothing to pair parameters with; cudagraph: the
    # graph's static buffers (gradients included) exist before recording and never show as such
    skip = ("wrapped", "inference", "cudagraph")
    return [p for p in fixture_paths() if not any(s in p.name for s in skip)]


@pytest.mark.parametrize("path", _fixture_metas(), ids=lambda p: p.name.split(".")[0])
def test_categories_match_each_recorded_model(path):
    """Parameters, gradients and optimizer state against the model the recording script built
    (fixtures/record.py counts the parameter bytes), frames removed. gpt_compiled was recorded
    after a warm-up step, so its Adam state existed before recording and is found by size."""
    snap = load_snapshot(path)
    meta = snap["phasemem"]["meta"]
    for e in snap["device_traces"][0]:
        e["frames"] = []
    report = phasemem.analyze(snap)
    p = meta["param_bytes"]
    every = report.analysis.categories.at_level(np.arange(report.n_events), report.analysis.timeline)
    assert _close(report.categories()["parameter"], p)
    assert _close(int(every[:, 1].max()), p)  # gradients, where alive
    name = meta["optimizer"]
    mult = 2 if "Adam" in name else (1 if "momentum" in name else 0)
    assert _close(int(every[-1, 2]), mult * p) if mult else int(every[-1, 2]) == 0


def test_odd_traces_streams_cudagraph_expandable():
    """Recorded on the H200: a side stream with record_stream (frees requested and completed apart),
    a CUDA-graphed model (replays allocate nothing; the optimizer still does), expandable segments
    (segment_map instead of segment_alloc)."""
    from conftest import FIXTURES
    from reference import replay

    for name in ("odd_streams", "odd_cudagraph", "odd_expandable"):
        snap = load_snapshot(FIXTURES / f"{name}.pkl.xz")
        report = phasemem.analyze(snap)
        _, curve, _ = replay(snap["device_traces"][0], snap["segments"])
        assert report.analysis.timeline.active_after.tolist() == curve
        assert len(report.steps) == 3 and all(s.complete for s in report.steps)
        # reserved memory ends where the snapshot's segments say, expandable segments included
        assert report.analysis.timeline.reserved_after[-1] == sum(s["total_size"] for s in snap["segments"])
        if name == "odd_cudagraph":
            assert all(st.phases["forward"].n_events == 0 for st in report.steps[1:])
            assert report.patterns_of("gradients") == []  # the graph writes them into its own pool
            state = report.patterns_of("optimizer_state_init")
            assert state and _close(state[0].bytes, 2 * snap["phasemem"]["meta"]["param_bytes"])
        else:
            assert report.patterns_of("logits") and report.patterns_of("gradients")


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[1] / "fixtures").glob("**/*.pkl.xz")),
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
