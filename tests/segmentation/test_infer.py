"""Steps and phases found without markers, scored against the markers recorded with each real trace.

The truth is the marker-derived analysis (checked against a naive replay in test_markers.py); the
snapshot is then stripped of every annotation (PyTorch's optimizer ones too), and once more of every
stack frame, and analysed again. The thresholds are issue 5's targets; docs/accuracy.md has the table.
"""
import numpy as np
import pytest

import phasemem
from helpers.analyses import analyzed
from helpers.paths import FIXTURES, fixture_paths, shared_paths
from helpers.raw import in_gt_range
from helpers.snapshots import as_handed_over, heldout, load_snapshot, prefix_of
from helpers.wild import wild_report
from phasemem.analysis import infer
from phasemem.analysis.infer import frames as frames_mod
from phasemem.analysis.infer import passes as passes_mod
from phasemem.analysis.segmentation.inferred import CONFIDENCE, DOUBTFUL
from phasemem.analysis.timeline import Timeline
from phasemem.read.trace import A, Trace
from phasemem.vocab import P

PATHS = shared_paths() + fixture_paths()
# Recorded after the rules were written (docs/accuracy.md, "Held-out traces").
HELDOUT = sorted((FIXTURES / "heldout").glob("*.pkl.xz"))
HELDOUT2 = sorted((FIXTURES / "heldout2").glob("*.pkl.xz"))
HELDOUT3 = sorted((FIXTURES / "heldout3").glob("*.pkl.xz"))
HELDOUT4 = sorted((FIXTURES / "heldout4").glob("*.pkl.xz"))
_scores: dict = {}


def _name(path):
    return path.name.split(".")[0]


def _stripped(path, frames: bool) -> dict:
    snap = load_snapshot(path)
    snap["external_annotations"] = []
    if not frames:
        for e in snap["device_traces"][0]:
            e["frames"] = []
    return snap


def _score(path, frames: bool) -> tuple[float, int, int]:
    """(share of events labelled as the markers say, steps found, steps expected: those marked, or
    one for a trace without a backward)."""
    return _scored(path, frames)[:3]


def _scored(path, frames: bool):
    key = (path, frames)
    if key not in _scores:
        prefix = prefix_of(path)
        truth = analyzed(path, marker_prefix=prefix)
        got = phasemem.analyze(_stripped(path, frames))
        codes = got.analysis.labels.copy()
        if prefix == "gt::":  # the shared snapshots' gt::forward spans the model and the loss
            codes[codes == P["loss"]] = P["forward"]
        # Without a backward the inferred trace is one step (nothing tells which forward runs make up a
        # call of the model); instrument()'s markers count one per forward.
        expected = len(truth.steps) if (truth.analysis.labels == P["backward"]).any() else 1
        _scores[key] = (float(np.mean(codes == truth.analysis.labels)), len(got.steps), expected,
                        truth.analysis.labels, codes, got)
    return _scores[key]


@pytest.mark.parametrize("frames", [True, False], ids=["frames", "no-frames"])
@pytest.mark.parametrize("path", PATHS, ids=lambda p: f"{p.parent.name}/{_name(p)}")
def test_steps_counted_exactly_without_markers(path, frames):
    _, got, marked = _score(path, frames)
    assert got == marked


@pytest.mark.parametrize("frames", [True, False], ids=["frames", "no-frames"])
def test_mean_phase_accuracy_meets_the_target(frames):
    acc = [_score(p, frames)[0] for p in PATHS]
    assert np.mean(acc) >= (0.95 if frames else 0.90)
    assert min(acc) >= (0.94 if frames else 0.84)  # and no trace far off


def test_loss_found_from_cross_entropy_without_frames():
    """Every fixture trains with cross-entropy: the inferred loss must start within a few events of
    the marked one and backward exactly where it began, on most passes."""
    hits = total = 0
    for path in fixture_paths():
        prefix = prefix_of(path)
        truth = analyzed(path, marker_prefix=prefix)
        got = _scored(path, False)[-1]
        t, g = truth.analysis.labels, got.analysis.labels
        t_bwd = np.flatnonzero((t[1:] == P["backward"]) & (t[:-1] != P["backward"])) + 1
        g_loss = set((np.flatnonzero((g[1:] == P["loss"]) & (g[:-1] != P["loss"])) + 1).tolist())
        g_bwd = set((np.flatnonzero((g[1:] == P["backward"]) & (g[:-1] != P["backward"])) + 1).tolist())
        for b in t_bwd.tolist():
            if t[b - 1] not in (P["loss"], P["zero_grad"]):
                continue  # a backward the markers open without a loss before it
            total += 1
            hits += any(abs(b - x) <= 4 for x in g_bwd) and any(0 < b - x < 400 for x in g_loss)
    assert total >= 40 and hits / total >= 0.8


