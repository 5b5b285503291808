"""The picture: allocation bands that add up to the memory curve, files at the exact size asked for,
options honoured, every pattern called out, and no text on text."""
from __future__ import annotations

import importlib.util
import lzma
import os
import pickle
import re
import stat
import sys
from functools import lru_cache
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

import phasemem
from helpers.analyses import analyzed
from helpers.paths import ROOT
from helpers.png import png_size
from helpers.snapshots import load_snapshot
from helpers.wild import wild_path
from phasemem.analysis.categories import CATEGORIES
from phasemem.errors import PhasememError
from phasemem.reporters.picture import bands
from phasemem.reporters.picture import colours as picture_colours
from phasemem.units import format_bytes

FIXTURES = ROOT / "fixtures"
SHARED = ROOT.parent / "shared" / "gpu-snapshots"
SNAPSHOTS = sorted(SHARED.glob("*.pkl.xz"))
# Our own recordings: parameters and AdamW state pre-exist in all of them; gpt_wrapped's ring buffer
# wrapped (pre-existing blocks freed during the trace); qwen's fused AdamW has optimizer phases with
# no events; resnet is a CNN.
RECORDED = [FIXTURES / f"{name}.pkl.xz" for name in ("gpt_foreach", "gpt_wrapped", "qwen_hf_ckpt_fused", "resnet_sgd")]


def _bench():
    # The step replicator lives with the benchmark, which needs it for its million-event trace.
    spec = importlib.util.spec_from_file_location("bench_analyze", ROOT / "benchmarks" / "bench_analyze.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@lru_cache(maxsize=None)
def _raw(path: Path) -> dict:
    obj = pickle.loads(lzma.decompress(path.read_bytes()))
    return obj.get("snapshot", obj)


@lru_cache(maxsize=None)
def _report(path: Path):
    return analyzed(path, "file", marker_prefix="gt::" if path.parent == SHARED else "phasemem::")


@lru_cache(maxsize=None)
def _plot(path: Path, **options) -> Figure:
    return _report(path).plot(**options)


@lru_cache(maxsize=None)
def _fifty_steps():
    """gpt_ckpt_fused_seedlike with its step 1 repeated: 50 steps, ~124,000 events."""
    path = SHARED / "gpt_ckpt_fused_seedlike.pkl.xz"
    if not path.exists():
        pytest.skip(f"no real GPU snapshots at {SHARED} (the 50-step trace is built from one)")
    snap = _bench().replicate_steps(_raw(path), 48, first=1, last=1)
    return phasemem.analyze(snap, marker_prefix="gt::")


@pytest.fixture(params=SNAPSHOTS or [None], ids=lambda p: p.name.split(".")[0] if p else "missing")
def snapshot(request) -> Path:
    if request.param is None:
        pytest.skip(f"no real GPU snapshots at {SHARED}: the render tests draw those")
    return request.param


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is not there")
    return path


def pdf_page(path: Path) -> tuple[float, float]:
    m = re.search(rb"/MediaBox\s*\[\s*0\s+0\s+([\d.]+)\s+([\d.]+)\s*\]", path.read_bytes())
    assert m, "no MediaBox"
    return float(m.group(1)), float(m.group(2))


def texts(fig: Figure) -> list[Text]:
    """Every visible piece of text drawn on the figure except tick labels."""
    ticks = {id(t) for ax in fig.axes for t in ax.get_xticklabels() + ax.get_yticklabels()}
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and id(t) not in ticks]


