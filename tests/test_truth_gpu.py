"""instrument()'s markers against truth that does not come from phasemem's hooks.

The truth set (``fixtures/record.py --set truth``, recorded on the H200 into fixtures/truth/) marks
every phase in the training loop itself, twice over: ``record_function("gt::<phase>")`` around each
call, and the host clock (``time.time_ns() // 1000``, the clock of the trace's ``time_us``) read
before and after it (``meta["host_truth"]``). phasemem's phases, from its own markers, must label
every event inside those ranges as they do. The same loops are also recorded here on the CPU.
"""
from __future__ import annotations

import lzma
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

import phasemem

ROOT = Path(__file__).resolve().parents[1]
GPU = sorted((ROOT / "fixtures" / "truth").glob("*.pkl.xz"))


def _expected(time_us: np.ndarray, spans) -> np.ndarray:
    """Per event the phase of the innermost host-clock span holding it ('' outside every span)."""
    out = np.full(len(time_us), "", dtype=object)
    # later starts are inner: paint in start order
    for phase, t0, t1 in sorted((s for s in spans if s[0] != "step"), key=lambda s: (s[1], -s[2])):
        out[(time_us >= t0) & (time_us <= t1)] = phase
    return out


def _agree(ours: np.ndarray, truth: np.ndarray, steps: int) -> None:
    """Event for event, phasemem's phase is the truth's. Never another phase; 'other' (no claim) for
    at most one free a step (its free_requested and free_completed): the loss optimizer.step(closure)
    returns is freed by its caller after torch's Optimizer.step range ends, inside the loop's range
    around the call (truth_closure on the H200)."""
    wrong = np.flatnonzero((ours != truth) & (ours != "other"))
    assert not len(wrong), [(int(i), ours[i], truth[i]) for i in wrong[:10]]
    assert int(((ours != truth) & (ours == "other")).sum()) <= 2 * steps


def _check(snap: dict) -> None:
    meta = snap["phasemem"]["meta"]
    spans = meta["host_truth"]
    ours = phasemem.analyze(snap)  # phasemem's markers (and torch's optimizer annotations)
    assert ours.sources["forward"] == "markers" and ours.sources["backward"] == "markers"
    labels = ours.labels.copy()
    labels[labels == "loss"] = "forward"  # the loop's forward range holds the model and its loss
    # 1. the gt:: ranges, read by phasemem's own segmenter with that prefix
    gt = phasemem.analyze(snap, marker_prefix="gt::")
    gt_labels = gt.labels.copy()
    gt_labels[gt_labels == "loss"] = "forward"
    inside = gt_labels != "other"
    assert inside.mean() > 0.85  # clip_grad_norm_ runs outside the loop's ranges (truth_gpt_accum_clip: 0.89)
    _agree(labels[inside], gt_labels[inside], len(gt.steps))
    # 2. the host clock, with no phasemem code at all
    want = _expected(ours.analysis.trace.time_us, spans)
    timed = want != ""
    assert timed.mean() > 0.85
    _agree(labels[timed], want[timed], len(ours.steps))
    # one step per optimizer call, as the loop ran them
    assert len(ours.steps) == sum(1 for s in spans if s[0] == "step")


@pytest.mark.parametrize("path", GPU, ids=lambda p: p.name.split(".")[0])
def test_markers_match_independent_truth_on_the_gpu(path):
    _check(pickle.loads(lzma.decompress(path.read_bytes())))


def test_truth_set_was_recorded_on_the_gpu():
    """The fixtures exist and were recorded on CUDA (fixtures/README.md says how)."""
    assert len(GPU) == 6
    for path in GPU:
        assert pickle.loads(lzma.decompress(path.read_bytes()))["phasemem"]["source"] == "cuda"


@pytest.mark.parametrize("name", ["truth_gpt_foreach", "truth_gpt_accum_clip", "truth_closure",
                                  "truth_gpt_ckpt_dropout", "truth_dpo_reference", "truth_lbfgs"])
def test_markers_match_independent_truth_on_the_cpu(name, tmp_path):
    sys.path.insert(0, str(ROOT / "fixtures"))
    import record

    record.main(["--device", "cpu", "--tiny", "--only", name, "--out", str(tmp_path)])
    _check(pickle.loads(lzma.decompress((tmp_path / f"{name}.pkl.xz").read_bytes())))


def _stripped(path: Path) -> dict:
    snap = pickle.loads(lzma.decompress(path.read_bytes()))
    snap.pop("phasemem")
    snap["external_annotations"] = []
    return snap


def test_lbfgs_closure_evaluations_are_one_step():
    """LBFGS runs its closure up to 4 times in one step(): without annotations, frames tell the steps."""
    path = ROOT / "fixtures" / "truth" / "truth_lbfgs.pkl.xz"
    marked = phasemem.analyze(pickle.loads(lzma.decompress(path.read_bytes())))
    got = phasemem.analyze(_stripped(path))
    assert len(got.steps) == len(marked.steps) == 3
    assert [s.start_event for s in got.steps] == [s.start_event for s in marked.steps]


def test_reference_forward_is_no_checkpoint_recompute():
    """A frozen reference model's no_grad forward before the policy's (DPO): no checkpointing ran."""
    path = ROOT / "fixtures" / "truth" / "truth_dpo_reference.pkl.xz"
    for snap in (pickle.loads(lzma.decompress(path.read_bytes())), _stripped(path)):
        assert not phasemem.analyze(snap).patterns_of("checkpoint_recompute")
