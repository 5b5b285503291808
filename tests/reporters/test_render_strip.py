"""The phase strip shows a phase narrower than a pixel (``pixels.widen``): it takes a column a
neighbour can spare, no occurrence that had a column loses it, and the order stays. Read off the
strip image drawn for real traces, against the centre rule applied to the occurrences' own widths."""
from __future__ import annotations

import numpy as np
import pytest
from matplotlib import colors as mcolors

import phasemem
from helpers.paths import FIXTURES
from phasemem.reporters.picture import bands, labels, pixels
from phasemem.vocab import PHASE_COLORS

OTHER = "#c8c8c8"  # the strip's grey where no phase is known (render/colours.py)


def _strip(report, size):
    """(the drawn strip's column colours, the columns the occurrences' own widths give, the runs)."""
    fig = report.plot(size=size)
    ax = fig.axes[0]
    (im,) = [im for im in ax.images if im.get_gid() == "phase-strip"]
    rgba = np.asarray(im.get_array())
    row = rgba[rgba.shape[0] // 2]  # through the middle of the strip
    drawn = [tuple(int(v) for v in px[:3]) if px[3] else None for px in row]  # None: no cell there
    runs = report.label_runs()
    X = bands.x_values(report, "event")
    W, H = size
    view = labels.View(list(ax.get_position().bounds), W, H, X[0], X[report.n_events], 1.0)
    x0 = np.array([X[a] for a, _, _, _ in runs])
    x1 = np.array([X[b + 1] for _, b, _, _ in runs])
    i0, i1, _, _ = pixels.grid(view)
    centre = np.arange(i0, i1) + 0.5
    a, b = view.x_px(x0), view.x_px(x1)
    k = np.searchsorted(a, centre, "left") - 1
    inside = (k >= 0) & (centre <= b[np.maximum(k, 0)])
    return drawn, np.where(inside, k, -1), runs


def _colour(phase):
    return tuple(int(v) for v in np.floor(np.array(mcolors.to_rgb(PHASE_COLORS.get(phase, OTHER))) * 255 + 0.5))


def _collapse(seq):
    return [c for i, c in enumerate(seq) if i == 0 or c != seq[i - 1]]


@pytest.mark.parametrize("name,size", [("truth/truth_gpt_accum_clip", (600, 400)), ("vit_adamw", (1600, 900)),
                                       ("qwen_hf_ckpt_fused", (600, 400))])
def test_every_phase_occurrence_shows_in_the_strip(name, size):
    """Each had occurrences narrower than a pixel (7, 1 and 3 of them: a loss of a few events, a
    zero_grad's frees); now the strip's colours, column by column, are the occurrences' in order."""
    report = phasemem.analyze(FIXTURES / f"{name}.pkl.xz", what_ifs=False)
    drawn, centre_run, runs = _strip(report, size)
    cols = _collapse([c for c in drawn if c is not None])
    want = _collapse([_colour(ph) for _, _, ph, _ in runs])
    assert cols == want
    # the centre rule alone left some out
    assert len(_collapse([_colour(runs[k][2]) for k in centre_run.tolist() if k >= 0])) < len(want)


def test_no_occurrence_loses_its_column_on_a_dense_strip():
    """h6_optim_in_backward at 600 pixels: 412 occurrences, most a pixel or less (an optimizer step in
    every backward hook). A column changes hands only from an occurrence that keeps another one."""
    report = phasemem.analyze(FIXTURES / "heldout6" / "h6_optim_in_backward.pkl.xz", what_ifs=False)
    drawn, centre_run, runs = _strip(report, (600, 400))
    colour = drawn
    shown = {}
    for j, k in enumerate(centre_run.tolist()):
        if k >= 0:
            shown.setdefault(k, []).append(j)
    moved = 0
    for k, js in shown.items():
        want = _colour(runs[k][2])
        kept = [j for j in js if colour[j] == want]
        assert kept, (k, runs[k])  # still shown
        moved += len(js) - len(kept)
    assert moved > 0  # some columns went to occurrences that had none


def test_a_question_mark_means_unsure_and_the_legend_says_so():
    """'?' in the strip is an unsure phase's mark (loss?), never 'other' shortened; the legend's entry
    of an unsure phase is hatched as its cells are and says it was inferred. gpt_foreach without
    annotations or frames: its loss is inferred below colours.UNSURE."""
    from helpers.snapshots import load_snapshot

    snap = load_snapshot(FIXTURES / "gpt_foreach.pkl.xz")
    snap["external_annotations"] = []
    snap.pop("phasemem", None)
    for e in snap["device_traces"][0]:
        e["frames"] = []
    report = phasemem.analyze(snap)
    # truth_gpt_accum_clip at 600 pixels: its 'other' cells between steps had room for a '?' alone
    clip = phasemem.analyze(FIXTURES / "truth" / "truth_gpt_accum_clip.pkl.xz", what_ifs=False)
    for r, size in ((report, (1600, 900)), (report, (600, 400)), (clip, (600, 400))):
        strip = [t.get_text() for t in r.plot(size=size).axes[0].texts if t.get_text().endswith("?")]
        assert all(t[:-1] in PHASE_COLORS for t in strip), strip  # a phase's name with its '?', not '?' alone
    fig = report.plot()
    entries = {t.get_text(): h for lg in fig.legends for t, h in zip(lg.get_texts(), lg.legend_handles)}
    (loss,) = [k for k in entries if k.startswith("loss?")]
    assert loss == f"loss? (inferred, {report.phases['loss'].confidence:.0%} sure)"
    assert entries[loss].get_hatch() == "xx"
    assert not entries["forward"].get_hatch()