def overlaps(fig: Figure) -> list[tuple[str, str]]:
    """Pairs of texts that overlap, and callout arrows that run through another text."""
    renderer = fig.canvas.get_renderer()
    fig.draw_without_rendering()
    # Text's own extent: an Annotation's get_window_extent would include its arrow.
    boxes = [(t.get_text(), Text.get_window_extent(t, renderer)) for t in texts(fig)]
    bad = []
    for i, (ta, a) in enumerate(boxes):
        for tb, b in boxes[i + 1:]:
            # touching is fine; a shared area of more than a pixel each way is not
            if min(a.x1, b.x1) - max(a.x0, b.x0) > 1 and min(a.y1, b.y1) - max(a.y0, b.y0) > 1:
                bad.append((ta, tb))
    for t in texts(fig):
        if t.get_gid() != "pattern-callout":
            continue
        path = t.arrow_patch.get_path().transformed(t.arrow_patch.get_transform())
        (x0, y0), (x1, y1) = path.vertices[0], path.vertices[-1]
        n = max(int(np.hypot(x1 - x0, y1 - y0) / 2), 2)
        pts = np.column_stack([np.linspace(x0, x1, n), np.linspace(y0, y1, n)])[:-4]  # the tip may touch
        for name, b in boxes:
            if name == t.get_text():
                continue
            inside = (pts[:, 0] > b.x0 + 1) & (pts[:, 0] < b.x1 - 1) & (pts[:, 1] > b.y0 + 1) & (pts[:, 1] < b.y1 - 1)
            if inside.any():
                bad.append((f"arrow of {t.get_text()}", name))
    return bad


def strip_cells(fig: Figure) -> int:
    from matplotlib.collections import PolyCollection

    polys = [c for c in fig.axes[0].collections if isinstance(c, PolyCollection) and c.get_zorder() == 1]
    # a PNG's plain strip cells are one image (render/pixels.py), which says how many it painted
    images = [im for im in fig.axes[0].images if im.get_gid() == "phase-strip"]
    return sum(len(c.get_paths()) for c in polys) + sum(im.phasemem_cells for im in images)


def by_gid(fig: Figure, gid: str) -> list:
    return [a for a in fig.findobj() if a.get_gid() == gid]


def legend_texts(fig: Figure) -> list[str]:
    return [t.get_text() for lg in fig.legends for t in lg.get_texts()]


# -- the bands add up to the curve ----------------------------------------------------------------


def _columns(report, ncols, by="event", a=0, b=None):
    tl = report.analysis.timeline
    b = report.n_events if b is None else b
    X = bands.x_values(report, by)
    return bands.columns(X, tl.level, tl.active_after, tl.reserved_after, tl.delta, a, b, ncols)


@pytest.mark.parametrize("path", RECORDED + [SHARED / "gpt_ckpt_fused_seedlike.pkl.xz"],
                         ids=lambda p: p.name.split(".")[0])
@pytest.mark.parametrize("ncols,max_bands,by", [(1400, 2000, "event"), (300, 10, "event"), (10**6, 50, "event"),
                                                (977, 2000, "time")])
def test_bands_add_up_to_the_curve_at_every_sample(path, ncols, max_bands, by):
    report = _report(_need(path))
    tl = report.analysis.timeline
    cols = _columns(report, ncols, by)
    st = bands.stack(tl.lifetimes, cols, report.n_events, max_bands, report.analysis.categories.codes)
    # base (from before recording) + every drawn band + the folded rest == the level at each sample
    total = st.drawn_top() + st.folded
    assert total.dtype == np.int64
    assert np.array_equal(total, tl.level[cols.event])
    # ... which is active_after itself where the sampled event is not a free
    after = tl.delta[cols.event] >= 0
    assert np.array_equal(total[after], tl.active_after[cols.event[after]])
    # a column's sample is its highest event: the stack's top is the curve's maximum there
    assert total.max() == tl.level.max() == report.peak_bytes
    assert len(st.index) <= max_bands and (st.folded >= 0).all()
    # the pre-existing base is what was alive from before recording to the end
    life = tl.lifetimes
    kept = life.preexisting & (life.free_event >= report.n_events)
    assert st.base.sum() == life.size[kept].sum() > 0


