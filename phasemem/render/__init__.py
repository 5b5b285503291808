"""The labeled picture: every allocation as a band stacked over the trace, each step's phases
shaded and named, every recognised pattern called out, peaks marked.

matplotlib is imported here and nowhere else. Figures are built on ``matplotlib.figure.Figure``
with an Agg canvas of their own, so drawing never touches (or depends on) the user's backend or
pyplot state. Everything is laid out in pixels from ``size`` and ``dpi``, which keeps the output
exactly ``size`` pixels and lets text be measured before it is placed: labels that would not fit
their span, or would overlap a label already placed, are left out rather than drawn on top of
each other.

Nothing is drawn per event: each pixel column samples its highest event (``bands.columns``), and
the allocation bands are polygons over those samples (``bands.stack``), so a million-event trace
costs about what a thousand-event one does and no one-event spike is lost.
"""
from __future__ import annotations

import os
import re

import numpy as np
from matplotlib import colors as mcolors
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator

from ..errors import PhasememError
from ..output import MAX_PICTURE, MIN_PICTURE, PICTURE_SIZES, atomic_write
from ..spans import phase_runs
from ..stacks import stack_summary
from ..units import format_bytes
from ..vocab import C, CATEGORIES, CATEGORY_COLORS, PHASE_COLORS, PHASES
from . import bands as _bands
from . import labels as _labels
from .labels import CALLOUT_PT, LABEL_PT, LEGEND_PT, PEAK_PT, STEP_PT, STRIP_PT, TICK_PT, TITLE_PT

_SHORT = {"forward": "fwd", "loss": "loss", "zero_grad": "zero", "backward": "bwd", "optimizer": "opt", "other": "?"}
_STRIP_OTHER = "#c8c8c8"  # the strip where no phase is known
#: An inferred phase less sure than this (its measured precision, segment.CONFIDENCE) is drawn
#: hatched and named with a '?': the frameless optimizer (0.66) and loss (0.69) are.
UNSURE = 0.9
_OOM = "#d62728"

#: ``color="stack"``: a call site's colour is its stack's hash into this palette: tab10 without its
#: grey (grey means no frames), then light tints of five of its hues.
STACK_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
                 "#17becf", "#a6cee3", "#fdbf6f", "#b2df8a", "#fb9a99", "#cab2d6")
COLOR_MODES = ("category", "stack", "phase")

_NO_FRAMES = "#a3a3a3"
_PHASE_OTHER = "#9d9d9d"  # color="phase": made outside every phase
_BASE = "#b5b5b5"  # memory from before recording, when not split by category
_FOLDED = "#d4d4d4"
_CURVE = "#22313f"
_RESERVED = "#7a7a7a"

# Neighbouring bands of one colour would merge into a slab; alternating shades keep each allocation
# its own stripe (mix with white > 0, with black < 0). Call-site colours come in light and dark
# tints of a hue already, so they alternate less.
_SHADES = (0.0, 0.24, 0.1, 0.34, -0.1, 0.17)
_SHADES_STACK = (0.0, 0.1, -0.08, 0.05)

# Below these widths per step, step lines and per-phase peak dots are left out (too dense to read),
# and pattern occurrences other than the one named in full are not marked.
_MIN_STEP_LINE_PX, _MIN_STEP_DOTS_PX = 6, 12

_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}


class StepsError(PhasememError, ValueError):
    """A ``steps`` range or ``events`` window that names nothing this report has."""


