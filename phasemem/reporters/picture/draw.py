"""The labeled picture: every allocation as a band stacked over the trace, each step's phases
shaded and named, every recognised pattern called out, peaks marked.

matplotlib is imported here, and this module only when a picture is asked for
(reporters/picture/__init__.py); how the picture stays fixed-size and cheap at any trace length:
docs/picture.md, "How the picture is drawn"."""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from matplotlib import colors as mcolors
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from ...analysis.spans import phase_runs
from ...errors import PhasememError
from ...output import atomic_write, check_picture_size
from ...steps import StepsError, parse_steps
from ...units import axis_unit, format_bytes
from ...vocab import CATEGORIES, PHASE_COLORS
from . import bands as _bands
from . import labels as _labels
from . import peakbar as _peakbar
from . import pixels as _pixels
from .chrome import (
    _MIN_STEP_DOTS_PX,
    _axes_style,
    _legends,
    _mark_handles,
    _oom_marks,
    _phase_ticks,
    _shade_phases,
    _step_marks,
    _step_px,
    _title,
)
from .colours import _CURVE, _RESERVED, COLOR_MODES, _band_colors, _shade, _unsure
from .labels import CALLOUT_PT, PEAK_PT, STRIP_PT
from .live import plot_live
from .pattern_table import PatternTable

_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}

#: An SVG or PDF draws the allocation bands as outlines up to this many vertices (``bands.vertex_count``),
#: as one image above it. An SVG spends ~25 bytes a vertex: gpt_adamw_foreach's full picture has
#: 119,973 (3.2 MB of SVG; 0.23 MB with the image), the other real H200 traces 15k-45k, a 1M-event
#: stretched trace 10k; so every real trace keeps its outlines and no SVG passes ~5 MB for its bands.
VECTOR_BANDS_CAP = 200_000

BAND_DRAWINGS = ("raster", "vector", "auto")

#: Height of the phase strip at the axes' top, in strip font sizes.
STRIP_EM = 1.9
#: The values keep at least this share of the axes' height, however much room the labels above ask.
MIN_VALUES_SHARE = 0.5
#: Pixels the callouts and peak labels keep under the phase strip.
CEILING_AIR_PX = 2
#: Headroom above the highest value, in pixels besides the texts: over the overall peak's label (with its
#: lift), and per row of callouts.
PEAK_ROOM_AIR_PX, CALLOUT_ROW_AIR_PX = 10, 8
#: The hatched base band's colour, shaded this much (``colours._shade``).
BASE_SHADE = 0.45
#: The base band's label: pixels of air it needs beside it (and keeps from the axes' left) and above and
#: below it in all; its box's opacity.
BASE_LABEL_AIR_X_PX, BASE_LABEL_AIR_Y_PX, BASE_LABEL_ALPHA = 6, 4, 0.8
#: Width of the allocated and the reserved lines.
CURVE_LW = 0.9


