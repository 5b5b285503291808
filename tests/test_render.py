"""The picture: files in every format at the exact pixel size, what is drawn, and no text on text."""
from __future__ import annotations

import importlib.util
import lzma
import os
import pickle
import stat
import struct
import sys
from functools import lru_cache
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

import phasemem
from phasemem import render
from phasemem.errors import PhasememError
from phasemem.units import format_bytes

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "gpu-snapshots"
SNAPSHOTS = sorted(SHARED.glob("*.pkl.xz"))


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
    return phasemem.analyze(path, marker_prefix="gt::")


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


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def texts(fig: Figure) -> list[Text]:
    """Every visible piece of text drawn on the figure except tick labels."""
    ticks = {id(t) for ax in fig.axes for t in ax.get_xticklabels() + ax.get_yticklabels()}
    out = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and id(t) not in ticks]
    return out


def overlaps(fig: Figure) -> list[tuple[str, str]]:
    renderer = fig.canvas.get_renderer()
    fig.draw_without_rendering()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts(fig)]
    bad = []
    for i, (ta, a) in enumerate(boxes):
        for tb, b in boxes[i + 1:]:
            # touching is fine; a shared area of more than a pixel each way is not
            if min(a.x1, b.x1) - max(a.x0, b.x0) > 1 and min(a.y1, b.y1) - max(a.y0, b.y0) > 1:
                bad.append((ta, tb))
    return bad


def strip_cells(fig: Figure) -> int:
    from matplotlib.collections import PolyCollection

    polys = [c for c in fig.axes[0].collections if isinstance(c, PolyCollection) and c.get_zorder() == 1]
    return sum(len(c.get_paths()) for c in polys)


# -- real snapshots -------------------------------------------------------------------------------


@pytest.mark.parametrize("ext", ["png", "svg", "pdf"])
def test_every_format_is_written(snapshot, tmp_path, ext):
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
        assert data.startswith(b"%PDF-")
    assert [p.name for p in tmp_path.iterdir()] == [out.name], "a temporary file was left behind"
    # written through a private temporary file, but readable like any new file
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~mask


@pytest.mark.parametrize("size,dpi", [((1600, 900), 100), ((1234, 567), 72), ((800, 450), 150), ((333, 201), 97)])
def test_png_has_exactly_the_pixels_asked_for(tmp_path, size, dpi):
    if not SNAPSHOTS:
        pytest.skip(f"no real GPU snapshots at {SHARED}")
    out = tmp_path / "m.png"
    _report(SNAPSHOTS[0]).save_png(out, size=size, dpi=dpi)
    assert png_size(out) == size


def test_plot_returns_a_figure_with_what_the_report_says(snapshot):
    report = _report(snapshot)
    fig = report.plot()
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    words = [t.get_text() for t in texts(fig)]
    # title: device, overall peak, events, steps
    title = " ".join(t.get_text() for t in fig.texts)
    assert report.device in title and format_bytes(report.peak_bytes) in title
    assert f"{report.n_events:,} events" in title and f"{len(report.steps)} steps" in title
    # every step numbered, the overall peak named with its size
    assert [w for w in words if w.startswith("step ")] == [f"step {s.number}" for s in report.steps]
    assert f"peak {format_bytes(report.peak_bytes)}" in words
    # one strip cell per shaded phase occurrence (everything but 'other')
    runs = [r for r in report.label_runs() if r[2] != "other"]
    assert strip_cells(fig) == len(runs)
    # the y axis unit comes from the largest value; these are all GiB-sized traces
    assert ax.get_ylabel() == "allocated memory (GiB)"
    assert ax.get_xlim() == (0, report.n_events)
    # the curve keeps the true maximum (no spike lost to the per-column reduction)
    tops = [p.vertices[:, 1].max() for c in ax.collections for p in c.get_paths() if len(p.vertices)]
    assert max(tops) == pytest.approx(report.timeline.active_after.max() / 2**30, rel=1e-9) or \
        max(tops) == pytest.approx(report.timeline.reserved_after.max() / 2**30, rel=1e-9)
    assert overlaps(fig) == []