def test_band_offsets_are_memory_viz_stacking():
    """Each band sits on the drawn bands made before it that are still alive: checked against a
    plain loop over the columns, as memory_viz's process_alloc_data stacks them."""
    report = _report(_need(FIXTURES / "gpt_wrapped.pkl.xz"))
    tl = report.analysis.timeline
    life = tl.lifetimes
    cols = _columns(report, 120)
    st = bands.stack(life, cols, report.n_events, 300)
    alloc, free, size = life.alloc_event[st.index], life.free_event[st.index], life.size[st.index]
    assert (np.diff(st.index) > 0).all(), "bands are stacked in allocation order"
    for c, p in enumerate(cols.point.tolist()):
        offset = int(st.base.sum())
        for j in range(len(st.index)):
            alive = alloc[j] < p <= free[j]
            assert alive == (st.first[j] <= c < st.stop[j])
            if alive:
                assert st.bottom[j, c] == offset
                offset += int(size[j])
    # the wrapped trace starts with blocks alive from before it that die inside it: drawn bands too
    assert (life.alloc_event[st.index] < 0).any()


def test_the_largest_allocations_get_the_bands():
    report = _report(_need(FIXTURES / "gpt_foreach.pkl.xz"))
    life = report.analysis.timeline.lifetimes
    cols = _columns(report, 1400)
    first = np.searchsorted(cols.point, life.alloc_event + 1, "left")
    stop = np.searchsorted(cols.point, life.free_event, "right")
    visible = (stop > first) & ~(life.preexisting & (life.free_event >= report.n_events))
    # 12 allocations of 250 MiB (logits and their log-softmax, in every step), 16 of 62.5 MiB, 14 of 32 MiB
    for max_bands, drawn in ((10, 10), (12, 12), (20, 12), (40, 28)):
        st = bands.stack(life, cols, report.n_events, max_bands)
        folded = np.setdiff1d(np.flatnonzero(visible), st.index)
        assert len(st.index) == drawn and st.n_folded == len(folded)
        assert life.size[st.index].min() >= life.size[folded].max()
        if drawn < max_bands:
            # sizes tied with the last one drawn are drawn all or none: steps look alike
            assert life.size[st.index].min() > life.size[folded].max()
            assert drawn + (life.size[folded] == life.size[folded].max()).sum() > max_bands


def test_drawn_bands_are_the_stack():
    report = _report(_need(FIXTURES / "qwen_hf_ckpt_fused.pkl.xz"))
    fig = _plot(FIXTURES / "qwen_hf_ckpt_fused.pkl.xz", bands="vector")  # the outlines an SVG keeps
    st = fig.phasemem_stack
    # what the picture drew adds up, too
    assert np.array_equal(st.total(), report.analysis.timeline.level[st.columns.event])
    assert len(st.columns) > 1000 and st.columns.edges[0] == 0 and st.columns.edges[-1] == report.n_events
    (coll,) = by_gid(fig, "band")
    paths = coll.get_paths()
    assert len(paths) == len(st.index) > 1000
    unit = 2**30
    for j in range(0, len(paths), 97):
        v = paths[j].vertices[:-1]  # the collection closes each outline with its first vertex
        half = len(v) // 2
        # flat top and bottom per column, the band's size apart
        assert np.allclose(v[half:, 1][::-1] - v[:half, 1], st.size[j] / unit)
        assert v[0, 1] == pytest.approx(st.bottom[j, st.first[j]] / unit)
    (base,) = by_gid(fig, "band-base")
    assert base.get_hatch() and len(base.get_paths()) == len(st.base_keys)
    # the tallest thing drawn is the overall peak
    tops = [p.vertices[:, 1].max() for c in fig.axes[0].collections if (c.get_gid() or "").startswith("band")
            for p in c.get_paths()]
    assert max(tops) == pytest.approx(report.peak_bytes / unit, rel=1e-12)
    # not the report's "allocated before recording" (all alive at the first event): only what stayed
    assert "alive from before recording to the end" in legend_texts(fig)
    assert any(t.get_text() == f"alive from before recording to the end: {format_bytes(int(st.base.sum()))}"
               for t in texts(fig))