def plot(report, *, size=(1600, 900), dpi=100, by="event", steps=None, events=None, max_bands=2000,
         color="category") -> Figure:
    """The labeled memory picture of a report as a matplotlib Figure.

    ``size``: the output in pixels (width, height). ``by``: ``"event"`` (x = position in the
    allocator trace, as memory_viz numbers events) or ``"time"`` (µs since the first event).
    ``steps``: draw only those steps (``Step.number``): ``3``, ``"2-4"``, ``"2-"``, ``range(2, 5)``.
    ``events``: draw only events ``(first, stop)``. ``max_bands``: how many of the largest
    allocations are drawn as bands of their own; the rest are summed into one band on top.
    ``color``: ``"category"`` (parameter, gradient, activation, ...), ``"stack"`` (call site:
    one colour per allocation site, the same every step) or ``"phase"`` (the phase that made it).

    What was drawn is kept on the figure: ``fig.phasemem_stack`` (the ``bands.Stack``: which
    allocations got bands, their offsets per column, the summed rest) and ``fig.phasemem_callouts``
    (which patterns were named in full, how many only marked).

    Example:
        >>> fig = phasemem.render.plot(report, size=(1200, 600), steps="1-2", color="stack")
        >>> fig.savefig("memory.png")   # or report.save_png("memory.png", steps="1-2")
    """
    width, height = _check_size(size, dpi)
    if by not in ("event", "time"):
        raise ValueError(f"by={by!r}: use 'event' or 'time'")
    if color not in COLOR_MODES:
        raise ValueError(f"color={color!r}: use 'category', 'stack' or 'phase'")
    if isinstance(max_bands, bool) or not isinstance(max_bands, (int, np.integer)) or max_bands < 0:
        raise ValueError(f"max_bands={max_bands!r}: give a whole number >= 0")
    tl = getattr(report, "timeline", None)
    if tl is None or report.label_codes is None:
        raise ValueError("this report carries no timeline; build it with phasemem.analyze()")

    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, facecolor="white")
    canvas = FigureCanvasAgg(fig)
    lay = _labels.Layout(canvas, width, height, dpi)

    a, b, shown = visible_range(report, steps, events)
    X = _x_values(report, by)
    level = tl.level
    # The CPU profiler has no caching allocator, hence no reserved memory: no line at zero.
    show_reserved = report.reserved_peak_bytes > 0

    # The axes' width does not depend on the legend (only its height does): columns first.
    ncols = max(int(lay.axes_box([])[0][2] * width), 1)
    cols = _bands.columns(X, level, tl.active_after, tl.reserved_after, tl.delta, a, b, ncols)
    codes = _category_codes(report)
    st = _bands.stack(tl.lifetimes, cols, report.n_events, int(max_bands),
                      base_key=codes if color == "category" else None)
    top = int(max(cols.level.max(), cols.reserved.max() if show_reserved else 0, 1))
    unit_div, unit = _unit(top)

    fills, band_handles = _band_colors(report, st, color, codes, CATEGORIES)
    patterns = [p for p in report.patterns if a <= p.peak_event < b]
    ticks = _silent_phases(report, shown, a, b)
    present = [p for p in PHASE_COLORS
               if any(p in s.phases and s.phases[p].n_events for s in shown) or any(t[1] == p for t in ticks)]
    other_shown = bool(((report.label_codes[a:b] == 0) if b > a else np.zeros(0, bool)).any())
    kinds = [p.kind for p in patterns]
    repeated = sorted({k for k in kinds if kinds.count(k) > 1}, key=kinds.index)
    groups = [band_handles, _mark_handles(present, report, show_reserved, other_shown, repeated)]
    ax_box, rows = lay.axes_box(groups)
    ax = fig.add_axes(ax_box)
    ax_h_px = ax_box[3] * height

    strip_px = lay.px(STRIP_PT) * 1.9
    # Room between the highest value and the strip for the overall peak's label, and for two rows
    # of callouts when there are patterns to call out.
    headroom_px = strip_px + lay.text_size("peak 0.00 GiB", PEAK_PT + 1, "bold")[1] + lay.px(3) + 10
    if patterns:
        headroom_px += 2 * (lay.text_size("logits 0.00 GiB", CALLOUT_PT)[1] + 8)
    data_top = top / unit_div
    y_top = data_top / max(1 - headroom_px / ax_h_px, 0.5)
    ax.set_xlim(X[a], X[b])
    ax.set_ylim(0, y_top)
    strip_frac = strip_px / ax_h_px

    view = _labels.View(ax_box, width, height, X[a], X[b], y_top)
    runs = _runs(report.label_codes, report.step_of, a, b)
    _shade_phases(ax, lay, view, X, runs, a, b, strip_frac, _unsure(report))
    placed = _labels.Boxes()
    _draw_bands(ax, lay, view, placed, st, fills, unit_div, X[a], X[b])
    step_px = _step_px(view, X, shown, a, b)
    dense = len(step_px) > 0 and float(np.median(step_px)) < _MIN_STEP_DOTS_PX
    _draw_lines(ax, cols, unit_div, show_reserved, outline=not dense)
    _step_marks(ax, lay, view, X, shown, a, b, step_px)
    _oom_marks(ax, lay, view, placed, X, report, a, b, strip_px)

    ceiling = view.top_px - strip_px - 2
    _labels.overall_peak(ax, lay, view, placed, X, report, unit_div, a, b)
    curve = _labels.Curve(view, cols.edges, cols.level / unit_div)
    # Ticks a few pixels apart would paint the strip over in their colour.
    if not dense:
        _phase_ticks(ax, X, ticks, strip_frac)
    fig.phasemem_callouts = _labels.callouts(ax, lay, view, curve, placed, patterns, X, level, unit_div,
                                             ceiling, dense)
    pts = _labels.phase_dots(ax, X, shown, step_px >= _MIN_STEP_DOTS_PX, unit_div, a, b, PHASE_COLORS)
    _labels.peak_labels(ax, lay, view, placed, X, report, pts, runs, unit_div, a, b, ceiling)
    _axes_style(ax, by, unit, X[b] - X[a], ax_box[2] * width, ax_h_px)
    _title(fig, lay, report, shown, width, height)
    _legends(fig, lay, groups, rows, height)
    fig.phasemem_stack = st
    return fig