def test_phase_peaks_are_labeled_where_they_fit(snapshot):
    report = _report(snapshot)
    fig = report.plot()
    words = {t.get_text() for t in texts(fig)}
    # the biggest phase peak of the last step sits in a wide phase on every one of these traces
    last = report.steps[-1]
    widest = max((p for n, p in last.phases.items() if n != "other" and p.n_events), key=lambda p: p.n_events)
    assert format_bytes(widest.peak_bytes) in words or widest.peak_event == report.peak_event


def test_drawing_leaves_the_users_matplotlib_alone(snapshot):
    import matplotlib

    backend = matplotlib.get_backend()
    had_pyplot = "matplotlib.pyplot" in sys.modules
    _report(snapshot).plot()
    assert matplotlib.get_backend() == backend
    assert ("matplotlib.pyplot" in sys.modules) == had_pyplot


def test_zoom_on_one_step_and_time_axis(snapshot):
    report = _report(snapshot)
    st = report.steps[1]
    fig = report.plot(steps=[st.number])
    assert fig.axes[0].get_xlim() == (st.start_event, st.end_event + 1)
    assert [t.get_text() for t in texts(fig) if t.get_text().startswith("step ")] == [f"step {st.number}"]
    fig = report.plot(by="time")
    assert "time" in fig.axes[0].get_xlabel()
    with pytest.raises(ValueError, match="steps"):
        report.plot(steps=[999])
    with pytest.raises(ValueError):
        report.plot(by="pixels")


def test_bad_extension_and_failed_drawing_leave_the_old_file(tmp_path):
    if not SNAPSHOTS:
        pytest.skip(f"no real GPU snapshots at {SHARED}")
    report = _report(SNAPSHOTS[0])
    with pytest.raises(PhasememError, match=r"\.png, \.svg or \.pdf"):
        report.save_png(tmp_path / "memory.jpg")
    old = tmp_path / "memory.png"
    old.write_bytes(b"the old picture")
    with pytest.raises(ValueError):
        report.save_png(old, size=(10, 10))
    assert old.read_bytes() == b"the old picture"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.png"]


# -- many steps, many events ----------------------------------------------------------------------


def test_fifty_steps_render_without_overlapping_text(tmp_path):
    report = _fifty_steps()
    assert len(report.steps) == 50
    assert all(s.complete for s in report.steps)
    fig = report.plot()
    assert overlaps(fig) == []
    # every occurrence still shaded; numbers where they fit, never on top of each other
    runs = [r for r in report.label_runs() if r[2] != "other"]
    assert strip_cells(fig) == len(runs) >= 150
    numbered = [t.get_text() for t in texts(fig) if t.get_text().isdigit() or t.get_text().startswith("step")]
    assert len(numbered) >= 25
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"forward", "backward", "zero_grad"} <= set(legend)
    # ~124,000 events, yet the curve has a few vertices per pixel column, not one per event
    ax = fig.axes[0]
    biggest = max(len(p.vertices) for c in ax.collections for p in c.get_paths())
    biggest = max([biggest] + [len(line.get_xdata()) for line in ax.lines])
    assert report.n_events > 100_000 and biggest < 4 * 1600
    out = tmp_path / "fifty.png"
    report.save_png(out)
    assert png_size(out) == (1600, 900)


def test_envelope_equals_per_column_min_and_max():
    rng = np.random.default_rng(0)
    n, cols = 100_003, 997
    after = np.cumsum(rng.integers(-1000, 1000, n)).astype(np.int64) + 10**9
    reserved = np.maximum.accumulate(after) + 5
    X = np.arange(n + 1, dtype=np.float64)
    edges, lo, hi, res = render._envelope(X, after, reserved, 0, n, cols)
    assert len(edges) == cols + 1 and len(hi) == cols
    first = np.floor(edges[:-1]).astype(int)
    stop = np.append(first[1:], n)
    for k in range(0, cols, 37):
        seg = after[first[k]:max(stop[k], first[k] + 1)]
        assert (lo[k], hi[k]) == (seg.min(), seg.max())
    assert hi.max() == after.max() and lo.min() == after.min() and res.max() == reserved.max()
    # fewer events than columns: every event is drawn as it is
    edges, lo, hi, _ = render._envelope(X[:51], after[:50], reserved[:50], 0, 50, cols)
    assert np.array_equal(edges, np.arange(51)) and np.array_equal(hi, after[:50]) and np.array_equal(lo, hi)