def test_columns_sample_each_columns_highest_event():
    rng = np.random.default_rng(0)
    n, ncols = 100_003, 997
    delta = rng.integers(-1000, 1000, n).astype(np.int64)
    after = 10**9 + np.cumsum(delta)
    level = np.maximum(after, after - delta)
    reserved = np.maximum.accumulate(level) + 5
    X = np.arange(n + 1, dtype=np.float64)
    cols = bands.columns(X, level, after, reserved, delta, 0, n, ncols)
    assert len(cols.edges) == ncols + 1 and len(cols) == ncols
    first = np.floor(cols.edges[:-1]).astype(int)
    stop = np.append(first[1:], n)
    for k in range(0, ncols, 37):
        seg = slice(first[k], max(stop[k], first[k] + 1))
        assert cols.event[k] == first[k] + np.argmax(level[seg])
        assert cols.level[k] == level[seg].max() and cols.low[k] == after[seg].min()
    assert cols.level.max() == level.max() and cols.reserved.max() == reserved.max()
    # the state sampled is the level's: before a free, after anything else
    assert np.array_equal(cols.point, np.where(delta[cols.event] < 0, cols.event, cols.event + 1))
    # fewer events than columns: every event is its own column
    cols = bands.columns(X, level, after, reserved, delta, 10, 60, ncols)
    assert np.array_equal(cols.edges, np.arange(10, 61)) and np.array_equal(cols.event, np.arange(10, 60))


# -- files ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("ext", ["png", "svg", "pdf"])
def test_every_format_is_written_shared(snapshot, tmp_path, ext):
    out = tmp_path / f"memory.{ext}"
    _report(snapshot).save_png(out)
    data = out.read_bytes()
    assert len(data) > 5000
    if ext == "png":
        assert png_size(out) == (1600, 900)
    elif ext == "svg":
        root = ElementTree.fromstring(data)
        assert root.tag.endswith("svg")
        # matplotlib sizes an SVG in points: 1600 px at 100 dpi is 1152 pt
        assert root.get("width") == "1152pt" and root.get("height") == "648pt"
    else:
        assert data.startswith(b"%PDF-") and pdf_page(out) == (1152, 648)
    assert [p.name for p in tmp_path.iterdir()] == [out.name], "a temporary file was left behind"
    # written through a private temporary file, but readable like any new file
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~mask


@pytest.mark.parametrize("size,dpi", [((1600, 900), 100), ((1234, 567), 72), ((800, 450), 150), ((480, 270), 97)])
def test_png_has_exactly_the_pixels_asked_for(tmp_path, size, dpi):
    out = tmp_path / "m.png"
    _report(_need(RECORDED[0])).save_png(out, size=size, dpi=dpi)
    assert png_size(out) == size


def test_vector_formats_have_the_size_asked_for(tmp_path):
    report = _report(_need(RECORDED[0]))
    report.save_png(tmp_path / "m.svg", size=(1234, 567), dpi=72, steps="1")
    root = ElementTree.fromstring((tmp_path / "m.svg").read_bytes())
    assert (root.get("width"), root.get("height")) == ("1234pt", "567pt")
    report.save_png(tmp_path / "m.pdf", size=(1000, 500), dpi=125)
    assert pdf_page(tmp_path / "m.pdf") == pytest.approx((1000 / 125 * 72, 500 / 125 * 72))


def test_bad_extension_and_failed_drawing_leave_the_old_file(tmp_path):
    report = _report(_need(RECORDED[0]))
    with pytest.raises(PhasememError, match=r"\.png, \.svg or \.pdf"):
        report.save_png(tmp_path / "memory.jpg")
    old = tmp_path / "memory.png"
    old.write_bytes(b"the old picture")
    for bad in (dict(size=(10, 10)), dict(steps="5-3"), dict(max_bands=-1), dict(color="rainbow")):
        with pytest.raises(ValueError):
            report.save_png(old, **bad)
    assert old.read_bytes() == b"the old picture"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.png"]


# -- what is drawn --------------------------------------------------------------------------------