def save(report, path, **options) -> None:
    """Draw the picture to ``path``: PNG, SVG or PDF by extension, written atomically; ``options``
    are ``plot``'s (size, dpi, by, steps, events, max_bands, color).

    Example:
        >>> phasemem.render.save(report, "memory.svg", size=(1200, 600), steps="2-4")
    """
    atomic_write(path, picture_writer(report, path, **options))


def picture_writer(report, path, **options):
    """The picture drawn now (so that drawing errors come before any file is touched), and a function
    that writes it, in the format ``path``'s extension names, to the path it is given."""
    fmt = _FORMATS.get(os.path.splitext(os.fspath(path))[1].lower())
    if fmt is None:
        raise PhasememError(f"{os.fspath(path)}: cannot draw this format; name the picture .png, .svg or .pdf")
    if report.live is not None:  # no history: what was alive, by allocation site
        from .live import plot_live

        fig = plot_live(report.live, size=options.get("size", (1600, 900)), dpi=options.get("dpi", 100))
    else:
        fig = plot(report, **options)

    def write(tmp):
        # savefig's own dpi default comes from rcParams; pin it so the pixel size is the one asked for.
        fig.savefig(tmp, format=fmt, dpi=fig.dpi, facecolor="white")

    return write


def parse_steps(spec) -> tuple[int | None, int | None] | None:
    """A ``--steps`` text as (first, last) step numbers, either end open (None); bad text raises.

    Example:
        >>> parse_steps("2-4"), parse_steps("3"), parse_steps("2-")
        ((2, 4), (3, 3), (2, None))
    """
    if spec is None:
        return None
    text = str(spec).strip()
    m = re.fullmatch(r"(\d+)?\s*(-)?\s*(\d+)?", text)
    if not text or m is None or (m.group(2) is None and m.group(3) is not None) or (m.group(1) is None and m.group(3) is None):
        raise StepsError(f"steps={text!r}: give a step number or a range of them: 3, 2-4, 2- or -4")
    lo = int(m.group(1)) if m.group(1) is not None else None
    hi = (int(m.group(3)) if m.group(3) is not None else None) if m.group(2) else lo
    if lo is not None and hi is not None and lo > hi:
        raise StepsError(f"steps={text!r}: the range runs backwards; write {hi}-{lo}")
    return lo, hi


# -- layout ---------------------------------------------------------------------------------------


def _check_size(size, dpi) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in size)
    except (TypeError, ValueError):
        raise ValueError(f"size={size!r}: give (width, height) in pixels") from None
    if not (MIN_PICTURE[0] <= w <= MAX_PICTURE and MIN_PICTURE[1] <= h <= MAX_PICTURE):
        raise ValueError(f"size={size!r}: {PICTURE_SIZES}")
    if not 10 <= dpi <= 2000:
        raise ValueError(f"dpi={dpi!r}: use 10 to 2000")
    return w, h


# -- data -----------------------------------------------------------------------------------------


def visible_range(report, steps=None, events=None):
    """The events a picture with these ``steps`` / ``events`` options draws, [a, b), and its steps;
    a range that names nothing in the report raises ``StepsError`` (a ``PhasememError``).

    Example:
        >>> a, b, shown = visible_range(report, "1-2")
        >>> [s.number for s in shown]
        [1, 2]
    """
    n = report.n_events
    have = [st.number for st in report.steps]
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
        raise StepsError(f"steps={asked}: this report has steps {have[0]}..{have[-1]}" if have
                         else f"steps={asked}: this report has no steps")
    a, b = min(st.start_event for st in shown), max(st.end_event for st in shown) + 1
    # A step that made no event still gets drawn: as the one event where it ended.
    return min(a, n - 1), max(b, min(a + 1, n)), shown