def test_layer_period_is_not_taken_for_the_step():
    """The ring buffer of gpt_wrapped holds 1.2 steps: only a layer's period recurs. Its passes would be
    longer than that period, so it is refused and the one pass is found whole."""
    snap = _stripped(FIXTURES / "gpt_wrapped.pkl.xz", False)
    trace = Trace.from_snapshot(snap)
    tl = Timeline.from_trace(trace)
    periods = passes_mod.candidate_periods(trace)
    assert periods and max(periods) * len(trace) / int((trace.action == A["alloc"]).sum()) < 0.5 * len(trace)
    labels, starts = infer.labels_from_lifetimes(trace, tl)
    truth = analyzed(FIXTURES / "gpt_wrapped.pkl.xz", marker_prefix=prefix_of(FIXTURES / "gpt_wrapped.pkl.xz"))
    assert len(starts) == len(truth.steps) == 2
    bwd = np.flatnonzero(truth.analysis.labels == P["backward"])
    assert np.mean(labels[bwd] == P["backward"]) > 0.9


@pytest.mark.parametrize("frames", [True, False], ids=["frames", "no-frames"])
def test_confidence_is_the_measured_precision(frames):
    """Each inferred phase's confidence is the share of its events the markers agree with, pooled over
    every real trace, the held-out ones too; it must still be true of the inference as it is now."""
    how = "frames" if frames else "lifetimes"
    hits: dict = {}
    # the same, over the traces whose reading contradicts itself (segmentation.inferred.find_doubts)
    doubted: dict = {}
    for path in PATHS + HELDOUT + HELDOUT2 + HELDOUT3 + HELDOUT4:
        *_, truth, codes, got = _scored(path, frames)
        doubts = got.analysis.segmentation.doubts
        pool = doubted if doubts else hits
        for ph, code in P.items():
            m = codes == code
            h, t = pool.get(ph, (0, 0))
            pool[ph] = (h + int((truth[m] == code).sum()), t + int(m.sum()))
        assert all(0 < p.confidence < 1 for p in got.phases.values() if p.source == "inferred")
        for name, p in got.phases.items():
            if p.source == "inferred" and doubts:
                assert p.confidence == min(CONFIDENCE[how][name], DOUBTFUL.get(name, 1.0))
    for ph, conf in CONFIDENCE[how].items():
        h, t = hits[ph]
        assert t and conf - 0.05 <= h / t <= conf + 0.011, (ph, h / t, conf)
    # Doubted readings are less sure (DOUBTFUL is fitted over all 146 marked traces, docs/eval_frameless.py;
    # of these 55 only FSDP2 without frames is doubted): what they name is right less often than what
    # the others name, and their forward, the phase a missed backward falls into, is right no more often
    # than DOUBTFUL says, give or take the fit's spread.
    if doubted:
        named = [ph for ph in P if ph != "other"]
        share = lambda pool: sum(pool.get(ph, (0, 0))[0] for ph in named) / max(sum(pool.get(ph, (0, 0))[1] for ph in named), 1)  # noqa: E731
        assert share(doubted) < share(hits) - 0.1
        h, t = doubted.get("forward", (0, 0))
        assert not t or h / t <= DOUBTFUL["forward"] + 0.15


@pytest.mark.parametrize("frames", [True, False], ids=["frames", "no-frames"])
def test_partial_steps_as_the_markers_say(frames):
    """A wrapped ring buffer starts inside a step: without markers that step is found partial too."""
    for path in PATHS:
        *_, got = _scored(path, frames)
        truth = analyzed(path, marker_prefix=prefix_of(path))
        if len(got.steps) == len(truth.steps):
            assert [s.complete for s in got.steps] == [s.complete for s in truth.steps], path.name
    *_, got = _scored(FIXTURES / "gpt_wrapped.pkl.xz", frames)
    assert [s.complete for s in got.steps] == [False, True]
    assert "partial" in str(got)


