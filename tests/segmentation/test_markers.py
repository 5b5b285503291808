"""The core numbers on real H200 traces, checked against a naive replay of the raw events."""
import phasemem
from helpers.analyses import analyzed
from helpers.reference import add_loss, intervals, label_events, replay, steps_from_optimizer
from helpers.snapshots import load_snapshot
from phasemem.analysis.timeline import Timeline
from phasemem.read.trace import Trace
from phasemem.vocab import PHASES


def test_active_curve_equals_naive_replay(real_snapshot):
    _, snap, _ = real_snapshot
    events = snap["device_traces"][0]
    pre, curve, _ = replay(events, snap["segments"])
    tl = Timeline.from_trace(Trace.from_snapshot(snap))
    assert tl.baseline == pre
    assert tl.active_after.tolist() == curve


def test_phase_labels_and_steps_exactly_as_markers_say(real_snapshot):
    path, snap, prefix = real_snapshot
    events = snap["device_traces"][0]
    ivs = intervals(snap["external_annotations"], prefix)
    expected = add_loss(events, label_events(events, ivs), ivs)
    report = analyzed(path, marker_prefix=prefix)
    assert list(report.labels) == expected
    if "optimizer" not in ivs:  # inference: a step per forward
        assert len(report.steps) == len(ivs["forward"])
        return
    lost = sum(1 for _, t1 in ivs["optimizer"] if t1 < events[0]["time_us"])  # ring buffer wrapped
    assert len(report.steps) == len(ivs["optimizer"]) - lost
    expected_steps = [k - lost if k >= 0 else -1 for k in steps_from_optimizer(events, ivs)]
    assert report.analysis.step_of.tolist() == expected_steps
    for st in report.steps:
        assert st.complete == (not lost or st.index > 0)
        if not st.complete:
            continue
        order = [p for p in st.phases if p != "other"]
        assert order.index("forward") < order.index("backward") < order.index("optimizer")


def test_every_peak_equals_independent_recomputation(real_snapshot):
    path, snap, prefix = real_snapshot
    events = snap["device_traces"][0]
    ivs = intervals(snap["external_annotations"], prefix)
    labels = add_loss(events, label_events(events, ivs), ivs)
    _, after, deltas = replay(events, snap["segments"])
    before = [a - d for a, d in zip(after, deltas)]
    report = analyzed(path, marker_prefix=prefix)
    step_of = report.analysis.step_of.tolist()  # step boundaries are checked above; here the numbers
    checked = 0
    for st in report.steps:
        for name, ph in st.phases.items():
            idx = [i for i in range(len(events)) if labels[i] == name and step_of[i] == st.index]
            if not idx:
                assert ph.n_events == 0
                continue
            level = [max(before[i], after[i]) for i in idx]
            assert ph.peak_bytes == max(level)
            assert ph.peak_event == idx[level.index(max(level))]
            assert (ph.start_event, ph.end_event, ph.n_events) == (idx[0], idx[-1], len(idx))
            assert ph.start_bytes == before[idx[0]]
            assert ph.end_bytes == after[idx[-1]]
            checked += 1
    assert checked >= 3 * len(report.steps) if "optimizer" in ivs else checked >= len(report.steps)
    # The aggregate is the highest over every occurrence.
    for name, agg in report.phases.items():
        assert agg.peak_bytes == max(s.phases[name].peak_bytes for s in report.steps if name in s.phases)
    assert report.peak_bytes == max(max(b, a) for b, a in zip(before, after))


def test_zero_grad_before_any_gradient_is_reported_empty_shared(shared_snapshot):
    path, snap = shared_snapshot
    report = analyzed(path, marker_prefix="gt::")
    zg = report.steps[0].phases["zero_grad"]
    assert zg.n_events == 0 and zg.start_event is None
    # It ran between the forward's end and the backward's start: its level is the level there.
    assert zg.peak_bytes == report.steps[0].phases["forward"].end_bytes


