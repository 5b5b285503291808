"""Hand-built traces for segment(): every expected phase label and step position is written out
by hand here, from the documented rule, never computed by phasemem.

The rule: an event at time t is inside [START, END] when START <= t <= END; nested ranges resolve
to the innermost; the loss is the events strictly after a forward's END and strictly before the
next backward's START (one loss per forward), where one of them allocates (frees alone compute no loss); a step ends where an optimizer range ends (work after
the last one is a partial step only if it trains); a phase that ran without events is reported
with n_events 0; an unmatched START runs to the end of the trace.
"""
import numpy as np
import pytest

import phasemem
from phasemem.analysis.segmentation import segment
from phasemem.analysis.timeline import Timeline
from phasemem.read.trace import Trace
from phasemem.report.pipeline import PARTIAL_NOTE
from phasemem.vocab import PHASES

AL, FR = "alloc", "free_completed"
SIZE = 4096


def snapshot(events, annotations):
    """A snapshot dict from (time_us, action, addr, size) events and (name, stage, time_us) annotations."""
    live = set()
    for _, action, addr, _ in events:  # the trace must be balanced: no free without its alloc
        if action == AL:
            assert addr not in live
            live.add(addr)
        else:
            live.remove(addr)
    assert not live, f"allocs never freed: {live}"
    return {
        "segments": [],
        "device_traces": [[{"action": a, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": []}
                           for t, a, addr, size in events]],
        "external_annotations": [{"name": n, "stage": s, "device": 0, "time_us": t} for n, s, t in annotations],
    }


def rng(phase, t0, t1=None, name=None):
    """A START/END pair for phasemem::<phase> (or ``name``); t1=None leaves the START unmatched."""
    name = name or f"phasemem::{phase}"
    return [(name, "START", t0)] + ([] if t1 is None else [(name, "END", t1)])


def build(rows, anns):
    """rows: (time_us, action, addr, expected phase, expected step) → snapshot, expected labels, steps."""
    snap = snapshot([(t, a, addr, SIZE) for t, a, addr, _, _ in rows], anns)
    return snap, [r[3] for r in rows], [r[4] for r in rows]


def run(snap):
    trace = Trace.from_snapshot(snap)
    seg = segment(trace, "phasemem::", Timeline.from_trace(trace))
    return seg, np.array(PHASES)[seg.labels].tolist(), seg.step_of.tolist()


FULL_STEP = rng("zero_grad", 10, 20) + rng("forward", 30, 40) + rng("backward", 50, 60) + rng("optimizer", 70, 80)


def test_events_exactly_on_start_and_end_are_inside():
    rows = [
        (10, AL, 1, "zero_grad", 0),  # zero_grad START
        (20, AL, 2, "zero_grad", 0),  # zero_grad END
        (30, AL, 3, "forward", 0),  # forward START
        (40, AL, 4, "forward", 0),  # forward END ...
        (40, FR, 2, "forward", 0),  # ... two events at that very µs
        (45, AL, 5, "loss", 0),
        (50, FR, 5, "backward", 0),  # backward START
        (60, FR, 4, "backward", 0),  # backward END
        (70, FR, 3, "optimizer", 0),  # optimizer START
        (80, FR, 1, "optimizer", 0),  # optimizer END: still step 0
        (105, AL, 6, "forward", 1),
        (125, FR, 6, "backward", 1),
        (150, AL, 7, "optimizer", 1),  # step 1's optimizer END
    ]
    anns = FULL_STEP + rng("forward", 100, 110) + rng("backward", 120, 130) + rng("optimizer", 140, 150)
    snap, want_labels, want_steps = build(rows + [(151, FR, 7, "other", -1)], anns)
    seg, labels, step_of = run(snap)
    assert labels == want_labels
    assert step_of == want_steps
    assert seg.steps == [(0, 10, True), (10, 13, True)]


def test_events_one_us_outside_are_outside():
    rows = [
        (9, AL, 1, "other", 0),  # 1 µs before zero_grad START
        (15, AL, 2, "zero_grad", 0),
        (21, FR, 2, "other", 0),  # 1 µs after zero_grad END
        (29, AL, 3, "other", 0),  # 1 µs before forward START
        (35, AL, 4, "forward", 0),
        (41, AL, 5, "loss", 0),  # 1 µs after forward END
        (49, FR, 5, "loss", 0),  # 1 µs before backward START
        (51, FR, 4, "backward", 0),
        (61, AL, 6, "other", 0),  # 1 µs after backward END
        (69, FR, 6, "other", 0),  # 1 µs before optimizer START
        (75, FR, 3, "optimizer", 0),
        (81, FR, 1, "other", -1),  # 1 µs after optimizer END: past the last step
    ]
    snap, want_labels, want_steps = build(rows, FULL_STEP)
    seg, labels, step_of = run(snap)
    assert labels == want_labels
    assert step_of == want_steps
    assert seg.steps == [(0, 11, True)]


@pytest.mark.parametrize("opt_name", ["phasemem::optimizer", "Optimizer.step#AdamW.step"])
def test_nested_ranges_resolve_to_the_innermost(opt_name):
    # Lightning: optimizer.step(closure) runs forward, zero_grad and backward inside the optimizer range.
    rows = [
        (12, AL, 1, "optimizer", 0),  # the optimizer's own work before the closure
        (20, AL, 2, "forward", 0),
        (25, AL, 3, "forward", 0),
        (30, FR, 3, "forward", 0),
        (35, AL, 4, "loss", 0),
        (42, AL, 5, "zero_grad", 0),  # zero_grad inside the loss gap splits it
        (47, FR, 5, "loss", 0),
        (50, AL, 6, "backward", 0),
        (55, FR, 4, "backward", 0),
        (60, FR, 6, "backward", 0),
        (70, FR, 2, "optimizer", 0),  # the optimizer's own work after the closure
        (80, AL, 7, "optimizer", 0),
        (100, FR, 1, "optimizer", 0),  # optimizer END
        (105, FR, 7, "other", -1),
    ]
    anns = (rng("optimizer", 10, 100, name=opt_name) + rng("forward", 20, 30) + rng("zero_grad", 40, 45)
            + rng("backward", 50, 60))
    snap, want_labels, want_steps = build(rows, anns)
    seg, labels, step_of = run(snap)
    assert labels == want_labels
    assert step_of == want_steps
    assert seg.steps == [(0, 13, True)]
    assert seg.sources["optimizer"] == ("markers" if opt_name.startswith("phasemem::") else "annotations")


def test_overlapping_ranges_the_later_start_wins():
    # Not nested, so no range is innermost: where two overlap, the one that STARTed later labels the
    # events (ranges are painted in start order). A forward that ends after its backward starts has no loss.
    rows = [
        (15, AL, 1, "forward", 0),
        (20, AL, 2, "backward", 0),  # backward START, inside the forward too
        (25, FR, 2, "backward", 0),
        (30, AL, 3, "backward", 0),  # forward END, inside the backward
        (35, FR, 3, "backward", 0),
        (40, AL, 4, "backward", 0),  # backward END
        (45, FR, 4, "other", 0),
        (55, AL, 5, "zero_grad", 0),
        (60, FR, 5, "optimizer", 0),  # optimizer START, inside zero_grad too
        (65, AL, 6, "optimizer", 0),
        (70, FR, 6, "optimizer", 0),  # zero_grad END
        (75, FR, 1, "optimizer", 0),
    ]
    anns = rng("forward", 10, 30) + rng("backward", 20, 40) + rng("zero_grad", 50, 70) + rng("optimizer", 60, 80)
    snap, want_labels, want_steps = build(rows, anns)
    seg, labels, step_of = run(snap)
    assert labels == want_labels
    assert step_of == want_steps
    assert not [iv for iv in seg.intervals if iv.phase == "loss"]


def test_loss_is_strictly_between_forward_end_and_backward_start():
    rows = [
        (15, AL, 1, "forward", 0),
        (20, AL, 2, "forward", 0),  # forward END: not the loss
        (21, AL, 3, "loss", 0),
        (30, FR, 2, "loss", 0),
        (39, AL, 4, "loss", 0),
        (40, FR, 4, "backward", 0),  # backward START: not the loss
        (45, FR, 3, "backward", 0),
        (65, AL, 5, "optimizer", 0),
        (70, FR, 5, "optimizer", 0),
        (75, FR, 1, "other", -1),
    ]
    anns = rng("forward", 10, 20) + rng("backward", 40, 50) + rng("optimizer", 60, 70)
    snap, want_labels, want_steps = build(rows, anns)
    seg, labels, step_of = run(snap)
    assert labels == want_labels
    assert step_of == want_steps
    (loss,) = [iv for iv in seg.intervals if iv.phase == "loss"]
    assert (loss.t0, loss.t1, loss.first, loss.stop) == (20, 40, 2, 5)  # events 2, 3, 4 exactly
    assert seg.sources["loss"] == "markers"
    ph = phasemem.analyze(snap).steps[0].phases["loss"]
    assert (ph.n_events, ph.start_event, ph.end_event) == (3, 2, 4)


def test_two_forwards_before_one_backward_the_last_forward_gets_the_loss():
    # A frozen reference model's forward, then the policy's forward, then one backward (DPO-style).
    rows = [
        (15, AL, 1, "forward", 0),  # reference forward
        (20, AL, 2, "forward", 0),
        (25, AL, 3, "other", 0),  # between the two forwards: not the loss
        (35, AL, 4, "forward", 0),  # policy forward
        (40, FR, 3, "forward", 0),
        (45, AL, 5, "loss", 0),  # after the policy's forward: the loss
        (55, FR, 5, "backward", 0),
        (56, FR, 4, "backward", 0),
        (75, FR, 2, "optimizer", 0),
        (76, FR, 1, "optimizer", 0),
    ]
    anns = rng("forward", 10, 20) + rng("forward", 30, 40) + rng("backward", 50, 60) + rng("optimizer", 70, 80)
    snap, want_labels, want_steps = build(rows, anns)
    seg, labels, step_of = run(snap)
    assert labels == want_labels
    assert step_of == want_steps
    assert [(iv.t0, iv.t1) for iv in seg.intervals if iv.phase == "loss"] == [(40, 50)]


def test_two_backwards_after_one_forward_give_one_loss():
    rows = [
        (15, AL, 1, "forward", 0),
        (25, AL, 2, "loss", 0),
        (35, FR, 2, "backward", 0),
        (45, AL, 3, "other", 0),  # between the backwards: the forward's loss was already taken
        (55, FR, 3, "backward", 0),
        (75, FR, 1, "optimizer", 0),
    ]
    anns = rng("forward", 10, 20) + rng("backward", 30, 40) + rng("backward", 50, 60) + rng("optimizer", 70, 80)
    snap, want_labels, want_steps = build(rows, anns)
    seg, labels, step_of = run(snap)
    assert labels == want_labels
    assert step_of == want_steps
    assert [(iv.t0, iv.t1) for iv in seg.intervals if iv.phase == "loss"] == [(20, 30)]


@pytest.mark.parametrize("zg_name, source", [("phasemem::zero_grad", "markers"),
                                             ("Optimizer.zero_grad#AdamW.zero_grad", "annotations")])
def test_empty_zero_grad_is_reported_with_no_events(zg_name, source):
    rows = [
        (1, AL, 9, "other", 0),  # held throughout: the level the empty zero_grad reports
        (15, AL, 1, "forward", 0),
        (25, AL, 2, "loss", 0),
        (35, FR, 2, "backward", 0),
        (55, AL, 3, "optimizer", 0),
        (67, AL, 4, "zero_grad", 1),  # step 1's zero_grad has an event
        (85, AL, 5, "forward", 1),
        (95, FR, 5, "other", 1),  # frees alone between forward and backward: the output dropped, no loss
        (105, FR, 4, "backward", 1),
        (125, FR, 3, "optimizer", 1),
        (140, FR, 9, "other", -1),
        (150, FR, 1, "other", -1),
    ]
    anns = (rng("zero_grad", 5, 6, name=zg_name) + rng("forward", 10, 20) + rng("backward", 30, 40)
            + rng("optimizer", 50, 60) + rng("zero_grad", 65, 70, name=zg_name) + rng("forward", 80, 90)
            + rng("backward", 100, 110) + rng("optimizer", 120, 130))
    snap, want_labels, want_steps = build(rows, anns)
    seg, labels, step_of = run(snap)
    assert labels == want_labels
    assert step_of == want_steps
    report = phasemem.analyze(snap)
    s0, s1 = report.steps
    assert list(s0.phases) == ["other", "zero_grad", "forward", "loss", "backward", "optimizer"]
    zg = s0.phases["zero_grad"]
    assert (zg.n_events, zg.start_event, zg.end_event, zg.peak_event) == (0, None, None, None)
    assert (zg.start_bytes, zg.peak_bytes, zg.end_bytes, zg.source) == (SIZE, SIZE, SIZE, source)
    assert zg.at_event == 0.5  # between event 0 and event 1
    zg1 = s1.phases["zero_grad"]
    assert (zg1.n_events, zg1.start_event, zg1.end_event) == (1, 5, 5)
    assert (report.phases["zero_grad"].n_events, report.phases["zero_grad"].start_event) == (1, 5)


THREE_STEPS = [
    (15, AL, 1, "forward", 0),
    (35, AL, 2, "backward", 0),
    (60, FR, 2, "optimizer", 0),  # optimizer END
    (61, AL, 3, "other", 1),  # 1 µs later: the next step
    (115, FR, 1, "forward", 1),
    (135, AL, 4, "backward", 1),
    (155, FR, 3, "optimizer", 1),
    (215, AL, 5, "forward", 2),
    (235, FR, 5, "backward", 2),
    (255, FR, 4, "optimizer", 2),
]
THREE_ANNS = [a for k in range(3) for a in (rng("forward", 100 * k + 10, 100 * k + 20)
                                            + rng("backward", 100 * k + 30, 100 * k + 40)
                                            + rng("optimizer", 100 * k + 50, 100 * k + 60))]


def test_steps_end_at_optimizer_end_and_a_trailing_zero_grad_is_not_a_step():
    rows = THREE_STEPS + [(275, AL, 6, "zero_grad", -1), (290, FR, 6, "other", -1)]
    snap, want_labels, want_steps = build(rows, THREE_ANNS + rng("zero_grad", 270, 280))
    seg, labels, step_of = run(snap)
    assert labels == want_labels
    assert step_of == want_steps
    assert seg.steps == [(0, 3, True), (3, 7, True), (7, 10, True)]
    assert seg.step_numbers == [0, 1, 2]
    report = phasemem.analyze(snap)
    assert [(s.number, s.start_event, s.end_event, s.complete) for s in report.steps] == [
        (0, 0, 2, True), (1, 3, 6, True), (2, 7, 9, True)]
    assert PARTIAL_NOTE not in report.notes


def test_a_forward_after_the_last_optimizer_is_a_partial_step():
    rows = THREE_STEPS + [(275, AL, 6, "zero_grad", 3), (305, AL, 7, "forward", 3),
                          (308, FR, 7, "forward", 3), (309, FR, 6, "other", 3)]
    snap, want_labels, want_steps = build(rows, THREE_ANNS + rng("zero_grad", 270, 280) + rng("forward", 300, 308))
    seg, labels, step_of = run(snap)
    assert labels == want_labels
    assert step_of == want_steps
    assert seg.steps == [(0, 3, True), (3, 7, True), (7, 10, True), (10, 14, False)]
    report = phasemem.analyze(snap)
    assert [(s.number, s.complete) for s in report.steps] == [(0, True), (1, True), (2, True), (3, False)]
    assert PARTIAL_NOTE in report.notes


def test_an_unmatched_forward_start_runs_to_the_end_of_the_trace():
    rows = [
        (15, AL, 1, "forward", 0),
        (35, FR, 1, "backward", 0),
        (55, AL, 2, "optimizer", 0),
        (75, AL, 3, "forward", 1),  # forward START at 70 never ENDs: the trace was cut in it
        (90, AL, 4, "forward", 1),
        (95, FR, 4, "forward", 1),
        (99, FR, 3, "forward", 1),
        (10_000, FR, 2, "forward", 1),  # the last event, long after
    ]
    anns = rng("forward", 10, 20) + rng("backward", 30, 40) + rng("optimizer", 50, 60) + rng("forward", 70)
    snap, want_labels, want_steps = build(rows, anns)
    seg, labels, step_of = run(snap)
    assert labels == want_labels
    assert step_of == want_steps
    assert seg.steps == [(0, 3, True), (3, 8, False)]


def test_an_unmatched_optimizer_start_makes_an_open_partial_step():
    rows = [
        (15, AL, 1, "forward", 0),
        (35, FR, 1, "backward", 0),
        (55, AL, 2, "optimizer", 0),  # optimizer START at 50 never ENDs
        (90, FR, 2, "optimizer", 0),
    ]
    anns = rng("forward", 10, 20) + rng("backward", 30, 40) + rng("optimizer", 50)
    snap, want_labels, want_steps = build(rows, anns)
    seg, labels, step_of = run(snap)
    assert labels == want_labels
    assert step_of == want_steps
    assert seg.steps == [(0, 4, False)]