def _x_values(report, by) -> np.ndarray:
    """x of every event's left edge, and one past the last (events span [X[e], X[e + 1]))."""
    n = report.n_events
    if by == "event":
        return np.arange(n + 1, dtype=np.float64)
    t = report.trace.time_us
    X = np.empty(n + 1, dtype=np.float64)
    X[:n] = t - t[0]
    X[n] = X[n - 1] + max((X[n - 1] - X[0]) / max(n - 1, 1), 1.0)
    return X


def _category_codes(report) -> np.ndarray:
    curves = getattr(report, "category_curves", None)
    if curves is None:
        return np.full(len(report.timeline.lifetimes), C["other"], np.int64)
    return np.asarray(curves.codes, dtype=np.int64)


class _Runs:
    """Maximal stretches of events with one phase and one step: [first, last] inclusive."""

    def __init__(self, first, last, code):
        self.first, self.last, self.code = first, last, code


def _runs(label_codes, step_of, a, b) -> _Runs:
    """The runs that overlap the events drawn, [a, b) (the caller clips the outer two)."""
    # A slice is enough: a run cut at a or b is clipped to the view anyway.
    first, last, code, _ = phase_runs(label_codes[a:b], step_of[a:b])
    return _Runs(first + a, last + a, code)


def _silent_phases(report, shown, a, b) -> list[tuple[float, str]]:
    """(event position, phase) of every phase that ran without making an event (fused AdamW after
    step 0): they have no run to shade, so they get a tick."""
    out = []
    for st in shown:
        for name, ph in st.phases.items():
            if name in PHASE_COLORS and ph.n_events == 0 and ph.at_event is not None and a <= ph.at_event <= b:
                out.append((float(ph.at_event), name))
    return out


def _unit(top: int) -> tuple[float, str]:
    for div, name in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if top >= div:
            return float(div), name
    return 1.0, "B"


def _shade(rgb: np.ndarray, t: np.ndarray) -> np.ndarray:
    t = t[:, None]
    return np.where(t >= 0, rgb + (1 - rgb) * t, rgb * (1 + t))


def _band_colors(report, st, mode, codes, categories):
    """Face colour of every drawn band, the base and the folded band, and the legend saying so."""
    idx = st.index
    handles = []
    if mode == "category":
        names = np.array(categories)
        palette = np.array([mcolors.to_rgb(CATEGORY_COLORS[c]) for c in categories])
        rgb = palette[codes[idx]] if len(idx) else np.zeros((0, 3))
        present = sorted(set(codes[idx].tolist()) | set(st.base_keys.tolist()))
        handles = [Patch(facecolor=CATEGORY_COLORS[names[c]], edgecolor="none", label=names[c].replace("_", " "))
                   for c in present]
        base = [CATEGORY_COLORS[names[k]] for k in st.base_keys]
    elif mode == "phase":
        life = report.timeline.lifetimes
        alloc = life.alloc_event[idx]
        ph = np.where(alloc >= 0, report.label_codes[np.maximum(alloc, 0)], -1)
        table = {k: mcolors.to_rgb(PHASE_COLORS.get(p, _PHASE_OTHER)) for k, p in enumerate(PHASES)}
        table[-1] = mcolors.to_rgb(_NO_FRAMES)
        rgb = np.array([table[k] for k in ph.tolist()]).reshape(-1, 3)
        for k in sorted(set(ph.tolist()), key=lambda k: (k <= 0, abs(k))):
            label = "made before recording" if k < 0 else (f"made in {PHASES[k]}" if PHASES[k] != "other"
                                                         else "made outside phases")
            handles.append(Patch(facecolor=mcolors.to_hex(table[k]), edgecolor="none", label=label))
        base = [_BASE] * len(st.base_keys)
    else:
        rgb, handles = _stack_colors(report, st)
        base = [_BASE] * len(st.base_keys)
    shades = np.array(_SHADES_STACK if mode == "stack" else _SHADES)
    t = shades[np.arange(len(idx)) % len(shades)]
    fills = _shade(rgb, t) if len(idx) else rgb
    if len(st.base_keys) and st.base.sum() > 0:
        handles.append(Patch(facecolor="#eeeeee", edgecolor="#8a8a8a", hatch="////", lw=0,
                             label="alive from before recording to the end"))
    if st.n_folded:
        handles.append(Patch(facecolor=_FOLDED, edgecolor="none",
                             label=f"{st.n_folded:,} smaller allocations, summed"))
    return (fills, base), handles