def plot(report, *, size=(1600, 900), dpi=100, by="event", steps=None, events=None, max_bands=2000,
         color="category", bands="raster") -> Figure:
    """The labeled memory picture of a report as a matplotlib Figure.

    ``size``: the output in pixels (width, height). ``by``: ``"event"`` (x = position in the
    allocator trace, as memory_viz numbers events) or ``"time"`` (µs since the first event).
    ``steps``: draw only those steps (``Step.number``): ``3``, ``"2-4"``, ``"2-"``, ``range(2, 5)``.
    ``events``: draw only events ``(first, stop)``. ``max_bands``: how many of the largest
    allocations are drawn as bands of their own; the rest are summed into one band on top.
    ``color``: ``"category"`` (parameter, gradient, activation, ...), ``"stack"`` (call site:
    one colour per allocation site, the same every step) or ``"phase"`` (the phase that made it).
    ``bands``: the drawn allocations and the phase shading as images of the axes' pixels
    (``"raster"``, what a PNG needs), as one outline each (``"vector"``), or outlines up to
    ``VECTOR_BANDS_CAP`` vertices of bands and images above (``"auto"``, what ``save`` uses for SVG
    and PDF). The base and the summed band on top are outlines (hatched) in every case.

    What was drawn is kept on the figure: ``fig.phasemem_stack`` (the ``bands.Stack``: which
    allocations got bands, their offsets per column, the summed rest), ``fig.phasemem_callouts``
    (which patterns were named in full, how many only marked) and ``fig.phasemem_peakbar`` (the peak
    bar's texts, ``peakbar.Line``: each with the figure it shows).

    Example:
        >>> fig = report.plot(size=(1200, 600), steps="1-2", color="stack")   # this plot, through the reporter
        >>> fig.savefig("memory.png")   # or report.save_png("memory.png", steps="1-2")
    """
    width, height = _check_options(report, size, dpi, by, color, max_bands)
    if bands not in BAND_DRAWINGS:
        raise ValueError(f"bands={bands!r}: use 'raster', 'vector' or 'auto'")
    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, facecolor="white")
    lay = _labels.Layout(FigureCanvasAgg(fig), width, height, dpi)
    a, b, shown = visible_range(report, steps, events)
    sc = _scene(report, lay, _bands.x_values(report, by), a, b, shown, int(max_bands), color)
    bar_px = _peakbar.width_px(lay, report, a, b)
    ax_box, rows = lay.axes_box(sc.groups, bar_px)
    ax = fig.add_axes(ax_box)
    if bands == "auto":
        bands = "vector" if _bands.vertex_count(sc.st) <= VECTOR_BANDS_CAP else "raster"
    callouts, y_top = _draw(ax, lay, report, sc, ax_box, bands)
    fig.phasemem_callouts = callouts  # type: ignore[attr-defined]  # phasemem's own attribute
    peakbar = _peakbar.draw(fig, lay, report, ax_box, y_top, sc.unit_div, bar_px) if bar_px else []
    fig.phasemem_peakbar = peakbar  # type: ignore[attr-defined]  # phasemem's own attribute
    _axes_style(ax, by, sc.unit, sc.X[b] - sc.X[a], ax_box[2] * width, ax_box[3] * height)
    _title(fig, lay, report, shown, width, height)
    _legends(fig, lay, sc.groups, rows, height)
    fig.phasemem_stack = sc.st  # type: ignore[attr-defined]  # phasemem's own attribute
    return fig


@dataclass
class _Scene:
    """What is drawn, before any of it is: the visible events, their columns and bands, the scale."""
    X: np.ndarray
    a: int
    b: int
    shown: list
    cols: _bands.Columns
    st: _bands.Stack
    fills: list
    groups: list  # legend groups: bands, then phases and marks
    patterns: PatternTable
    ticks: list
    top: int
    unit_div: float
    unit: str
    show_reserved: bool


def _scene(report, lay, X, a, b, shown, max_bands: int, color: str) -> _Scene:
    tl = report.analysis.timeline
    # The CPU profiler has no caching allocator, hence no reserved memory: no line at zero.
    show_reserved = report.reserved_peak_bytes > 0
    # The axes' width does not depend on the legend (only its height does): columns first.
    ncols = max(int(lay.axes_box([], _peakbar.width_px(lay, report, a, b))[0][2] * lay.width), 1)
    cols = _bands.columns(X, tl.level, tl.active_after, tl.reserved_after, tl.delta, a, b, ncols)
    codes = _bands.category_codes(report)
    st = _bands.stack(tl.lifetimes, cols, report.n_events, max_bands, base_key=codes if color == "category" else None)
    top = int(max(cols.level.max(), cols.reserved.max() if show_reserved else 0, 1))
    unit_div, unit = axis_unit(top)
    fills, band_handles = _band_colors(report, st, color, codes, CATEGORIES)
    patterns = PatternTable.of(report.patterns).between(a, b)
    ticks, made = _phases_seen(shown, a, b)
    groups = [band_handles, _phase_and_mark_handles(report, a, b, ticks, made, patterns, show_reserved)]
    return _Scene(X, a, b, shown, cols, st, fills, groups, patterns, ticks, top, unit_div, unit, show_reserved)