@pytest.mark.parametrize("frames", [True, False], ids=["frames", "no-frames"])
def test_cuda_graphed_model_loss_backward_and_optimizer(frames):
    """A CUDA-graphed model's forward and backward replay as graphs and make no events: each step is
    still found, from the loss's cross-entropy fingerprint and the optimizer's bursts."""
    path = FIXTURES / "odd_cudagraph.pkl.xz"
    *_, truth, codes, got = _scored(path, frames)
    assert len(got.steps) == 3
    for ph in ("loss", "backward", "optimizer"):
        m = truth == P[ph]
        assert np.mean(codes[m] == P[ph]) > 0.8, ph


def test_report_text_says_phases_were_inferred_not_missing():
    *_, got = _scored(FIXTURES / "gpt_foreach.pkl.xz", False)
    text = str(got)
    assert "phases were inferred" in text and "every phase was inferred" in text
    assert "everything is 'other'" not in text


SP = "/usr/lib/python3/site-packages/"


@pytest.mark.parametrize("stack, want", [
    # torch's own AdamW, foreach
    ([(SP + "torch/optim/adamw.py", "_multi_tensor_adamw"), (SP + "torch/optim/adamw.py", "step"),
      (SP + "torch/optim/optimizer.py", "wrapper"), ("/home/u/train.py", "main")], frames_mod.OPT),
    # bitsandbytes' 8-bit Adam: a torch.optim.Optimizer subclass living in another library
    ([(SP + "bitsandbytes/functional.py", "optimizer_update_8bit"),
      (SP + "bitsandbytes/optim/optimizer.py", "update_step"), (SP + "bitsandbytes/optim/optimizer.py", "step"),
      (SP + "torch/optim/optimizer.py", "wrapper"), ("/home/u/train.py", "main")], frames_mod.OPT),
    # an optimizer written in the user's own file
    ([("/home/u/myopt.py", "step"), (SP + "torch/optim/optimizer.py", "wrapper"),
      ("/home/u/train.py", "main")], frames_mod.OPT),
    # a closure in the user's file, called by LBFGS's step: the loss is not the optimizer
    ([("/home/u/train.py", "closure"), (SP + "torch/optim/lbfgs.py", "step"),
      (SP + "torch/optim/optimizer.py", "wrapper"), ("/home/u/train.py", "main")], frames_mod.OTHER),
    # Lightning: the user's training_step computes the loss inside AdamW.step's closure
    ([("/home/u/model.py", "training_step"), (SP + "lightning/pytorch/loops/automatic.py", "closure"),
      (SP + "torch/optim/adamw.py", "step"), (SP + "torch/optim/optimizer.py", "wrapper")], frames_mod.OTHER),
    # ... and its forward there is forward
    ([(SP + "torch/nn/modules/module.py", "_call_impl"), ("/home/u/model.py", "training_step"),
      (SP + "torch/optim/adamw.py", "step")], frames_mod.FWD),
    ([("/home/u/train.py", "zero_grad")], frames_mod.ZG),
    # Muon as modded-nanogpt writes it (fixtures/heldout13): step decorated with @torch.no_grad(),
    # its Newton-Schulz helper in the same file
    ([("/home/u/muon.py", "zeropower_via_newtonschulz5"), ("/home/u/muon.py", "step"),
      (SP + "torch/utils/_contextlib.py", "decorate_context"), (SP + "torch/optim/optimizer.py", "wrapper"),
      ("/home/u/train.py", "main")], frames_mod.OPT),
    # ... but a closure that subclass's step calls is the loss, not the optimizer
    ([(SP + "torch/nn/functional.py", "cross_entropy"), ("/home/u/train.py", "closure"),
      ("/home/u/myopt.py", "step"), (SP + "torch/utils/_contextlib.py", "decorate_context"),
      (SP + "torch/optim/optimizer.py", "wrapper"), ("/home/u/train.py", "main")], frames_mod.OTHER),
    # ... and so is the user's training_step that Lightning's loop runs from it
    ([("/home/u/model.py", "training_step"), (SP + "lightning/pytorch/loops/automatic.py", "__call__"),
      ("/home/u/myopt.py", "step"), (SP + "torch/optim/optimizer.py", "wrapper")], frames_mod.OTHER),
])
def test_frame_classes_for_optimizers_from_anywhere(stack, want):
    assert frames_mod.classify_frames([(fn, 1, nm) for fn, nm in stack]) == want




@pytest.mark.parametrize("path", HELDOUT + HELDOUT2 + HELDOUT3 + HELDOUT4, ids=_name)
def test_heldout_traces_with_frames(path):
    """Traces recorded after the rules were written (docs/accuracy.md, "Held-out traces")."""
    acc, got, marked = _score(path, True)
    assert got == marked and acc >= 0.98


