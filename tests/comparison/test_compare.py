"""phasemem.report.compare and phasemem diff on real H200 traces: the peaks' change is the one replaying the
raw trace gives, the causes add up to it, a run against itself changes nothing, a copy that lost a
step still aligns, bad input is one line and exit 2, a broken budget exits 1."""
from __future__ import annotations

import copy
import json
import pickle

import pytest

import phasemem
from helpers import reference
from helpers.paths import ROOT
from helpers.png import png_size
from helpers.snapshots import read as raw
from phasemem.commands.cli import main
from phasemem.report.compare import align_runs
from phasemem.report.comparison import named_floor

FIX = ROOT / "fixtures"
PAIRS = FIX / "pairs"
FOREACH, FUSED = FIX / "gpt_foreach.pkl.xz", FIX / "gpt_ckpt_fused.pkl.xz"
KEEP, END = FIX / "gpt_zero_grad_keep.pkl.xz", FIX / "gpt_zero_grad_end.pkl.xz"
MIB = 1 << 20




def step_peaks(snap: dict, prefix: str = "phasemem::") -> list[int]:
    """Each step's peak by a naive replay of the raw trace: the level while an event ran (after an
    alloc, before a free), steps cut at the optimizer markers' ENDs."""
    events = snap["device_traces"][0]
    _, after, deltas = reference.replay(events, snap["segments"])
    ivs = reference.intervals(snap["external_annotations"], prefix)
    if "optimizer" not in ivs:  # the CPU path keeps PyTorch's own Optimizer.step#<Cls>.step ranges
        ivs = {"optimizer": [iv for v in reference.intervals(snap["external_annotations"], "Optimizer.step#").values()
                             for iv in v]}
    step_of = reference.steps_from_optimizer(events, ivs)
    peaks: dict[int, int] = {}
    for k, a, d in zip(step_of, after, deltas):
        if k >= 0:
            peaks[k] = max(peaks.get(k, 0), a, a - d)
    return [peaks[k] for k in sorted(peaks)]


def all_deltas_zero(c) -> bool:
    return (c.delta == 0 and all(p.delta == 0 for p in c.phases.values())
            and all(s.change == "same" for s in c.shapes) and all(v["delta"] == 0 for v in c.categories.values())
            and c.attribution == [] and c.unexplained_bytes == 0)


# -- a run against itself, and against itself with a step cut away ------------------------------------


@pytest.mark.parametrize("path", [FOREACH, FUSED, KEEP], ids=lambda p: p.name.split(".")[0])
def test_a_run_against_itself_changes_nothing(path):
    c = phasemem.compare(path, path)
    assert all_deltas_zero(c)
    assert c.main_cause() is None
    assert all(s.a is not None and s.b is not None for s in c.slots)
    assert c.a.peak_bytes == step_peaks(raw(path))[c.a.steps[0]]


def cut_first_step(snap: dict, prefix: str = "phasemem::") -> dict:
    """The snapshot as a ring buffer that lost its first step: step 0's events and markers gone. What
    step 0 left alive is then found as memory from before the recording (frees without allocs, blocks
    in the segments), as in a wrapped trace."""
    out = copy.deepcopy(snap)
    end0 = min(a["time_us"] for a in snap["external_annotations"]
               if a["name"] == prefix + "optimizer" and a["stage"] == "END")
    out["device_traces"][0] = [e for e in snap["device_traces"][0] if e["time_us"] > end0]
    out["external_annotations"] = [a for a in snap["external_annotations"] if a["time_us"] > end0]
    return out


def test_a_copy_with_a_step_cut_away_still_aligns(tmp_path, capsys):
    snap = raw(FOREACH)
    cut = cut_first_step(snap)
    assert len(cut["device_traces"][0]) < len(snap["device_traces"][0])
    c = phasemem.compare(snap, cut)
    assert len(c.b_report.steps) == len(c.a_report.steps) - 1
    assert all_deltas_zero(c), str(c)
    assert [s.phase for s in c.slots] == [s.phase for s in phasemem.compare(snap, snap).slots]
    assert all(s.a is not None and s.b is not None for s in c.slots)
    # the same from the command line, through files
    a, b = tmp_path / "a.pickle", tmp_path / "b.pickle"
    a.write_bytes(pickle.dumps(snap))
    b.write_bytes(pickle.dumps(cut))
    js = tmp_path / "d.json"
    assert main(["diff", str(a), str(b), "-o", str(tmp_path / "d.png"), "--json", str(js),
                 "--fail-if", "peak>+0%", "--fail-if", "backward.peak>+1B"]) == 0
    d = json.loads(js.read_text())
    assert d["peak"]["delta"] == 0 and all(p["delta"] == 0 for p in d["phases"].values())
    assert capsys.readouterr().err == ""