def _draw(ax, lay, report, sc: _Scene, ax_box, bands="raster") -> tuple[_labels.Callouts, float]:
    """Every layer, bottom to top: phase shading, bands, lines, marks, then the labels, which are
    placed only where they overlap nothing drawn before them. Returns what the callouts named, and
    the y axis' top (in axis units)."""
    X, a, b, unit_div = sc.X, sc.a, sc.b, sc.unit_div
    ax_h_px = ax_box[3] * lay.height
    strip_px = lay.px(STRIP_PT) * STRIP_EM
    y_top = (sc.top / unit_div) / max(1 - _headroom_px(lay, strip_px, sc.patterns) / ax_h_px, MIN_VALUES_SHARE)
    ax.set_xlim(X[a], X[b])
    ax.set_ylim(0, y_top)
    strip_frac = strip_px / ax_h_px
    view = _labels.View(ax_box, lay.width, lay.height, X[a], X[b], y_top)
    runs = _runs(report.analysis.labels, report.analysis.step_of, a, b)
    _shade_phases(ax, lay, view, X, runs, a, b, strip_frac, _unsure(report), raster=bands == "raster")
    placed = _labels.Boxes()
    _draw_bands(ax, lay, view, placed, sc.st, sc.fills, unit_div, X[a], X[b], bands)
    step_px = _step_px(view, X, sc.shown, a, b)
    dense = len(step_px) > 0 and float(np.median(step_px)) < _MIN_STEP_DOTS_PX
    _draw_lines(ax, sc.cols, unit_div, sc.show_reserved, outline=not dense)
    _step_marks(ax, lay, view, X, sc.shown, a, b, step_px)
    _oom_marks(ax, lay, view, placed, X, report, a, b, strip_px)
    ceiling = view.top_px - strip_px - CEILING_AIR_PX
    _labels.overall_peak(ax, lay, view, placed, X, report, unit_div, a, b)
    curve = _labels.Curve(view, sc.cols.edges, sc.cols.level / unit_div)
    # Ticks a few pixels apart would paint the strip over in their colour.
    if not dense:
        _phase_ticks(ax, X, sc.ticks, strip_frac)
    callouts = _labels.callouts(ax, lay, view, curve, placed, sc.patterns, X, report.analysis.timeline.level, unit_div,
                                ceiling, dense)
    pts = _labels.phase_dots(ax, X, sc.shown, step_px >= _MIN_STEP_DOTS_PX, unit_div, a, b, PHASE_COLORS)
    _labels.peak_labels(ax, lay, view, placed, X, report, pts, runs, unit_div, a, b, ceiling)
    return callouts, y_top


def _check_options(report, size, dpi, by, color, max_bands) -> tuple[int, int]:
    """plot()'s options, checked: the picture's (width, height), else a ValueError saying what to give."""
    width, height = check_picture_size(size, dpi)
    if by not in ("event", "time"):
        raise ValueError(f"by={by!r}: use 'event' or 'time'")
    if color not in COLOR_MODES:
        raise ValueError(f"color={color!r}: use 'category', 'stack' or 'phase'")
    if isinstance(max_bands, bool) or not isinstance(max_bands, (int, np.integer)) or max_bands < 0:
        raise ValueError(f"max_bands={max_bands!r}: give a whole number >= 0")
    if getattr(report, "analysis", None) is None:
        raise ValueError("this report carries no timeline; build it with phasemem.analyze()")
    return width, height


def _phase_and_mark_handles(report, a, b, ticks, made, patterns, show_reserved) -> list:
    """The second legend: the phases drawn, 'other' where it shows, the lines and marks, and the kinds
    that later steps carry only as markers."""
    present = [p for p in PHASE_COLORS if p in made or any(t[1] == p for t in ticks)]
    other_shown = bool(((report.analysis.labels[a:b] == 0) if b > a else np.zeros(0, bool)).any())
    return _mark_handles(present, report, show_reserved, other_shown, patterns.repeated_kinds())


def _headroom_px(lay, strip_px, patterns) -> float:
    """Room between the highest value and the strip for the overall peak's label, and for two rows
    of callouts when there are patterns to call out."""
    room = (strip_px + lay.text_size("peak 0.00 GiB", PEAK_PT + 1, "bold")[1] + lay.px(_labels.PEAK_LIFT_PT)
            + PEAK_ROOM_AIR_PX)
    if len(patterns):
        room += 2 * (lay.text_size("logits 0.00 GiB", CALLOUT_PT)[1] + CALLOUT_ROW_AIR_PX)
    return room


def save(report, path, **options) -> None:
    """Draw the picture to ``path``: PNG, SVG or PDF by extension, written atomically; ``options``
    are ``plot``'s (size, dpi, by, steps, events, max_bands, color).

    Example:
        >>> phasemem.reporters.picture.draw.save(report, "memory.svg", size=(1200, 600), steps="2-4")
    """
    atomic_write(path, picture_writer(report, path, **options))


def picture_writer(report, path, **options):
    """The picture drawn now (so that drawing errors come before any file is touched), and a function
    that writes it, in the format ``path``'s extension names, to the path it is given (the page,
    .html, is the HTML reporter's: reporters/html)."""
    fmt = _FORMATS.get(os.path.splitext(os.fspath(path))[1].lower())
    if fmt is None:
        raise PhasememError(f"{os.fspath(path)}: cannot draw this format; name the picture .png, .svg or .pdf, "
                            "or the page .html")
    fig = figure(report, fmt, **options)

    def write(tmp):
        if fmt == "png":
            return _pixels.write_png(fig, tmp)
        # savefig's own dpi default comes from rcParams; pin it so the pixel size is the one asked for.
        fig.savefig(tmp, format=fmt, dpi=fig.dpi, facecolor="white")

    return write