def test_pytorch_annotations_give_optimizer_and_zero_grad_without_markers_shared(shared_snapshot):
    path, snap = shared_snapshot
    events = snap["device_traces"][0]
    report = analyzed(path)  # default prefix: no phasemem markers in these files
    ivs = intervals(snap["external_annotations"], "Optimizer.")
    opt_ivs = {"optimizer": [iv for k, v in ivs.items() if k.startswith("step#") for iv in v],
               "zero_grad": [iv for k, v in ivs.items() if k.startswith("zero_grad#") for iv in v]}
    expected = label_events(events, opt_ivs)
    got = list(report.labels)
    # Where PyTorch's annotations speak, they decide; forward and backward are inferred elsewhere.
    assert [g for g, e in zip(got, expected) if e != "other"] == [e for e in expected if e != "other"]
    assert all(g not in ("optimizer", "zero_grad") for g, e in zip(got, expected) if e == "other")
    assert {k: v for k, v in report.sources.items() if v == "annotations"} == {"optimizer": "annotations",
                                                                               "zero_grad": "annotations"}
    assert report.sources["forward"] == report.sources["backward"] == "inferred"
    assert len(report.steps) == len(opt_ivs["optimizer"])


def test_frames_removed_changes_no_number_shared(shared_snapshot):
    path, snap = shared_snapshot
    with_frames = analyzed(path, marker_prefix="gt::")
    for e in snap["device_traces"][0]:
        e["frames"] = []
    without = phasemem.analyze(snap, marker_prefix="gt::")
    assert without.analysis.labels.tolist() == with_frames.analysis.labels.tolist()
    for a, b in zip(with_frames.steps, without.steps):
        assert {k: v.peak_bytes for k, v in a.phases.items()} == {k: v.peak_bytes for k, v in b.phases.items()}
    assert all(al.stack is None for p in without.phases.values() for al in p.top_allocations)
    assert any(al.stack for p in with_frames.phases.values() for al in p.top_allocations)


def test_wrapped_ring_buffer_recovers_the_same_end_state_shared(shared_snapshot):
    path, snap = shared_snapshot
    full = analyzed(path, marker_prefix="gt::")
    events = snap["device_traces"][0]
    cut = int(len(events) * 0.45)  # inside step 1's forward or backward: a ring buffer that wrapped
    snap["device_traces"][0] = events[cut:]
    wrapped = phasemem.analyze(snap, marker_prefix="gt::")
    assert wrapped.analysis.timeline.active_after[-1] == full.analysis.timeline.active_after[-1]
    # Memory at every surviving event is what the full trace says it was.
    assert wrapped.analysis.timeline.active_after.tolist() == full.analysis.timeline.active_after[cut:].tolist()
    assert wrapped.steps[0].number == full.steps[int(full.analysis.step_of[cut])].number
    assert not wrapped.steps[0].complete
    assert [s.number for s in wrapped.steps][-1] == full.steps[-1].number


def test_top_allocations_are_the_largest_made_in_the_phase_shared(shared_snapshot):
    path, snap = shared_snapshot
    events = snap["device_traces"][0]
    report = analyzed(path, marker_prefix="gt::")
    labels = report.labels
    for st in report.steps:
        for name, ph in st.phases.items():
            sizes = sorted((events[i]["size"] for i in range(st.start_event, st.end_event + 1)
                            if events[i]["action"] == "alloc" and labels[i] == name), reverse=True)
            assert [a.size for a in ph.top_allocations] == sizes[:5]
            for a in ph.top_allocations:
                assert events[a.event]["action"] == "alloc"
                if a.free_event is not None:
                    assert events[a.free_event]["addr"] == events[a.event]["addr"]
                    assert events[a.free_event]["action"] in ("free_completed", "free")


def test_reserved_curve_ends_at_the_snapshot_segments_shared(shared_snapshot):
    _, snap = shared_snapshot
    tl = Timeline.from_trace(Trace.from_snapshot(snap))
    assert tl.reserved_after[-1] == sum(s["total_size"] for s in snap["segments"])
    seg_events = [e for e in snap["device_traces"][0] if e["action"].startswith("segment_")]
    assert tl.reserved_after.max() - tl.reserved_after.min() <= sum(e["size"] for e in seg_events)