def test_heldout_traces_without_frames_no_worse_than_measured():
    scores = [_score(p, False) for p in HELDOUT]
    assert len(scores) == 8
    assert np.mean([s[0] for s in scores]) >= 0.80  # 0.815 measured; 0.727 before they were seen
    assert sum(s[1] == s[2] for s in scores) >= 7


def test_second_heldout_set_without_frames_no_worse_than_measured():
    scores = [_score(p, False) for p in HELDOUT2]
    assert len(scores) == 8
    assert np.mean([s[0] for s in scores]) >= 0.89  # 0.903 measured; 0.831 before they were seen
    assert all(s[1] == s[2] for s in scores)


def test_inference_loop_whose_activations_match_parameter_sizes_is_not_training():
    """A ConvNeXt evaluation loop frees last-made-first and makes parameter-sized blocks (per-channel
    tensors), but none outlives its pass: no gradients, so no backward and no optimizer."""
    *_, truth, codes, got = _scored(FIXTURES / "heldout2" / "heldout2_convnext_eval.pkl.xz", False)
    assert "backward" not in got.phases and "optimizer" not in got.phases
    assert np.mean(codes[truth == P["forward"]] == P["forward"]) > 0.95


def test_third_heldout_set_measured_once():
    """Evaluated once, after every rule was final: the estimate for traces phasemem has not seen."""
    scores = [_score(p, False) for p in HELDOUT3]
    assert len(scores) == 7
    assert np.mean([s[0] for s in scores]) >= 0.80  # 0.810 measured
    assert all(s[1] == s[2] for s in scores)


def test_fourth_heldout_set_wrappers_without_frames_as_measured():
    """DDP, FSDP2 and the HF Trainer, measured once (docs/accuracy.md): without frames the steps are
    found but FSDP2's all-gather sawtooth and DDP's bucket-view gradients (no gradient is allocated)
    hide the passes; the plain DDP and Trainer traces are read well."""
    scores = {_name(p): _score(p, False) for p in HELDOUT4}
    assert len(scores) == 4
    # Steps exact on all four: bucket views (1 step for 3 until 2026-12-04) train by AdamW's bursts between
    # the passes, FSDP2's steps end at its updates (docs/accuracy.md, "Frameless, over every marked trace").
    assert all(s[1] == s[2] for s in scores.values())
    assert scores["heldout4_gpt_ddp"][0] >= 0.95 and scores["heldout4_llama_hf_trainer"][0] >= 0.87
    assert scores["heldout4_gpt_ddp_bucket_view"][0] >= 0.95  # 0.220 before
    assert np.mean([s[0] for s in scores.values()]) >= 0.8  # 0.547 measured first


def test_fsdp2_backward_hooks_are_backward_by_frames():
    """FSDP2 all-gathers parameters again in backward from hooks run on the autograd thread; their
    Python frames must not make that work 'other' (0.860 before the rule, 0.999 after)."""
    *_, truth, codes, got = _scored(FIXTURES / "heldout4" / "heldout4_gpt_fsdp2_bf16.pkl.xz", True)
    bwd = truth == P["backward"]
    assert np.mean(codes[bwd] == P["backward"]) > 0.99


def test_windows_frames_are_read():
    """magma27 ran on Windows (backslashes): its forward is forward by frames, its backward backward."""
    r = wild_report("magma27_cs336")
    assert r.phases["forward"].source == "inferred" and r.phases["forward"].n_events > 1000
    assert r.phases["backward"].n_events > 3000


def _frames_only(snap: dict) -> dict:
    """The snapshot without any annotation (torch's Optimizer.step ranges too): frames decide."""
    s = as_handed_over(snap)
    s["external_annotations"] = []
    return s


def test_a_decorated_optimizer_subclass_with_helpers_is_the_optimizer_by_its_frames():
    """Muon's step (``@torch.no_grad()``, a Newton-Schulz helper) with no annotation to go by: its
    events were 'other' (accuracy 0.26), because the decorator's frame hid the subclass's step."""
    snap = heldout("h13_muon_adamw")
    opt = in_gt_range(snap, "optimizer")
    got = phasemem.analyze(_frames_only(snap))
    codes = got.analysis.labels
    assert opt.sum() > 5000
    assert np.mean(codes[opt] == P["optimizer"]) > 0.99
    # and nothing outside the update is called optimizer
    assert np.mean(codes[~opt] == P["optimizer"]) < 0.01
    assert len(got.steps) == 3