def test_plot_returns_a_figure_with_what_the_report_says_shared(snapshot):
    report = _report(snapshot)
    fig = _plot(snapshot)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    words = [t.get_text() for t in texts(fig)]
    # title: device, overall peak, events, steps
    title = " ".join(t.get_text() for t in fig.texts)
    assert report.device in title and format_bytes(report.peak_bytes) in title
    assert f"{report.n_events:,} events" in title and f"{len(report.steps)} steps" in title
    assert ("phases inferred" in title) == ("inferred" in report.sources.values())
    # every step numbered, the overall peak named with its size
    assert [w for w in words if w.startswith("step ")] == [f"step {s.number}" for s in report.steps]
    assert f"peak {format_bytes(report.peak_bytes)}" in words
    # one strip cell per phase occurrence, 'other' (no phase known) too
    assert strip_cells(fig) == len(report.label_runs())
    assert ax.get_ylabel() == "allocated memory (GiB)"
    assert ax.get_xlim() == (0, report.n_events)
    # colour by category: the legend names the categories drawn
    assert {"activation", "gradient"} <= set(legend_texts(fig))
    assert overlaps(fig) == []


def test_phase_peaks_are_labeled_where_they_fit_shared(snapshot):
    report = _report(snapshot)
    words = {t.get_text() for t in texts(_plot(snapshot))}
    # the biggest phase peak of the last step sits in a wide phase on every one of these traces
    last = report.steps[-1]
    widest = max((p for n, p in last.phases.items() if n != "other" and p.n_events), key=lambda p: p.n_events)
    assert format_bytes(widest.peak_bytes) in words or widest.peak_event == report.peak_event or any(
        p.peak_event == widest.peak_event for p in report.patterns)


def _callouts(fig):
    return by_gid(fig, "pattern-callout")


def _marker_points(fig):
    return np.concatenate([c.get_offsets() for c in by_gid(fig, "pattern-marker")] or [np.zeros((0, 2))])


@pytest.mark.parametrize("path", SNAPSHOTS + RECORDED, ids=lambda p: p.name.split(".")[0])
def test_every_pattern_is_called_out_or_marked(path):
    report = _report(_need(path))
    fig = _plot(path)
    assert report.patterns
    calls = _callouts(fig)
    points = _marker_points(fig)
    # one marker at every occurrence's peak (the named ones at their arrow's tip), none left out at 3 steps
    assert len(points) == len(report.patterns) and fig.phasemem_callouts.skipped == 0
    X = np.arange(report.n_events + 1)
    want = sorted(((X[p.peak_event] + X[p.peak_event + 1]) / 2, report.analysis.timeline.level[p.peak_event] / 2**30)
                  for p in report.patterns)
    assert np.allclose(sorted(map(tuple, points)), want)
    # at most one occurrence per kind named in full, "<kind> <size>", its arrow at the peak
    named = [c.get_text() for c in calls]
    kinds = {p.kind for p in report.patterns}
    assert len(named) == len(set(n.split()[0] for n in named)) and len(named) >= min(len(kinds), 3)
    for c in calls:
        kind, size = c.get_text().split(" ", 1)
        match = [p for p in report.patterns if p.kind == kind and format_bytes(p.bytes) == size
                 and c.xy == pytest.approx(((X[p.peak_event] + X[p.peak_event + 1]) / 2,
                                            report.analysis.timeline.level[p.peak_event] / 2**30))]
        assert match, c.get_text()
    assert overlaps(fig) == []


def test_phases_without_events_get_a_tick():
    report = _report(_need(FIXTURES / "qwen_hf_ckpt_fused.pkl.xz"))
    silent = [(st.number, n) for st in report.steps for n, p in st.phases.items() if p.n_events == 0 and p.at_event is not None]
    assert ("optimizer" in {n for _, n in silent}) and len(silent) >= 2
    (ticks,) = by_gid(_plot(FIXTURES / "qwen_hf_ckpt_fused.pkl.xz"), "phase-tick")
    assert len(ticks.get_segments()) == len(silent)
    assert "optimizer" in legend_texts(_plot(FIXTURES / "qwen_hf_ckpt_fused.pkl.xz"))