def figure(report, fmt: str, **options) -> Figure:
    """The Figure a picture or page in format ``fmt`` shows: without history, what was alive by
    allocation site; else ``plot``'s, its bands as pixels for a PNG and outlines for the page, which
    draws its own band layers over the figure's emptied outlines (reporters/html)."""
    if report.live is not None:
        return plot_live(report.live, size=options.get("size", (1600, 900)), dpi=options.get("dpi", 100))
    drawing = {"png": "raster", "html": "vector"}.get(fmt, "auto")
    return plot(report, **{"bands": drawing, **options})


def visible_range(report, steps=None, events=None):
    """The events a picture with these ``steps`` / ``events`` options draws, [a, b), and its steps;
    a range that names nothing in the report raises ``StepsError`` (a ``PhasememError``).

    Example:
        >>> a, b, shown = visible_range(report, "1-2")
        >>> [s.number for s in shown]
        [1, 2]
    """
    n = report.n_events
    if steps is not None and events is not None:
        raise StepsError("give steps or events, not both")
    if events is not None:
        try:
            a, b = (int(v) for v in events)
        except (TypeError, ValueError):
            raise StepsError(f"events={events!r}: give (first, stop) event indices") from None
        a, b = max(a, 0), min(b, n)
        if a >= b:
            raise StepsError(f"events={events!r}: this trace has events 0..{n - 1}")
        return a, b, [st for st in report.steps if st.start_event < b and st.end_event >= a]
    if steps is None:
        return 0, n, list(report.steps)
    if isinstance(steps, str):
        lo, hi = parse_steps(steps)
        shown = [st for st in report.steps if (lo is None or st.number >= lo) and (hi is None or st.number <= hi)]
        asked = steps.strip()
    else:
        wanted = {int(steps)} if isinstance(steps, (int, np.integer)) else {int(s) for s in steps}
        shown = [st for st in report.steps if st.number in wanted]
        asked = ",".join(map(str, sorted(wanted)))
    if not shown:
        have = [report.steps[0].number, report.steps[-1].number] if report.steps else []
        raise StepsError(f"steps={asked}: this report has steps {have[0]}..{have[-1]}" if have
                         else f"steps={asked}: this report has no steps")
    a, b = min(st.start_event for st in shown), max(st.end_event for st in shown) + 1
    # A step that made no event still gets drawn: as the one event where it ended.
    return min(a, n - 1), max(b, min(a + 1, n)), shown


class _Runs:
    """Maximal stretches of events with one phase and one step: [first, last] inclusive."""

    def __init__(self, first, last, code):
        self.first, self.last, self.code = first, last, code


def _runs(label_codes, step_of, a, b) -> _Runs:
    """The runs that overlap the events drawn, [a, b) (the caller clips the outer two)."""
    # A slice is enough: a run cut at a or b is clipped to the view anyway.
    first, last, code, _ = phase_runs(label_codes[a:b], step_of[a:b])
    return _Runs(first + a, last + a, code)


def _phases_seen(shown, a, b) -> tuple[list[tuple[float, str]], set[str]]:
    """(event position, phase) of every phase that ran without making an event (fused AdamW after
    step 0: they have no run to shade, so they get a tick), and the phases that made events. One pass
    over the steps' phases (130,000 at 10M events), where the legend walked every step per phase."""
    ticks, made = [], set()
    for st in shown:
        for name, ph in st.phases.items():
            if ph.n_events:
                made.add(name)
            elif name in PHASE_COLORS and ph.at_event is not None and a <= ph.at_event <= b:
                ticks.append((float(ph.at_event), name))
    return ticks, made