def _stack_hash(sid: np.ndarray) -> np.ndarray:
    # Knuth's multiplicative hash: neighbouring stack ids (sites met one after the other) land far apart.
    return ((sid.astype(np.uint64) * np.uint64(2654435761)) % np.uint64(2**32) >> np.uint64(11)) % len(STACK_PALETTE)


def _stack_colors(report, st):
    trace = report.trace
    life = report.timeline.lifetimes
    alloc = life.alloc_event[st.index]
    sid = np.where(alloc >= 0, trace.stack[np.maximum(alloc, 0)], -1).astype(np.int64)
    has = sid >= 0
    named = []
    if has.any():
        # The sites holding the most bytes get named in the legend; the rest share the palette, unnamed.
        totals = np.bincount(sid[has], weights=st.size[has].astype(np.float64))
        top = np.argsort(-totals, kind="stable")[:6]
        named = top[totals[top] > 0].tolist()
    slot = _stack_hash(np.maximum(sid, 0)).astype(np.int64)
    # Two named sites must not share a colour: a collision moves the smaller one to the next free slot.
    taken, moved = set(), {}
    for s in named:
        k = int(_stack_hash(np.array([s]))[0])
        while k in taken and len(taken) < len(STACK_PALETTE):
            k = (k + 1) % len(STACK_PALETTE)
        taken.add(k)
        moved[s] = k
    for s, k in moved.items():
        slot[sid == s] = k
    palette = np.array([mcolors.to_rgb(c) for c in STACK_PALETTE])
    rgb = np.where(has[:, None], palette[slot], np.array(mcolors.to_rgb(_NO_FRAMES)))
    handles = [Patch(facecolor=STACK_PALETTE[moved[s]], edgecolor="none", label=_site(trace, s)) for s in named]
    if has.any() and len(np.unique(sid[has])) > len(named):
        handles.append(Patch(facecolor="white", edgecolor="#8a8a8a", lw=0.6,
                             label="other call sites (colour = hash of the stack)"))
    if (~has).any():
        handles.append(Patch(facecolor=_NO_FRAMES, edgecolor="none", label="no Python frames (autograd thread)"))
    return rgb.reshape(-1, 3), handles


def _site(trace, sid: int) -> str:
    """A call stack in a few words, for the legend (the report's own summary, shortened)."""
    text = stack_summary(trace, sid) or "no frames"
    return text if len(text) <= 60 else text[:59] + "…"


# -- drawing --------------------------------------------------------------------------------------


def _draw_bands(ax, lay, view, placed, st, fills, unit_div, x0, x1):
    """The base (hatched), one polygon per drawn allocation, and the folded rest on top."""
    rgb, base_colors = fills
    # Bands meet edge to edge: antialiasing would leave a light seam between every two of them.
    bottom = 0
    verts, fcs = [], []
    for k, c in zip(st.base.tolist(), base_colors):
        if k <= 0:
            continue
        verts.append(np.array([[x0, bottom], [x0, bottom + k], [x1, bottom + k], [x1, bottom]]) / [1, unit_div])
        fcs.append(_shade(np.array([mcolors.to_rgb(c)]), np.array([0.45]))[0])
        bottom += k
    if verts:
        ax.add_collection(PolyCollection(verts, facecolors=fcs, edgecolors="none", linewidths=0, hatch="////",
                                         hatchcolor="#ffffff", antialiaseds=False, zorder=2, gid="band-base"),
                          autolim=False)
        _base_label(ax, lay, view, placed, bottom, unit_div)
    polys = _bands.polygons(st, unit_div)
    if polys:
        ax.add_collection(PolyCollection(polys, facecolors=rgb, edgecolors="none", linewidths=0,
                                         antialiaseds=False, zorder=2.1, gid="band"), autolim=False)
    if st.folded.any():
        lo = st.drawn_top()
        xs, yb = _bands.step_outline(st.columns.edges, lo, unit_div)
        _, yt = _bands.step_outline(st.columns.edges, lo + st.folded, unit_div)
        ax.add_collection(PolyCollection([np.column_stack([np.concatenate([xs, xs[::-1]]),
                                                           np.concatenate([yb, yt[::-1]])])],
                                         facecolors=[_FOLDED], edgecolors="none", linewidths=0,
                                         antialiaseds=False, zorder=2.2, gid="band-folded"), autolim=False)


