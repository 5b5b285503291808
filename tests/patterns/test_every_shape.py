"""What holds of every shape on every real trace: the report names each kind once with an explanation
of a few sentences, and each shape's peak lies in the step and phase it names.
"""
from __future__ import annotations

from helpers.analyses import analyzed


def test_report_names_each_shape_once_with_an_explanation_shared(shared_without_frames):
    report, _, _ = shared_without_frames
    text = str(report)
    for kind in {p.kind for p in report.patterns}:
        assert kind in text
    for p in report.patterns:
        assert 2 <= p.explanation.count(". ") + 1 <= 5
        assert p.start_event <= p.peak_event <= max(p.end_event, p.peak_event)
    d = report.to_dict()
    assert len(d["patterns"]) == len(report.patterns)
    assert set(d["category_curve"]) >= {"event", "parameter", "gradient", "optimizer_state", "activation"}


def test_every_pattern_sits_in_its_own_step_and_phase(real_snapshot):
    """A callout points at peak_event: it must be in the step and phase the pattern names, also when
    the loop keeps the logits alive into the next step (fixtures/gpt_foreach)."""
    path, snap, prefix = real_snapshot
    report = analyzed(path, marker_prefix=prefix)
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