def test_drawing_leaves_the_users_matplotlib_alone():
    import matplotlib

    backend = matplotlib.get_backend()
    had_pyplot = "matplotlib.pyplot" in sys.modules
    _report(_need(RECORDED[0])).plot(steps="1")
    assert matplotlib.get_backend() == backend
    assert ("matplotlib.pyplot" in sys.modules) == had_pyplot


# -- options --------------------------------------------------------------------------------------


def test_steps_zoom_to_those_steps_events():
    report = _report(_need(FIXTURES / "gpt_foreach.pkl.xz"))
    s0, s1, s2 = report.steps
    for spec, shown in [("1", [s1]), (1, [s1]), ([1], [s1]), ("1-2", [s1, s2]), ("1-", [s1, s2]), ("-1", [s0, s1]),
                        (range(0, 2), [s0, s1]), (" 0 - 2 ", [s0, s1, s2])]:
        fig = report.plot(steps=spec)
        assert fig.axes[0].get_xlim() == (shown[0].start_event, shown[-1].end_event + 1), spec
        steps = [t.get_text() for t in texts(fig) if t.get_text().startswith("step ")]
        assert steps == [f"step {s.number}" for s in shown]
    fig = report.plot(events=(100, 400))
    assert fig.axes[0].get_xlim() == (100, 400)


@pytest.mark.parametrize("bad", ["2-1", "x", "1-x", "-", "", "1--2", "9", "5-", [99], "1,2"])
def test_bad_step_ranges_are_one_line_errors(bad):
    report = _report(_need(FIXTURES / "gpt_foreach.pkl.xz"))
    with pytest.raises(PhasememError) as e:
        report.plot(steps=bad)
    assert isinstance(e.value, ValueError)  # what plot() raised for bad steps before, still
    assert "\n" not in str(e.value) and "steps" in str(e.value)


def test_time_axis_is_in_microseconds():
    report = _report(_need(FIXTURES / "gpt_foreach.pkl.xz"))
    t = report.analysis.trace.time_us
    st = report.steps[1]
    fig = report.plot(by="time", steps="1")
    assert fig.axes[0].get_xlim() == (t[st.start_event] - t[0], t[st.end_event + 1] - t[0])
    assert "time since the first event" in fig.axes[0].get_xlabel()
    fig = report.plot(by="time")
    st = fig.phasemem_stack
    assert np.array_equal(st.total(), report.analysis.timeline.level[st.columns.event])
    lo, hi = fig.axes[0].get_xlim()
    assert lo == 0 and t[-1] - t[0] < hi < 1.01 * (t[-1] - t[0]) + 10
    assert fig.axes[0].get_xlabel() == "time since the first event (ms)"
    with pytest.raises(ValueError):
        report.plot(by="pixels")


def test_max_bands_folds_the_rest():
    report = _report(_need(FIXTURES / "gpt_foreach.pkl.xz"))
    fig = report.plot(max_bands=30, bands="vector")
    st = fig.phasemem_stack
    (coll,) = by_gid(fig, "band")
    assert 0 < len(coll.get_paths()) == len(st.index) <= 30
    assert by_gid(fig, "band-folded") and st.n_folded > 500
    assert f"{st.n_folded:,} smaller allocations, summed, by category (dotted)" in legend_texts(fig)
    # "smaller" is true: every folded allocation visible at a column is smaller than every drawn one
    assert not st.split and _folded_sizes(report, st).max() < st.size.min()
    # nothing drawn one by one at all: everything made during the trace is in the one band on top
    fig = report.plot(max_bands=0)
    assert not by_gid(fig, "band") and not by_gid(fig, "band-raster") and fig.phasemem_stack.folded.max() > 0


def _folded_mask(report, st):
    life = report.analysis.timeline.lifetimes
    P = st.columns.point
    first = np.searchsorted(P, life.alloc_event + 1, "left")
    stop = np.searchsorted(P, life.free_event, "right")
    constant = (life.alloc_event < 0) & (life.free_event >= report.n_events)
    folded = (stop > first) & ~constant
    folded[st.index] = False
    return folded


def _folded_sizes(report, st):
    return report.analysis.timeline.lifetimes.size[_folded_mask(report, st)]