def _draw_bands(ax, lay, view, placed, st, fills, unit_div, x0, x1, drawing="raster"):
    """The base (hatched), the drawn allocations (one image, or one polygon each), and the folded rest
    on top (hatched where split by category)."""
    rgb, base_colors, (folded_colors, folded_hatch) = fills
    # Bands meet edge to edge: antialiasing would leave a light seam between every two of them.
    bottom = 0
    verts, fcs = [], []
    for k, c in zip(st.base.tolist(), base_colors):
        if k <= 0:
            continue
        verts.append(np.array([[x0, bottom], [x0, bottom + k], [x1, bottom + k], [x1, bottom]]) / [1, unit_div])
        fcs.append(_shade(np.array([mcolors.to_rgb(c)]), np.array([BASE_SHADE]))[0])
        bottom += k
    if verts:
        ax.add_collection(PolyCollection(verts, facecolors=fcs, edgecolors="none", linewidths=0, hatch="////",
                                         hatchcolor="#ffffff", antialiaseds=False, zorder=2, gid="band-base"),
                          autolim=False)
        _base_label(ax, lay, view, placed, bottom, unit_div)
    if drawing == "raster":
        _band_image(ax, view, st, rgb, unit_div)
    else:
        polys = _bands.polygons(st, unit_div)
        if polys:
            ax.add_collection(PolyCollection(polys, facecolors=rgb, edgecolors="none", linewidths=0,
                                             antialiaseds=False, zorder=2.1, gid="band"), autolim=False)
    if st.folded.any():
        lo = st.drawn_top()
        parts, fcs = [], []
        for part, c in zip(st.folded_parts, folded_colors):
            if not part.any():
                continue
            xs, yb = _bands.step_outline(st.columns.edges, lo, unit_div)
            lo = lo + part
            _, yt = _bands.step_outline(st.columns.edges, lo, unit_div)
            parts.append(np.column_stack([np.concatenate([xs, xs[::-1]]), np.concatenate([yb, yt[::-1]])]))
            fcs.append(c)
        dotted = dict(hatch=folded_hatch, hatchcolor="#ffffff") if folded_hatch else {}
        ax.add_collection(PolyCollection(parts, facecolors=fcs, edgecolors="none", linewidths=0,
                                         antialiaseds=False, zorder=2.2, gid="band-folded", **dotted), autolim=False)


def _band_image(ax, view, st, rgb, unit_div):
    """The drawn bands as one RGBA image over the whole pixels the axes touch, one image pixel per
    canvas pixel; pixels whose centre lies outside the columns are transparent (the polygons were
    clipped to the axes there)."""
    if not len(st.index):
        return
    i0, i1, k0, k1 = _pixels.grid(view)
    xc = view.x_data(np.arange(i0, i1) + 0.5)
    edges = st.columns.edges
    # A snapped outline from x0 to x1 covers the pixels whose centre is in (x0, x1] (its edges round
    # half up), so a centre on an edge belongs to the column left of it.
    column_of = np.searchsorted(edges, xc, "left") - 1
    column_of[(xc <= edges[0]) | (xc > edges[-1])] = -1
    row_bytes = view.y_data(np.arange(k0, k1) + 0.5) * unit_div
    labels = _bands.raster(st, column_of, row_bytes)
    palette = np.zeros((len(st.index) + 1, 4), np.uint8)  # the last entry (label -1) transparent
    palette[:-1, :3] = _pixels.to_bytes(np.asarray(rgb, dtype=np.float64).reshape(-1, 3))
    palette[:-1, 3] = 255
    _pixels.add(ax, view, palette[labels], i0, k0, 2.1, "band-raster")


def _base_label(ax, lay, view, placed, base, unit_div):
    """What the hatched base band is, inside it, where it is tall enough. Not the report's 'allocated
    before recording' (all that was alive at the first event, some freed later): only what stayed."""
    label = f"alive from before recording to the end: {format_bytes(base)}"
    w, h = lay.text_size(label, PEAK_PT)
    y0, y1 = view.y_px(0), view.y_px(base / unit_div)
    if y1 - y0 < h + BASE_LABEL_AIR_Y_PX or w + 2 * BASE_LABEL_AIR_X_PX > view.right_px - view.left_px:
        return
    cx = view.left_px + BASE_LABEL_AIR_X_PX + w / 2
    by = (y0 + y1) / 2 - h / 2
    placed.add(cx - w / 2, cx + w / 2, by, by + h)
    ax.text(float(view.x_data(cx)), base / unit_div / 2, label, ha="center", va="center", fontsize=PEAK_PT,
            color="#333333", zorder=9,
            bbox=dict(boxstyle="square,pad=0.15", fc="white", ec="none", alpha=BASE_LABEL_ALPHA))


def _draw_lines(ax, cols, unit_div, show_reserved, outline=True):
    # With steps a few pixels wide the outline goes up and down in every column: a dark wall over
    # the bands, whose top is the same curve anyway.
    if outline:
        xs, top = _bands.step_outline(cols.edges, cols.level, unit_div)
        ax.plot(xs, top, color=_CURVE, lw=CURVE_LW, zorder=3, solid_joinstyle="miter")
    if show_reserved:
        xs, res = _bands.step_outline(cols.edges, cols.reserved, unit_div)
        ax.plot(xs, res, color=_RESERVED, lw=CURVE_LW, zorder=3.5)
