"""The allocation bands and the phase shading drawn as images (what a PNG gets) are the picture the
polygons drew: compared pixel by pixel on real traces; SVG and PDF keep the polygons below the cap."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

import phasemem
from helpers.analyses import analyzed
from helpers.paths import ROOT
from helpers.snapshots import load_snapshot
from phasemem.reporters.picture import bands
from phasemem.reporters.picture import draw as render

FIXTURES = ROOT / "fixtures"
SHARED = ROOT.parent / "shared" / "gpu-snapshots"

# A pixel differs when a channel is more than this apart (antialiasing of what lies over the bands
# would move by a few units where the layers under it change); at most this share of them may.
CHANNEL_TOLERANCE = 8
MAX_DIFFERING_SHARE = 0.001

CASES = [
    (FIXTURES / "gpt_foreach.pkl.xz", {}),
    (FIXTURES / "gpt_wrapped.pkl.xz", {"color": "phase", "size": (1000, 1000)}),  # blocks from before recording freed
    (FIXTURES / "qwen_hf_ckpt_fused.pkl.xz", {"steps": "2", "dpi": 150, "size": (523, 311)}),
    (FIXTURES / "resnet_sgd.pkl.xz", {"by": "time", "color": "stack"}),
    (FIXTURES / "gpt_foreach.pkl.xz", {"events": (2000, 2200)}),  # fewer events than columns: wide columns
    (FIXTURES / "gpt_foreach.pkl.xz", {"max_bands": 30}),
    (SHARED / "gpt_adamw_foreach.pkl.xz", {}),
    (SHARED / "mlp_fp16_scaler.pkl.xz", {"size": (700, 400)}),
    ("unsure", {}),  # hatched strip cells over the strip image
    ("many steps", {}),  # 2,000 phases on 1,500 pixels
]


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is not there")
    return path


@lru_cache(maxsize=None)
def _report(path: Path):
    return analyzed(path, "file", marker_prefix="gt::" if path.parent == SHARED else "phasemem::")


@lru_cache(maxsize=None)
def _unsure_report():
    """gpt_foreach without markers or frames: the optimizer is inferred below UNSURE, hatched."""
    snap = load_snapshot(_need(FIXTURES / "gpt_foreach.pkl.xz"))
    snap["external_annotations"] = []
    snap.pop("phasemem", None)
    for e in snap["device_traces"][0]:
        e["frames"] = []
    return phasemem.analyze(snap)


@lru_cache(maxsize=None)
def _many_steps_report():
    """gpt_ckpt_fused_seedlike with steps 1-2 repeated: 400 steps, ~1M events, most phases < 1 pixel."""
    import importlib.util

    path = _need(SHARED / "gpt_ckpt_fused_seedlike.pkl.xz")
    spec = importlib.util.spec_from_file_location("bench_analyze", ROOT / "benchmarks" / "bench_analyze.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return phasemem.analyze(mod.replicate_steps(mod.read_shared(path), 200), marker_prefix="gt::")


def _pixels(fig) -> np.ndarray:
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(np.int16)


@pytest.mark.parametrize("path,options", CASES, ids=lambda v: (v.name.split(".")[0] if isinstance(v, Path) else v)
                         if not isinstance(v, dict) else ",".join(f"{k}={v[k]}" for k in v) or "default")
def test_the_raster_is_the_vector_picture(path, options):
    report = {"unsure": _unsure_report, "many steps": _many_steps_report}.get(path, lambda: _report(_need(path)))()
    vector = report.plot(bands="vector", **options)
    raster = report.plot(bands="raster", **options)
    assert not [a for a in raster.findobj() if a.get_gid() == "band"], "the raster figure has no band outlines"
    images = {im.get_gid(): im for im in raster.axes[0].images}
    assert {"band-raster", "phase-shading", "phase-strip"} <= set(images) and not vector.axes[0].images
    w, h = options.get("size", (1600, 900))
    a, b = _pixels(vector), _pixels(raster)
    assert a.shape == b.shape == (h, w, 3)
    differ = np.abs(a - b).max(axis=2) > CHANNEL_TOLERANCE
    assert differ.mean() <= MAX_DIFFERING_SHARE, f"{int(differ.sum())} of {differ.size} pixels differ"
    # and the comparison can fail: without an image, its pixels are missing
    for gid in ("band-raster", "phase-shading", "phase-strip"):
        images[gid].remove()
        gone = np.abs(a - _pixels(raster)).max(axis=2) > CHANNEL_TOLERANCE
        assert gone.mean() > 5 * MAX_DIFFERING_SHARE, gid
        raster.axes[0].add_image(images[gid])


def test_each_pixel_shows_the_band_over_its_centre():
    """Recomputed from the stack with a loop over columns, not with bands.raster."""
    report = _report(_need(FIXTURES / "gpt_wrapped.pkl.xz"))
    cols = bands.columns(bands.x_values(report, "event"), report.analysis.timeline.level, report.analysis.timeline.active_after,
                         report.analysis.timeline.reserved_after, report.analysis.timeline.delta, 0, report.n_events, 90)
    st = bands.stack(report.analysis.timeline.lifetimes, cols, report.n_events, 200)
    rows = np.linspace(0, report.peak_bytes * 1.05, 64)
    column_of = np.repeat(np.arange(len(cols)), 3)
    column_of[:2] = -1
    got = bands.raster(st, column_of, rows)
    assert got.shape == (64, len(column_of))
    bottom = st.bottom
    for x, c in enumerate(column_of.tolist()):
        for k, v in enumerate(rows.tolist()):
            want = -1
            if c >= 0:
                for j in range(len(st.index)):
                    if st.first[j] <= c < st.stop[j] and bottom[j, c] <= v < bottom[j, c] + st.size[j]:
                        want = j
            assert got[k, x] == want, (x, k)
    assert (got >= 0).sum() > 1000


def test_sparse_offsets_and_vertex_count():
    report = _report(_need(FIXTURES / "gpt_foreach.pkl.xz"))
    fig = report.plot(bands="vector")
    st = fig.phasemem_stack
    band, column = st.cells()
    assert len(band) == int(st.alive().sum()) == len(st.offsets)
    assert np.array_equal(st.bottom[st.alive()], st.offsets[np.lexsort((column, band))])
    (coll,) = [c for c in fig.axes[0].collections if c.get_gid() == "band"]
    assert bands.vertex_count(st) == sum(len(p.vertices) for p in coll.get_paths())


def test_save_draws_a_png_raster_and_svg_pdf_outlines_below_the_cap(tmp_path, monkeypatch):
    report = _report(_need(FIXTURES / "gpt_foreach.pkl.xz"))
    drawn = []
    real = render.plot

    def spy(*args, **options):
        fig = real(*args, **options)
        drawn.append(options.get("bands"))
        return fig

    monkeypatch.setattr(render, "plot", spy)
    report.save_png(tmp_path / "m.png")
    render.save(report, tmp_path / "m.svg")
    assert drawn == ["raster", "auto"]
    svg = (tmp_path / "m.svg").read_text()
    assert "<image" not in svg and 'id="band"' in svg
    monkeypatch.setattr(render, "VECTOR_BANDS_CAP", 100)
    render.save(report, tmp_path / "big.svg")
    render.save(report, tmp_path / "big.pdf")
    svg = (tmp_path / "big.svg").read_text()
    assert "<image" in svg and 'id="band"' not in svg
    assert (tmp_path / "big.pdf").read_bytes()[:5] == b"%PDF-"


def test_another_dpi_resamples_the_image(tmp_path):
    """savefig at a dpi other than the figure's: the image is resampled, the picture keeps its bands."""
    report = _report(_need(FIXTURES / "gpt_foreach.pkl.xz"))
    fig = report.plot(size=(800, 450))
    fig.savefig(tmp_path / "x2.png", dpi=200)
    from matplotlib.image import imread

    img = imread(tmp_path / "x2.png")
    assert img.shape[:2] == (900, 1600)
    small = _pixels(fig)
    # the bands' colours are in both: a category colour (activation blue, #4c72b0, and its shades) covers a share of each
    band_px = lambda px: (np.abs(px[..., :3].astype(float) - [76, 114, 176]).max(axis=-1) < 60).mean()  # noqa: E731
    assert band_px(small) > 0.01 and band_px((img[..., :3] * 255).round()) > 0.01


def test_bands_option_is_checked():
    report = _report(_need(FIXTURES / "gpt_foreach.pkl.xz"))
    with pytest.raises(ValueError, match="bands="):
        report.plot(bands="svg")
