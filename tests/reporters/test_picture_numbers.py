"""The picture's numbers are the report's: each callout gives its shape the figure of the report's list
of shapes (the occurrence's whole size), and the peak bar names every slice (beside it, under the bar,
or summed as "n more") with the bytes of its categories at the peak, and its shapes with what of them
was alive then, said so. The label strings come from the functions that build them
(``labels.callout_text``, ``peakbar.lines``), never read off the pixels; the figures they should show
are recomputed here from the report's objects: the categories from ``Report.by_category`` (made apart
from the peak's breakdown), the shapes from their member allocations' lifetimes. Every fixture."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import phasemem
from helpers.paths import FIXTURES
from phasemem.analysis.peak import SHAPE_PRIORITY
from phasemem.reporters.picture import labels, peakbar
from phasemem.units import format_bytes
from phasemem.vocab import AT_PEAK

WILD = FIXTURES.parent.parent / "shared" / "wild"
PATHS = sorted(FIXTURES.glob("*.pkl.xz")) + sorted(FIXTURES.glob("*/**/*.pkl.xz"))
#: The bar at a tall and at a short scale (pixels of the bar, room under it): the second leaves the
#: thin slices too little room, so they are summed.
SCALES = [(700.0, 53.4), (150.0, 14.0)]
FIGURE = re.compile(r"(\d[\d.,]*) (B|KiB|MiB|GiB|TiB)$")


@pytest.fixture(scope="module")
def lay():
    return labels.Layout(FigureCanvasAgg(Figure(figsize=(16, 9), dpi=100)), 1600, 900, 100)


def _figure(text: str) -> str:
    m = FIGURE.search(text.split("\n")[-1])
    assert m, text
    return f"{m.group(1)} {m.group(2)}"


def _shapes_alive_at_peak(report) -> dict[str, int]:
    """The bytes of each shape alive at the peak, from its members' lifetimes: an allocation counts for
    the first kind of SHAPE_PRIORITY whose shapes hold it (the kinds it lists); alive where the peak's level counts it (made
    at or before the peak event, freed after it, or at it where the peak is that free's moment)."""
    an, e = report.analysis, report.peak_event
    life = an.timeline.lifetimes
    n_pre = int((life.alloc_event < 0).sum())
    rank = np.full(len(life), len(SHAPE_PRIORITY), np.int64)
    for p in report.patterns:
        if p.kind in SHAPE_PRIORITY and p.members:  # amp_unscale, grad_clip: no bytes of their own at a moment
            np.minimum.at(rank, n_pre + np.asarray(p.members, np.int64), SHAPE_PRIORITY.index(p.kind))
    a, f = life.alloc_event, life.free_event
    if an.timeline.active_after[e] < an.timeline.active_before[e]:  # the level before a free
        alive = (a < e) & (f >= e)
    else:
        alive = (a <= e) & (f > e)
    held = alive & (rank < len(SHAPE_PRIORITY))
    sums = np.bincount(rank[held], weights=life.size[held], minlength=len(SHAPE_PRIORITY))
    return {k: int(v) for k, v in zip(SHAPE_PRIORITY, sums.tolist()) if v}


def _cases():
    wild = sorted(WILD.glob("*.pickle")) if WILD.exists() else []
    return PATHS + wild


@pytest.mark.parametrize("path", _cases(), ids=lambda p: "/".join(p.parts[-2:]).split(".")[0])
def test_picture_numbers_are_the_reports(path: Path, lay):
    try:
        report = phasemem.analyze(path, what_ifs=False)
    except phasemem.PhasememError:
        pytest.skip("no history to draw")
    if report.live is not None or report.peak is None:
        pytest.skip("no history to draw")
    # callouts: the list's figure for the same occurrence
    for p in report.patterns:
        text = labels.callout_text(p)
        assert text.startswith(p.kind + " ") and _figure(text) == format_bytes(p.bytes), (text, p.bytes)
    # the bar: every slice named once, with its category's bytes at the peak, summing to the peak
    peak = report.peak
    assert {c: v for c, v in peak.by_category.items() if v} == {c: v for c, v in report.by_category.items() if v}
    shapes = _shapes_alive_at_peak(report)
    assert shapes == peak.by_shape
    for h_px, under_px in SCALES:
        got = peakbar.lines(lay, peak, peak.bytes * 1.1, h_px, peakbar.BAR_PX, under_px)
        slices = [ln for ln in got if ln.kind in ("slice", "under", "more")]
        named = [c for ln in slices for c in ln.names]
        assert sorted(named) == sorted(c for c, v in report.by_category.items() if v)  # each once, all
        for ln in slices:
            want = sum(report.by_category[c] for c in ln.names)
            assert ln.nbytes == want and _figure(ln.text) == format_bytes(want), (ln, want)
            if ln.kind == "more":
                assert ln.text.startswith(f"{len(ln.names)} more ")
        assert sum(ln.nbytes for ln in slices) == report.peak_bytes
        listed = [ln for ln in got if ln.kind == "shape"]
        for ln in listed:
            (kind,) = ln.names
            assert ln.nbytes == shapes[kind] and _figure(ln.text) == format_bytes(shapes[kind])
        if listed:  # said to be what was alive then, not the shape's whole size the list gives
            assert any(ln.kind == "heading" and AT_PEAK in ln.text for ln in got)


def test_the_bar_sums_thin_slices_it_has_no_room_to_name(lay):
    """gpt_wrapped's peak holds six categories; at 150 pixels the thin ones cannot each have a line
    under the bar: the last line sums what is left, "n more", and says its bytes."""
    report = phasemem.analyze(FIXTURES / "gpt_wrapped.pkl.xz", what_ifs=False)
    got = peakbar.lines(lay, report.peak, report.peak.bytes * 1.1, 150.0, peakbar.BAR_PX, 14.0)
    more = [ln for ln in got if ln.kind == "more"]
    thin = [c for ln in got if ln.kind in ("under", "more") for c in ln.names]
    assert len(more) == 1 and len(thin) >= 2
    assert more[0].nbytes == sum(report.by_category[c] for c in more[0].names) > 0


def test_the_drawn_bar_is_the_lines(lay):
    """What plot() draws beside the curve is peakbar.lines' texts, every one of them."""
    report = phasemem.analyze(FIXTURES / "gpt_foreach.pkl.xz", what_ifs=False)
    fig = report.plot(size=(600, 400))
    texts = [t.get_text() for ax in fig.axes[1:] for t in ax.texts]
    assert fig.phasemem_peakbar and all(ln.text in texts for ln in fig.phasemem_peakbar)
    assert np.isclose(sum(ln.nbytes for ln in fig.phasemem_peakbar if ln.kind in ("slice", "under", "more")),
                      report.peak_bytes)