def _base_label(ax, lay, view, placed, base, unit_div):
    """What the hatched base band is, inside it, where it is tall enough. Not the report's 'allocated
    before recording' (all that was alive at the first event, some freed later): only what stayed."""
    label = f"alive from before recording to the end: {format_bytes(base)}"
    w, h = lay.text_size(label, PEAK_PT)
    y0, y1 = view.y_px(0), view.y_px(base / unit_div)
    if y1 - y0 < h + 4 or w + 12 > view.right_px - view.left_px:
        return
    cx = view.left_px + 6 + w / 2
    by = (y0 + y1) / 2 - h / 2
    placed.add(cx - w / 2, cx + w / 2, by, by + h)
    ax.text(float(view.x_data(cx)), base / unit_div / 2, label, ha="center", va="center", fontsize=PEAK_PT,
            color="#333333", zorder=9, bbox=dict(boxstyle="square,pad=0.15", fc="white", ec="none", alpha=0.8))


def _draw_lines(ax, cols, unit_div, show_reserved, outline=True):
    # With steps a few pixels wide the outline goes up and down in every column: a dark wall over
    # the bands, whose top is the same curve anyway.
    if outline:
        xs, top = _bands.step_outline(cols.edges, cols.level, unit_div)
        ax.plot(xs, top, color=_CURVE, lw=0.9, zorder=3, solid_joinstyle="miter")
    if show_reserved:
        xs, res = _bands.step_outline(cols.edges, cols.reserved, unit_div)
        ax.plot(xs, res, color=_RESERVED, lw=0.9, zorder=3.5)


def _unsure(report) -> set[str]:
    """Phases inferred with a confidence below UNSURE: drawn hatched, named with a '?'."""
    return {p.name for p in report.phases.values() if p.source == "inferred" and p.confidence < UNSURE}


def _shade_phases(ax, lay, view, X, runs, a, b, strip_frac, unsure=frozenset()):
    """Each phase occurrence: a light band over the plot, a solid cell in the strip, its name if it
    fits; 'other' (no phase known) a grey cell in the strip only; an unsure phase's cells hatched."""
    colors = np.array([mcolors.to_rgba(PHASE_COLORS.get(p, _STRIP_OTHER)) for p in PHASES])
    first, last, code = runs.first, runs.last, runs.code
    x0, x1 = X[np.maximum(first, a)], X[np.minimum(last + 1, b)]
    known = np.array([p in PHASE_COLORS for p in PHASES])[code]
    hatched = np.array([p in unsure for p in PHASES])[code]
    # One collection per layer, not one patch per occurrence: 400 steps would be 2,000 patches.
    for y0, y1, alpha, z, m in ((0, 1 - strip_frac, 0.14, 0, known), (1 - strip_frac, 1, 0.95, 1, known | ~known)):
        for h in (False, True):
            sel = m & (hatched == h)
            if not sel.any():
                continue
            verts = np.empty((int(sel.sum()), 4, 2))
            verts[:, :, 0] = np.stack([x0[sel], x0[sel], x1[sel], x1[sel]], axis=1)
            verts[:, :, 1] = [y0, y1, y1, y0]
            fc = colors[code[sel]].copy()
            fc[:, 3] = alpha
            ax.add_collection(PolyCollection(verts, facecolors=fc, edgecolors="none", linewidths=0,
                                             hatch="xx" if h and z == 1 else None, hatchcolor="#ffffff",
                                             transform=ax.get_xaxis_transform(), zorder=z,
                                             gid="phase-unsure" if h and z == 1 else None), autolim=False)
    spans = view.x_px(x1) - view.x_px(x0)
    for xa, xb, c, span in zip(x0.tolist(), x1.tolist(), code.tolist(), spans.tolist()):
        phase = PHASES[c]
        q = "?" if phase in unsure else ""
        for name in (phase + q, _SHORT[phase] + q):
            if lay.fits(name, STRIP_PT, span, "bold"):
                ax.text((xa + xb) / 2, 1 - strip_frac / 2, name, transform=ax.get_xaxis_transform(),
                        ha="center", va="center", fontsize=STRIP_PT, color="white", fontweight="bold",
                        zorder=6, clip_on=True)
                break