def test_json_round_trip_shared(shared_snapshot, tmp_path):
    import json

    path, snap = shared_snapshot
    report = analyzed(path, marker_prefix="gt::")
    out = tmp_path / "r.json"
    report.to_json(out)
    d = json.loads(out.read_text())
    assert len(d["steps"]) == len(report.steps)
    assert d["phases"]["backward"]["peak_bytes"] == report.phases["backward"].peak_bytes
    covered = sum(b - a + 1 for a, b, _, _ in d["labels"])
    assert covered == len(snap["device_traces"][0])
    assert {ph for _, _, ph, _ in d["labels"]} <= set(PHASES)


def test_report_text_is_readable_shared(shared_snapshot):
    path, snap = shared_snapshot
    from phasemem.units import format_bytes

    report = analyzed(path, marker_prefix="gt::")
    text, full = str(report), report.text(full=True)  # the short one has the typical step's table only
    for t in (text, full):
        assert f"peak allocated {format_bytes(report.peak_bytes)}" in t
        assert f"{len(snap['device_traces'][0]):,} events" in t
    for st in report.steps:
        assert f"{format_bytes(st.phases['backward'].peak_bytes):>11}" in full


def test_inferred_phases_say_so(real_snapshot):
    path, snap, prefix = real_snapshot
    snap["external_annotations"] = []
    report = phasemem.analyze(snap, marker_prefix=prefix)
    inferred = [p for p in report.phases.values() if p.source == "inferred"]
    assert inferred and all(0 < p.confidence < 1 for p in inferred)
    assert "phases were inferred" in str(report)
    marked = analyzed(path, marker_prefix=prefix)
    assert all(p.confidence == 1.0 for p in marked.phases.values())


def test_torch_default_recording_with_cpp_stacks():
    """_record_memory_history() with torch's defaults puts C++ frames on every event, the autograd
    thread's too: phases must still be found from the Python frames, and stacks summarised readably."""
    from helpers.paths import FIXTURES

    path = FIXTURES / "plain_gpt_torch_defaults.pkl.xz"
    snap = load_snapshot(path)
    assert all(e.get("frames") for e in snap["device_traces"][0])  # every event has frames
    events = snap["device_traces"][0]
    ivs = intervals(snap["external_annotations"], "gt::")
    truth = add_loss(events, label_events(events, ivs), ivs)
    snap["external_annotations"] = [a for a in snap["external_annotations"] if not a["name"].startswith("gt::")]
    report = phasemem.analyze(snap)
    got = ["forward" if g == "loss" else g for g in report.labels]  # gt::forward spans the loss too
    assert sum(g == t for g, t in zip(got, truth)) / len(truth) > 0.98
    assert len(report.steps) == len(ivs["optimizer"])
    stacks = [a.stack for a in report.phases["backward"].top_allocations]
    assert any("Backward0" in s for s in stacks) and not any("unwind" in s for s in stacks)


def test_aggregate_top_allocations_are_the_largest_over_all_steps_shared(shared_snapshot):
    path, snap = shared_snapshot
    report = analyzed(path, marker_prefix="gt::")
    for name, agg in report.phases.items():
        every = sorted((a.size for st in report.steps if name in st.phases for a in st.phases[name].top_allocations),
                       reverse=True)
        assert [a.size for a in agg.top_allocations] == every[:5]


def test_stack_summaries_point_at_the_users_code_not_at_phasemems_hooks():
    from helpers.paths import FIXTURES

    report = analyzed(FIXTURES / "gpt_foreach.pkl.xz", "file")  # recorded under instrument()
    stacks = [a.stack for p in report.phases.values() for a in p.top_allocations if a.stack]
    assert stacks and not any("hooks.py" in s for s in stacks)
    assert any("record.py" in s for s in report.phases["optimizer"].top_allocations[0].stack.split(" ← ")[1:])