def test_the_summed_band_is_split_by_category_with_the_bytes_alive_at_each_column():
    report = _report(_need(FIXTURES / "gpt_foreach.pkl.xz"))
    fig = report.plot(max_bands=30)
    st = fig.phasemem_stack
    life = report.analysis.timeline.lifetimes
    codes = np.asarray(report.analysis.categories.codes)
    folded = _folded_mask(report, st)
    # alive at a column's state p when alloc < p <= free, summed per category: by a loop, not bands.stack
    P = st.columns.point
    for key, part in zip(st.folded_keys.tolist(), st.folded_parts):
        mine = np.flatnonzero(folded & (codes == key))
        want = [int(life.size[mine][(life.alloc_event[mine] < p) & (p <= life.free_event[mine])].sum()) for p in P]
        assert part.tolist() == want
    assert set(st.folded_keys.tolist()) == set(codes[folded].tolist()) and len(st.folded_keys) > 2
    assert np.array_equal(st.folded_parts.sum(axis=0), st.folded)
    (coll,) = by_gid(fig, "band-folded")
    assert len(coll.get_paths()) == int((st.folded_parts > 0).any(axis=1).sum()) and coll.get_hatch() == "...."
    # other colourings keep one grey summed band
    st = report.plot(max_bands=30, color="stack").phasemem_stack
    assert st.folded_keys.tolist() == [0] and np.array_equal(st.folded_parts[0], st.folded)


def test_a_split_size_class_is_not_called_smaller():
    # One band and many steps: the largest size has more allocations than bands, so only its
    # earliest is drawn and the same-size rest is folded; the legend must not call them smaller.
    report = _report(_need(FIXTURES / "gpt_foreach.pkl.xz"))
    fig = report.plot(max_bands=1)
    st = fig.phasemem_stack
    assert st.split and len(st.index) == 1
    assert _folded_sizes(report, st).max() == st.size[0]
    texts = legend_texts(fig)
    assert not any("smaller allocations" in t for t in texts)
    assert any(t.startswith(f"{st.n_folded:,} allocations not drawn one by one") for t in texts)


def test_color_modes_have_their_legends():
    path = _need(FIXTURES / "gpt_foreach.pkl.xz")
    report = _report(path)
    names = {c.replace("_", " ") for c in CATEGORIES}
    cat = legend_texts(_plot(path))
    assert {"activation", "gradient", "optimizer state", "parameter"} <= set(cat)
    # the band legend comes first: categories, then the base from before recording
    first = cat[:cat.index("alive from before recording to the end")]
    assert first and set(first) <= names
    stack = legend_texts(_plot(path, color="stack"))
    # the call sites holding the most bytes are named, frameless (autograd thread) allocations grey
    assert any("adam.py" in s for s in stack) and "no Python frames (autograd thread)" in stack
    assert not names & set(stack)
    phase = legend_texts(_plot(path, color="phase"))
    assert {"made in forward", "made in backward", "made in optimizer"} <= set(phase)
    # a call site's colour is the same in every step: the bands one site made in step 1 and in
    # step 2 have the same colours (up to the shades that tell neighbours apart)
    fig = _plot(path, color="stack", bands="vector")
    st = fig.phasemem_stack
    (coll,) = by_gid(fig, "band")
    alloc = report.analysis.timeline.lifetimes.alloc_event[st.index]
    sid = report.analysis.trace.stack[alloc]
    step = report.analysis.step_of[alloc]
    colours = np.round(coll.get_facecolors()[:, :3], 3)
    shared = set(sid[(step == 1) & (sid >= 0)].tolist()) & set(sid[(step == 2) & (sid >= 0)].tolist())
    assert len(shared) >= 5
    for s in shared:
        seen = {tuple(c) for c in colours[sid == s]}
        assert len(seen) <= len(picture_colours._SHADES_STACK)
    frameless = colours[sid < 0]
    assert len(frameless) and np.ptp(frameless, axis=1).max() < 0.02  # grey


# -- many steps, many events ----------------------------------------------------------------------