def _oom_marks(ax, lay, view, placed, X, report, a, b, strip_px):
    """A red line where the allocator ran out of memory on this device, with what was asked."""
    for o in report.ooms:
        if (o.device and o.device != report.device) or not a <= o.event < b:
            continue
        x = float(X[o.event])
        ax.axvline(x, color=_OOM, lw=1.6, ls="--", zorder=8, gid="oom")
        label = f"OUT OF MEMORY: asked {format_bytes(o.requested_bytes)}, {format_bytes(o.device_free_bytes)} free"
        w, h = lay.text_size(label, CALLOUT_PT, "bold")
        px = view.x_px(x)
        right = px + 4 + w <= view.right_px
        cx = px + 4 + w / 2 if right else px - 4 - w / 2
        cy = (view.top_px - strip_px + float(view.y_px(0))) / 2  # mid-height: the peak's label sits on top
        placed.add(cx - w / 2, cx + w / 2, cy - h / 2, cy + h / 2)
        ax.text(float(view.x_data(cx)), float(view.y_data(cy)), label, ha="center", va="center", fontsize=CALLOUT_PT,
                color=_OOM, fontweight="bold", zorder=9,
                bbox=dict(boxstyle="square,pad=0.15", fc="white", ec="none", alpha=0.85))


def _phase_ticks(ax, X, ticks, strip_frac):
    """A thin tick in the strip where a phase ran without an allocator event."""
    if not ticks:
        return
    # at_event is fractional (between two events): x is interpolated between their edges.
    xs = [_x_at(X, e) for e, _ in ticks]
    # White under the colour: the tick usually sits between two cells of other phases.
    ax.vlines(xs, 1 - strip_frac * 1.25, 1, transform=ax.get_xaxis_transform(), colors="white", lw=4.6, zorder=5)
    ax.vlines(xs, 1 - strip_frac * 1.25, 1, transform=ax.get_xaxis_transform(),
              colors=[PHASE_COLORS[p] for _, p in ticks], lw=2.4, zorder=5.1, gid="phase-tick")


def _x_at(X, e: float) -> float:
    k = int(np.floor(e))
    k = min(max(k, 0), len(X) - 2)
    return float(X[k] + (e - k) * (X[k + 1] - X[k]))


def _step_marks(ax, lay, view, X, shown, a, b, step_px):
    """Vertical lines between steps and the step numbers above the axes."""
    bounds = sorted({st.start_event for st in shown if st.start_event > a} | {st.end_event + 1 for st in shown})
    # A line every few pixels is a grey wall that hides the bands; the strip still shows the steps' rhythm.
    xs = [X[e] for e in bounds if a < e < b] if len(step_px) and step_px.mean() >= _MIN_STEP_LINE_PX else []
    if xs:
        ax.vlines(xs, 0, 1, transform=ax.get_xaxis_transform(), colors="#222222", lw=0.8, alpha=0.6, zorder=4)
    placed = _labels.Boxes()
    for st in shown:
        x0, x1 = X[max(st.start_event, a)], X[min(st.end_event + 1, b)]
        cx = float(view.x_px((x0 + x1) / 2))
        span = float(view.x_px(x1) - view.x_px(x0))
        tag = "" if st.complete else "*"
        for label in (f"step {st.number}{tag}", f"{st.number}{tag}"):
            if not lay.fits(label, STEP_PT, span):
                continue
            w, h = lay.text_size(label, STEP_PT)
            if placed.free(cx - w / 2, cx + w / 2, view.top_px, view.top_px + h):
                placed.add(cx - w / 2, cx + w / 2, view.top_px, view.top_px + h)
                ax.annotate(label, xy=((x0 + x1) / 2, 1), xycoords=ax.get_xaxis_transform(), xytext=(0, 3),
                            textcoords="offset points", ha="center", va="bottom", fontsize=STEP_PT,
                            color="#222222" if st.complete else "#777777", annotation_clip=False)
                break


def _step_px(view, X, shown, a, b) -> np.ndarray:
    """How many pixels wide each shown step is drawn."""
    first = np.array([max(st.start_event, a) for st in shown], dtype=np.int64)
    stop = np.array([min(st.end_event + 1, b) for st in shown], dtype=np.int64)
    return view.x_px(X[stop]) - view.x_px(X[first]) if len(shown) else np.zeros(0)