def test_self_diff_from_the_command_line_is_all_zero_and_exit_0(tmp_path, capsys):
    js, png = tmp_path / "d.json", tmp_path / "d.png"
    assert main(["diff", str(FUSED), str(FUSED), "-o", str(png), "--json", str(js), "--fail-if", "peak>+0%"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and f"wrote {png}, {js}" in out
    d = json.loads(js.read_text())
    assert set(d) >= {"a", "b", "peak", "phases", "shapes", "categories", "attribution", "unexplained_bytes"}
    assert set(d["peak"]) >= {"a", "b", "delta", "a_phase", "b_phase"}
    assert d["peak"]["a"] == d["peak"]["b"] == step_peaks(raw(FUSED))[d["a"]["steps"][0]]
    assert all(set(p) >= {"a_peak", "b_peak", "delta"} and p["delta"] == 0 for p in d["phases"].values())
    assert all(set(s) >= {"kind", "a_bytes", "b_bytes", "change"} and s["change"] == "same" for s in d["shapes"])
    assert all(set(v) == {"a", "b", "delta"} and v["delta"] == 0 for v in d["categories"].values())
    assert d["attribution"] == [] and d["unexplained_bytes"] == 0
    assert isinstance(d["peak"]["a"], int) and all(isinstance(v["a"], int) for v in d["categories"].values())
    assert png_size(png) == (1600, 900)


# -- real near-pairs ----------------------------------------------------------------------------------


def test_keeping_the_gradients_is_named_as_the_cause():
    """gpt_zero_grad_end frees the gradients at the end of each step; gpt_zero_grad_keep zeroes them in
    place (set_to_none=False), so they are alive at backward's peak: the peak grows by the parameters'
    size (fp32 gradients), and the cause named is the gradients."""
    c = phasemem.compare(END, KEEP)
    measured = [step_peaks(raw(p))[s] for p, s in ((END, c.a.steps[0]), (KEEP, c.b.steps[0]))]
    assert c.delta == measured[1] - measured[0] > 0
    assert sum(x.bytes for x in c.attribution) + c.unexplained_bytes == c.delta
    assert abs(c.unexplained_bytes) <= 0.01 * abs(c.delta)
    param_bytes = raw(KEEP)["phasemem"]["meta"]["param_bytes"]
    main_cause = c.main_cause()
    assert main_cause["where"] == "peak" and main_cause["cause"] in ("gradient", "gradients")
    assert abs(main_cause["bytes"] - param_bytes) <= 0.01 * param_bytes
    assert c.categories["gradient"]["delta"] == c.categories["gradient"]["b"] > 0.99 * param_bytes
    assert c.a.peak_phase == c.b.peak_phase == "backward"
    # B's gradients persist, so no zero_grad frees them and backward makes none: both shapes disappear
    gone = {(s.kind, s.phase) for s in c.shapes if s.change == "disappeared"}
    assert {("gradients", "zero_grad"), ("gradients", "backward")} <= gone
    # and B runs zero_grad where A does not, at the start of the step: the alignment puts it apart
    assert c.slots[0].phase == "zero_grad" and c.slots[0].a is not None and c.slots[0].b is None


def test_a_fused_checkpointed_run_against_a_foreach_one():
    c = phasemem.compare(FOREACH, FUSED)
    measured = [step_peaks(raw(p))[s] for p, s in ((FOREACH, c.a.steps[0]), (FUSED, c.b.steps[0]))]
    assert c.delta == measured[1] - measured[0]
    assert sum(x.bytes for x in c.attribution) + c.unexplained_bytes == c.delta
    change = {(s.kind, s.phase): s.change for s in c.shapes}
    assert change[("optimizer_temporaries", "optimizer")] == "disappeared"  # fused=True
    assert change[("checkpoint_recompute", "backward")] == "appeared"  # checkpoint() per block
    # fused AdamW allocates nothing in its steady steps: B's optimizer ran no events
    assert [s for s in c.slots if s.phase == "optimizer"][0].b is None
    assert c.a.peak_phase == "backward" and c.b.peak_phase == "loss"


@pytest.mark.parametrize("spec, a, b", [("1", 1, 1), ("1:2", 1, 2), ("2:0", 2, 0)])
def test_steps_pick_the_compared_steps(spec, a, b):
    c = phasemem.compare(FOREACH, FOREACH, steps=spec)
    assert (c.a.steps, c.b.steps) == ([a], [b])
    peaks = step_peaks(raw(FOREACH))
    assert c.delta == peaks[b] - peaks[a]
    assert sum(x.bytes for x in c.attribution) + c.unexplained_bytes == c.delta


def test_all_steps_compares_the_whole_recordings():
    c = phasemem.compare(FOREACH, END, steps="all")
    assert c.a.peak_bytes == max(step_peaks(raw(FOREACH))) and c.b.peak_bytes == max(step_peaks(raw(END)))
    assert c.a.steps == [0, 1, 2]
    assert sum(x.bytes for x in c.attribution) + c.unexplained_bytes == c.delta


def test_reports_and_snapshots_are_accepted_as_well_as_paths():
    r = phasemem.analyze(KEEP)
    c = phasemem.compare(r, raw(END))
    assert (c.a.name, c.b.name) == ("A", "B")
    assert c.delta == phasemem.compare(KEEP, END).delta


def test_alignment_keeps_common_phases_in_one_slot():
    a = [(0, 4, "other"), (5, 9, "forward"), (10, 12, "loss"), (13, 14, "zero_grad"), (15, 20, "backward")]
    b = [(0, 1, "zero_grad"), (2, 4, "other"), (5, 9, "forward"), (10, 12, "loss"), (15, 20, "backward")]
    slots = align_runs(a, b)
    assert [(s.phase, s.a is not None, s.b is not None) for s in slots] == [
        ("zero_grad", False, True), ("other", True, True), ("forward", True, True), ("loss", True, True),
        ("zero_grad", True, False), ("backward", True, True)]


# -- the picture ------------------------------------------------------------------------------------


def test_the_picture_has_the_size_asked_for_and_names_the_changed_shapes(tmp_path):
    from phasemem.reporters.picture.compare import plot_comparison

    c = phasemem.compare(FOREACH, FUSED)
    fig = plot_comparison(c, size=(1200, 700), dpi=100)
    assert any(t.startswith("optimizer_temporaries") and t.endswith("→ gone") for t in fig.phasemem_callouts)
    png = tmp_path / "d.png"
    c.save_png(png, size=(1200, 700))
    assert png_size(png) == (1200, 700)
    with pytest.raises(ValueError):
        plot_comparison(c, size=(100, 100))


# -- the gate, and bad input ------------------------------------------------------------------------


def test_broken_budgets_exit_1_one_line_each_after_writing(tmp_path, capsys):
    js, png = tmp_path / "d.json", tmp_path / "d.png"
    rc = main(["diff", str(END), str(KEEP), "-o", str(png), "--json", str(js), "--fail-if", "peak>+5%",
               "--fail-if", "backward.peak>+512MiB", "--fail-if", "gradient>+100MiB", "--fail-if", "peak>100GiB"])
    out, err = capsys.readouterr()
    assert rc == 1
    lines = err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("phasemem: over budget: peak>+5%: ")
    assert lines[1].startswith("phasemem: over budget: gradient>+100MiB: ")
    assert png.exists() and js.exists()
    said = {b["budget"]: b["broken"] for b in json.loads(js.read_text())["budgets"]}
    assert said["backward.peak>+512MiB"] is None and said["peak>+5%"].startswith("over budget")


def _garbage(tmp):
    p = tmp / "notes.txt"
    p.write_text("not a snapshot\n")
    return str(p)


BAD = {
    "missing-file": lambda tmp: [str(tmp / "nothing.pickle"), str(KEEP)],
    "not-a-snapshot": lambda tmp: [str(KEEP), _garbage(tmp)],
    "budget-does-not-parse": lambda tmp: [str(KEEP), str(END), "--fail-if", "peak>>5%"],
    "budget-unknown-phase": lambda tmp: [str(KEEP), str(END), "--fail-if", "forwrd.peak>1GiB"],
    "budget-unknown-name": lambda tmp: [str(KEEP), str(END), "--fail-if", "logit>1GiB"],
    "budget-bad-unit": lambda tmp: [str(KEEP), str(END), "--fail-if", "peak>2G"],
    "steps-do-not-parse": lambda tmp: [str(KEEP), str(END), "--steps", "2-4"],
    "steps-not-there": lambda tmp: [str(KEEP), str(END), "--steps", "7"],
    "device-all": lambda tmp: [str(KEEP), str(END), "--device", "all"],
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_exit_2_and_leaves_outputs(case, tmp_path, capsys):
    png, js = tmp_path / "d.png", tmp_path / "d.json"
    png.write_bytes(b"yesterday's picture")
    js.write_text('{"yesterday": true}')
    rc = main(["diff", *BAD[case](tmp_path), "-o", str(png), "--json", str(js)])
    out, err = capsys.readouterr()
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("phasemem: error: "), err
    assert "Traceback" not in err + out
    assert png.read_bytes() == b"yesterday's picture" and js.read_text() == '{"yesterday": true}'


def test_a_snapshot_without_history_cannot_be_compared():
    snap = raw(KEEP)
    snap["device_traces"] = [[]]
    with pytest.raises(phasemem.PhasememError, match="no allocation history"):
        phasemem.compare(KEEP, snap)


# -- the pairs recorded for docs/compare.md (fixtures/pairs/, H200) -----------------------------------

#: What each pair changed from ``base``, and the causes that name that change: the largest cause of the
#: peak's change (or, when the peak did not move, of the phase that changed most) must be one of them.
EXPECTED = {
    "fused": {"optimizer_temporaries", "temporary"},
    "chunked_ce": {"logits", "softmax_spike", "logits_release"},
    "bf16_logits": {"logits", "softmax_spike", "logits_release"},
    "ckpt": {"activation", "checkpoint_recompute"},
    "half_batch": {"activation", "temporary", "logits", "softmax_spike", "logits_release"},  # all batch-sized
    "zero_grad_before": {"gradient", "gradients"},
}
PAIR_NAMES = sorted(n for n in EXPECTED if (PAIRS / f"{n}.pkl.xz").exists())


@pytest.mark.skipif(not (PAIRS / "base.pkl.xz").exists(), reason=f"no recorded pairs in {PAIRS} (docs/compare.md)")
@pytest.mark.parametrize("name", PAIR_NAMES or ["none"])
def test_each_recorded_pair_names_the_change_that_was_made(name, pairs=PAIRS):
    if name == "none":
        pytest.skip(f"none of {', '.join(EXPECTED)} in {pairs}")
    base, new = pairs / "base.pkl.xz", pairs / f"{name}.pkl.xz"
    c = phasemem.compare(base, new)
    measured = [step_peaks(raw(p))[s] for p, s in ((base, c.a.steps[0]), (new, c.b.steps[0]))]
    assert c.a.peak_bytes == measured[0] and c.b.peak_bytes == measured[1]
    named = sum(x.bytes for x in c.attribution)
    assert named + c.unexplained_bytes == c.delta
    # the named causes are the measured change to 1 %, or to the smallest change a cause is named for
    # (the fused pair's peak moves by 308 B: nothing to name)
    assert abs(named - c.delta) <= max(0.01 * abs(c.delta), named_floor(c.a.peak_bytes, c.b.peak_bytes)), str(c)
    assert c.main_cause()["cause"] in EXPECTED[name], str(c)
    change = {(s.kind, s.phase): s for s in c.shapes}
    change = {k: s.change for k, s in change.items()} | {("shrank",) + k: s.b_bytes < s.a_bytes for k, s in change.items()}
    if name == "fused":  # CUDA's fused AdamW makes none at all; the CPU's some
        assert change.get(("shrank", "optimizer_temporaries", "optimizer"))
        assert c.phases["optimizer"].delta < 0
    if name == "ckpt":
        assert change.get(("checkpoint_recompute", "backward")) == "appeared"
    if name in ("chunked_ce", "bf16_logits", "half_batch"):
        assert c.delta < 0


def test_a_shapes_two_figures_are_labelled_where_both_are_said():
    """A shape's change is said twice with two meanings: in the shapes (each side's largest occurrence,
    whole) and in the causes (its bytes alive at each peak). Each line carries its label, and the main
    cause is the causes' own figure (half_batch: logits_release -3.84 GiB whole, -4.61 GiB at the peak)."""
    from phasemem.reporters.text.compare import SHAPE_SIZES
    from phasemem.units import signed
    from phasemem.vocab import AT_PEAK

    c = phasemem.compare(str(PAIRS / "base.pkl.xz"), str(PAIRS / "half_batch.pkl.xz"))
    text = str(c).splitlines()
    main = c.main_cause()
    cause = next(x for x in c.attribution if x.cause == main["cause"])
    shape = next(s for s in c.shapes if s.kind == main["cause"] and s.change != "same")
    assert cause.bytes != shape.delta  # two figures of one shape: why both need a label
    assert f"main cause: {main['cause']} {signed(cause.bytes)} {AT_PEAK}" in text
    assert f"shapes ({SHAPE_SIZES}):" in text
    assert any(line.startswith(f"the peak's change {signed(c.delta)}, by cause ({AT_PEAK}") for line in text)