def test_fifty_steps_render_without_overlapping_text(tmp_path):
    report = _fifty_steps()
    assert len(report.steps) == 50
    assert all(s.complete for s in report.steps)
    fig = report.plot()
    assert overlaps(fig) == []
    # every occurrence still shaded; numbers where they fit, never on top of each other
    runs = report.label_runs()
    assert strip_cells(fig) == len(runs) >= 150
    numbered = [t.get_text() for t in texts(fig) if t.get_text().isdigit() or t.get_text().startswith("step")]
    assert len(numbered) >= 25
    assert {"forward", "backward", "zero_grad"} <= set(legend_texts(fig))
    # every pattern: one kind named once, every occurrence marked
    assert len(_marker_points(fig)) == len(report.patterns) >= 250
    assert 3 <= len(_callouts(fig)) <= len({p.kind for p in report.patterns})
    # ~124,000 events, yet every band and line has a few vertices per pixel column, not one per event
    ax = fig.axes[0]
    biggest = max(len(p.vertices) for c in ax.collections for p in c.get_paths())
    biggest = max([biggest] + [len(line.get_xdata()) for line in ax.lines])
    assert report.n_events > 100_000 and biggest <= 4 * 1600
    out = tmp_path / "fifty.png"
    report.save_png(out)
    assert png_size(out) == (1600, 900)


def test_picture_of_inferred_phases_says_so():
    """A picture passed on without its report must still say its phases were inferred."""
    from helpers.paths import FIXTURES
    from helpers.snapshots import load_snapshot

    snap = load_snapshot(FIXTURES / "gpt_foreach.pkl.xz")
    snap["external_annotations"] = []
    fig = phasemem.analyze(snap).plot()
    assert "phases inferred (no markers)" in " ".join(t.get_text() for t in fig.texts)


def test_pattern_markers_are_filled_shapes():
    """Markers are drawn white with a dark edge; an unfilled one ("1", "+") has no face and makes
    matplotlib warn on every picture that shows it."""
    from matplotlib.markers import MarkerStyle

    from phasemem.analysis.patterns import KINDS

    markers = [k.marker for k in KINDS]
    assert all(MarkerStyle(m).is_filled() for m in markers)
    assert len(set(markers)) == len(markers)


def test_unsure_phases_are_hatched_and_questioned():
    """Phases inferred without frames below UNSURE (the loss, 0.51; the optimizer, 0.97 since the third
    frameless round, is not) look different and say so."""
    from phasemem.reporters.picture.colours import UNSURE

    snap = load_snapshot(FIXTURES / "gpt_foreach.pkl.xz")
    snap["external_annotations"] = []
    snap.pop("phasemem", None)
    for e in snap["device_traces"][0]:
        e["frames"] = []
    report = phasemem.analyze(snap)
    unsure = {p.name for p in report.phases.values() if p.source == "inferred" and p.confidence < UNSURE}
    assert "loss" in unsure and "optimizer" not in unsure
    fig = report.plot()
    hatched = by_gid(fig, "phase-unsure")
    runs = [r for r in report.label_runs() if r[2] in unsure]
    assert len(hatched) == 1 and len(hatched[0].get_paths()) == len(runs)
    assert any(t.startswith("loss? (") for t in legend_texts(fig))
    assert not any(t.startswith("optimizer? (") for t in legend_texts(fig))


def test_too_small_a_picture_is_refused():
    report = phasemem.analyze(load_snapshot(FIXTURES / "gpt_foreach.pkl.xz"))
    with pytest.raises(ValueError, match="at least 480x270"):
        report.plot(size=(100, 100))


def test_out_of_memory_is_marked_in_the_picture():
    r = phasemem.analyze(wild_path("constructorsun_codeloc"), device=1)
    fig = r.plot()
    lines = [a for a in fig.findobj() if a.get_gid() == "oom"]
    (o,) = [o for o in r.ooms if o.device == r.device]
    assert len(lines) == 1 and lines[0].get_xdata()[0] == o.event
    assert any(t.get_text().startswith("OUT OF MEMORY: asked ") for t in fig.axes[0].texts)