def _axes_style(ax, by, unit, span, w_px, h_px):
    ax.set_ylabel(f"allocated memory ({unit})", fontsize=LABEL_PT)
    ax.tick_params(labelsize=TICK_PT)
    # Tick labels like "1,200,000" need room: fewer of them on a narrow picture.
    ax.xaxis.set_major_locator(MaxNLocator(nbins=int(np.clip(w_px / 130, 2, 10)), integer=by == "event"))
    if by == "event":
        ax.set_xlabel("event (position in the allocator trace)", fontsize=LABEL_PT)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{int(v):,}"))
    else:
        # x is in µs; ticks are shown in the unit that keeps them short.
        div, name = (1e6, "s") if span >= 2e6 else (1e3, "ms") if span >= 2e3 else (1.0, "µs")
        ax.set_xlabel(f"time since the first event ({name})", fontsize=LABEL_PT)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / div:,.6g}"))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=int(np.clip(h_px / 60, 2, 8))))
    ax.grid(axis="y", color="#dddddd", lw=0.6, zorder=-1)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _title(fig, lay, report, shown, width, height):
    where = ""
    if report.step_of is not None and report.step_of[report.peak_event] >= 0:
        st = report.steps[int(report.step_of[report.peak_event])]
        where = f" in step {st.number} {PHASES[int(report.label_codes[report.peak_event])]}"
    left = f"{report.device} — peak {format_bytes(report.peak_bytes)} allocated{where}"
    right = f"{report.n_events:,} events · {len(report.steps)} step{'s' * (len(report.steps) != 1)}"
    inferred = sorted(ph for ph, src in report.sources.items() if src == "inferred")
    if inferred:  # a picture passed on without its report must still say its phases are guesses
        right = f"phases inferred (no markers) · {right}"
    if len(shown) != len(report.steps):
        right += f" (showing {len(shown)})"
    y = 1 - lay.px(TITLE_PT) * 0.5 / height
    margin = lay.px(TICK_PT) * 1.5
    wl, _ = lay.text_size(left, TITLE_PT, "bold")
    wr, _ = lay.text_size(right, TITLE_PT)
    fig.text(margin / width, y, left, ha="left", va="top", fontsize=TITLE_PT, fontweight="bold")
    # The right part gives way on narrow pictures rather than run into the left one.
    if wl + wr + 3 * margin <= width:
        fig.text(1 - margin / width, y, right, ha="right", va="top", fontsize=TITLE_PT, color="#444444")


def _mark_handles(present, report, show_reserved, other_shown=False, repeated=()):
    unsure = _unsure(report)
    handles = [Patch(facecolor=PHASE_COLORS[p], edgecolor="none", alpha=0.5,
                     label=f"{p}? ({report.phases[p].confidence:.0%} sure)" if p in unsure else p) for p in present]
    if other_shown:
        handles.append(Patch(facecolor=_STRIP_OTHER, edgecolor="none", label="other: no phase known"))
    handles.append(Line2D([], [], color=_CURVE, lw=1.0, label="allocated"))
    if show_reserved:
        handles.append(Line2D([], [], color=_RESERVED, lw=1.2,
                              label=f"reserved (peak {format_bytes(report.reserved_peak_bytes)})"))
    handles += [
        Line2D([], [], marker="o", color="none", markerfacecolor="#dddddd", markeredgecolor="#1b1b1b",
               markersize=5, label="phase peak (in its phase's colour)"),
        # a ring, as drawn: a filled red dot is what a backward phase's peak looks like
        Line2D([], [], marker="o", color="none", markerfacecolor="white", markeredgecolor=_labels.PEAK,
               markeredgewidth=1.6, markersize=8, label="overall peak"),
    ]
    # Occurrences past the one named in full carry only their kind's marker: say which is which.
    handles += [Line2D([], [], marker=_labels.PATTERN_MARKERS.get(k, "o"), color="none", markerfacecolor="white",
                       markeredgecolor="#1b1b1b", markersize=6, label=k) for k in repeated]
    return handles


def _legends(fig, lay, groups, rows, height):
    """The band colours on one legend, the phases and marks under it: each as many rows as it needs."""
    row_px = lay.px(LEGEND_PT) * 1.9
    below = np.cumsum([0] + rows[::-1])[::-1][1:]  # rows under each group
    for handles, r, under in zip(groups, rows, below.tolist()):
        if handles and r:
            fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, under * row_px / height),
                       ncol=-(-len(handles) // r), frameon=False, fontsize=LEGEND_PT, handlelength=1.6,
                       columnspacing=1.4, borderaxespad=0.3, borderpad=0.2, labelspacing=0.35)
