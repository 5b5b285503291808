"""The labeled picture: memory over the trace, each step's phases shaded and named, peaks marked.

matplotlib is imported here and nowhere else. Figures are built on ``matplotlib.figure.Figure``
with an Agg canvas of their own, so drawing never touches (or depends on) the user's backend or
pyplot state. Everything is laid out in pixels from ``size`` and ``dpi``, which keeps the output
exactly ``size`` pixels and lets text be measured before it is placed: labels that would not fit
their span, or would overlap a label already placed, are left out rather than drawn on top of
each other.

The curve is never drawn point by point: each pixel column of the axes gets the min and max of
the events that fall in it (``np.maximum.reduceat``), so a million-event trace costs the same to
draw as a thousand-event one and no one-event spike is lost.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from matplotlib import colors as mcolors
from matplotlib import transforms
from matplotlib.collections import PolyCollection
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator

from .errors import PhasememError
from .output import atomic_write
from .units import format_bytes

#: One colour per phase, the same in every picture; ``other`` is left unshaded.
PHASE_COLORS = {
    "forward": "#4e79a7",
    "loss": "#f28e2b",
    "zero_grad": "#b07aa1",
    "backward": "#e15759",
    "optimizer": "#59a14f",
}
_SHORT = {"forward": "fwd", "loss": "loss", "zero_grad": "zero", "backward": "bwd", "optimizer": "opt"}

# Below these widths per step, step lines and per-phase peak dots are left out (too dense to read).
_MIN_STEP_LINE_PX, _MIN_STEP_DOTS_PX = 6, 12

_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}

_CURVE = "#22313f"
_FILL = "#5d7286"
_RESERVED = "#7a7a7a"
_PEAK = "#c0392b"

# Font sizes in points; pixel sizes follow from the dpi.
_TITLE_PT, _STEP_PT, _STRIP_PT, _PEAK_PT, _TICK_PT, _LABEL_PT, _LEGEND_PT = 11.5, 8.5, 7.5, 7.5, 8.5, 9.5, 8.5


def plot(report, *, size=(1600, 900), dpi=100, by="event", steps=None) -> Figure:
    """The labeled memory picture of a report as a matplotlib Figure.

    ``size`` is the output in pixels (width, height); ``by`` is ``"event"`` (x = position in the
    allocator trace, as memory_viz numbers events) or ``"time"`` (seconds since the first event);
    ``steps`` draws only the given step numbers (``Step.number``), e.g. ``range(2, 4)`` to zoom.

    Example:
        >>> fig = phasemem.render.plot(report, size=(1200, 600))
        >>> fig.savefig("memory.png")   # or report.save_png("memory.png")
    """
    width, height = _check_size(size, dpi)
    if by not in ("event", "time"):
        raise ValueError(f"by={by!r}: use 'event' or 'time'")
    tl = getattr(report, "timeline", None)
    if tl is None or report.label_codes is None:
        raise ValueError("this report carries no timeline; build it with phasemem.analyze()")

    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, facecolor="white")
    canvas = FigureCanvasAgg(fig)
    lay = _Layout(canvas, width, height, dpi)

    n = report.n_events
    a, b, shown = _visible(report, steps)
    if by == "time":
        t = report.trace.time_us
        X = np.empty(n + 1, dtype=np.float64)
        X[:n] = (t - t[0]) / 1e6
        X[n] = X[n - 1] + max((X[n - 1] - X[0]) / max(n - 1, 1), 1e-6)
    else:
        X = np.arange(n + 1, dtype=np.float64)

    after = tl.active_after
    reserved = tl.reserved_after
    # The CPU profiler has no caching allocator, hence no reserved memory: no line at zero.
    show_reserved = report.reserved_peak_bytes > 0
    unit_div, unit = _unit(max(int(after[a:b].max()), int(reserved[a:b].max()) if show_reserved else 0, 1))

    # Legend first: how many rows it needs decides how tall the axes can be.
    present = [p for p in PHASE_COLORS if any(p in st.phases and st.phases[p].n_events for st in shown)]
    handles = _legend_handles(present, report, show_reserved)
    ax_box, legend_rows = lay.axes_box(handles)
    ax = fig.add_axes(ax_box)
    ax_w_px, ax_h_px = ax_box[2] * width, ax_box[3] * height
    ncols = max(int(ax_w_px), 1)

    edges, lo, hi, res_hi = _envelope(X, after, reserved, a, b, ncols)
    strip_px = lay.px(_STRIP_PT) * 1.9
    # Room between the highest value and the strip for the tallest label there: the overall peak's.
    headroom_px = strip_px + lay.text_size("peak 0.00 GiB", _PEAK_PT + 1, "bold")[1] + lay.px(3) + 10
    data_top = max(float(hi.max()), float(res_hi.max()) if show_reserved else 0.0, 1.0) / unit_div
    y_top = data_top / max(1 - headroom_px / ax_h_px, 0.5)
    ax.set_xlim(X[a], X[b])
    ax.set_ylim(0, y_top)
    strip_frac = strip_px / ax_h_px

    view = _View(ax_box, width, height, X[a], X[b], y_top)
    runs = _runs(report.label_codes, report.step_of, a, b)
    _shade_phases(ax, lay, view, X, runs, a, b, strip_frac)
    _draw_curve(ax, edges, lo / unit_div, hi / unit_div, res_hi / unit_div if show_reserved else None)
    _step_marks(ax, lay, view, X, shown, a, b)
    _peaks(ax, lay, view, X, report, shown, runs, unit_div, a, b)
    _axes_style(ax, by, unit)
    _title(fig, lay, report, shown, width, height)
    if handles:
        fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=-(-len(handles) // legend_rows),
                   frameon=False, fontsize=_LEGEND_PT, handlelength=1.6, columnspacing=1.4, borderaxespad=0.3)
    return fig


def save(report, path, **options) -> None:
    """Draw the picture to ``path``: PNG, SVG or PDF by extension, written atomically.

    Example:
        >>> phasemem.render.save(report, "memory.svg", size=(1200, 600))
    """
    fmt = _FORMATS.get(os.path.splitext(os.fspath(path))[1].lower())
    if fmt is None:
        raise PhasememError(f"{os.fspath(path)}: cannot draw this format; name the picture .png, .svg or .pdf")
    fig = plot(report, **options)

    def write(tmp):
        # savefig's own dpi default comes from rcParams; pin it so the pixel size is the one asked for.
        fig.savefig(tmp, format=fmt, dpi=fig.dpi, facecolor="white")

    atomic_write(path, write)


# -- layout ---------------------------------------------------------------------------------------


def _check_size(size, dpi) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in size)
    except (TypeError, ValueError):
        raise ValueError(f"size={size!r}: give (width, height) in pixels") from None
    if not (64 <= w <= 20000 and 64 <= h <= 20000):
        raise ValueError(f"size={size!r}: width and height must be between 64 and 20000 pixels")
    if not 10 <= dpi <= 2000:
        raise ValueError(f"dpi={dpi!r}: use 10 to 2000")
    return w, h


class _Layout:
    """Pixel geometry of the figure and text measurement with the figure's own renderer."""

    def __init__(self, canvas, width, height, dpi):
        self.width, self.height, self.dpi = width, height, dpi
        self.renderer = canvas.get_renderer()
        self._fonts: dict = {}
        self._sizes: dict = {}

    def px(self, pt: float) -> float:
        return pt * self.dpi / 72

    def text_size(self, s: str, pt: float, weight: str = "normal") -> tuple[float, float]:
        # Measuring is a FreeType layout (~0.1 ms); the same few strings recur in every step.
        key = (s, pt, weight)
        size = self._sizes.get(key)
        if size is None:
            font = self._fonts.get((pt, weight))
            if font is None:
                font = self._fonts[(pt, weight)] = FontProperties(size=pt, weight=weight)
            w, h, _ = self.renderer.get_text_width_height_descent(s, font, ismath=False)
            size = self._sizes[key] = (w, h)
        return size

    def fits(self, s: str, pt: float, room: float, weight: str = "normal") -> bool:
        """Whether ``s`` is narrower than ``room`` pixels (with a little air)."""
        # No glyph of this font is narrower than about a third of an em: a cheap no for
        # hundreds of narrow spans, before any measuring.
        if len(s) * self.px(pt) * 0.3 + 4 > room:
            return False
        return self.text_size(s, pt, weight)[0] + 4 <= room

    def axes_box(self, handles) -> tuple[list[float], int]:
        """The axes rectangle in figure fractions, and the number of legend rows below it."""
        W, H = self.width, self.height
        left = self.text_size("00.00", _TICK_PT)[0] + self.px(_LABEL_PT) * 2.2 + 8
        right = self.px(_TICK_PT) * 1.5
        top = self.px(_TITLE_PT) * 1.9 + self.px(_STEP_PT) * 1.9
        rows = 1
        if handles:
            # handle + gap + text + column spacing, in font sizes as fig.legend lays them out below
            item = [self.text_size(h.get_label(), _LEGEND_PT)[0] + self.px(_LEGEND_PT) * 3.6 for h in handles]
            rows = 1
            while rows < len(handles) and _legend_width(item, rows) > W - 20:
                rows += 1
        bottom = self.px(_TICK_PT) * 2.0 + self.px(_LABEL_PT) * 1.8 + rows * self.px(_LEGEND_PT) * 1.9 + 6
        w = max(W - left - right, 16)
        h = max(H - top - bottom, 16)
        return [left / W, bottom / H, w / W, h / H], rows


def _legend_width(item, rows) -> float:
    # fig.legend fills columns top to bottom; each column is as wide as its widest entry.
    per_col = -(-len(item) // rows)
    return sum(max(item[c * rows:(c + 1) * rows]) for c in range(per_col) if item[c * rows:(c + 1) * rows])


@dataclass
class _View:
    """Data → figure-pixel mapping of the axes, known before drawing because the box is fixed."""

    box: list
    width: int
    height: int
    x0: float
    x1: float
    y1: float

    def x_px(self, x):
        return (self.box[0] + self.box[2] * (np.asarray(x, dtype=float) - self.x0) / (self.x1 - self.x0)) * self.width

    def y_px(self, y):
        return (self.box[1] + self.box[3] * np.asarray(y, dtype=float) / self.y1) * self.height


class _Boxes:
    """Text boxes already placed, in pixels; a new text is drawn only where it overlaps none."""

    def __init__(self):
        self.boxes: list[tuple[float, float, float, float]] = []

    def free(self, x0, x1, y0, y1, pad=2.0) -> bool:
        return not any(x0 - pad < bx1 and bx0 < x1 + pad and y0 - pad < by1 and by0 < y1 + pad
                       for bx0, bx1, by0, by1 in self.boxes)

    def add(self, x0, x1, y0, y1) -> None:
        self.boxes.append((x0, x1, y0, y1))


# -- data -----------------------------------------------------------------------------------------


def _visible(report, steps):
    """The event range to draw and the steps in it."""
    n = report.n_events
    if steps is None:
        return 0, n, list(report.steps)
    wanted = {int(steps)} if isinstance(steps, (int, np.integer)) else {int(s) for s in steps}
    shown = [st for st in report.steps if st.number in wanted]
    if not shown:
        have = [st.number for st in report.steps]
        raise ValueError(f"steps={sorted(wanted)}: this report has steps {have[0]}..{have[-1]}" if have
                         else "this report has no steps")
    a, b = min(st.start_event for st in shown), max(st.end_event for st in shown) + 1
    # A step that made no event still gets drawn: as the one event where it ended.
    return min(a, n - 1), max(b, min(a + 1, n)), shown


@dataclass
class _Runs:
    """Maximal stretches of events with one phase and one step: [first, last] inclusive."""

    first: np.ndarray
    last: np.ndarray
    code: np.ndarray  # index into segment.PHASES


def _runs(label_codes, step_of, a, b) -> _Runs:
    """The runs that overlap the events drawn, [a, b) (the caller clips the outer two)."""
    from .segment import runs

    # A slice is enough: a run cut at a or b is clipped to the view anyway.
    first, last, code, _ = runs(label_codes[a:b], step_of[a:b])
    return _Runs(first + a, last + a, code)


def _unit(top: int) -> tuple[float, str]:
    for div, name in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if top >= div:
            return float(div), name
    return 1.0, "B"


def _envelope(X, after, reserved, a, b, ncols):
    """Per-pixel-column (edges, min, max) of the active curve and max of reserved over events [a, b).

    With no more events than columns each event is its own column, drawn exactly.
    """
    if b - a <= ncols:
        seg, res = after[a:b], reserved[a:b]
        return X[a:b + 1], seg, seg, res
    edges = np.linspace(X[a], X[b], ncols + 1)
    # The event covering each column's left edge starts that column's group; a column no event
    # starts in repeats its covering event, which reduceat does for non-increasing indices.
    first = np.clip(np.searchsorted(X[a:b + 1], edges[:-1], "right") - 1, 0, b - a - 1)
    seg, res = after[a:b], reserved[a:b]
    return edges, np.minimum.reduceat(seg, first), np.maximum.reduceat(seg, first), np.maximum.reduceat(res, first)


# -- drawing --------------------------------------------------------------------------------------


def _draw_curve(ax, edges, lo, hi, res):
    lo_e, hi_e = np.append(lo, lo[-1]), np.append(hi, hi[-1])
    ax.fill_between(edges, 0, hi_e, step="post", color=_FILL, alpha=0.45, lw=0, zorder=2)
    # The min–max band is the curve itself at pixel resolution: dark where memory moves within a column.
    ax.fill_between(edges, lo_e, hi_e, step="post", color=_CURVE, alpha=0.9, lw=0, zorder=3)
    ax.step(edges, hi_e, where="post", color=_CURVE, lw=1.0, zorder=3)
    if res is not None:
        ax.step(edges, np.append(res, res[-1]), where="post", color=_RESERVED, lw=0.9, zorder=3.5)


def _shade_phases(ax, lay, view, X, runs, a, b, strip_frac):
    """Each phase occurrence: a light band over the plot, a solid cell in the strip, its name if it fits."""
    from .segment import PHASES

    colors = np.array([mcolors.to_rgba(PHASE_COLORS.get(p, "none")) for p in PHASES])
    shaded = np.array([p in PHASE_COLORS for p in PHASES])[runs.code]
    first, last, code = runs.first[shaded], runs.last[shaded], runs.code[shaded]
    x0, x1 = X[np.maximum(first, a)], X[np.minimum(last + 1, b)]
    # One collection per layer, not one patch per occurrence: 400 steps would be 2,000 patches.
    for y0, y1, alpha, z in ((0, 1 - strip_frac, 0.14, 0), (1 - strip_frac, 1, 0.95, 1)):
        verts = np.empty((len(x0), 4, 2))
        verts[:, :, 0] = np.stack([x0, x0, x1, x1], axis=1)
        verts[:, :, 1] = [y0, y1, y1, y0]
        fc = colors[code].copy()
        fc[:, 3] = alpha
        ax.add_collection(PolyCollection(verts, facecolors=fc, edgecolors="none", linewidths=0,
                                         transform=ax.get_xaxis_transform(), zorder=z), autolim=False)
    spans = view.x_px(x1) - view.x_px(x0)
    for xa, xb, c, span in zip(x0.tolist(), x1.tolist(), code.tolist(), spans.tolist()):
        phase = PHASES[c]
        for name in (phase, _SHORT[phase]):
            if lay.fits(name, _STRIP_PT, span, "bold"):
                ax.text((xa + xb) / 2, 1 - strip_frac / 2, name, transform=ax.get_xaxis_transform(),
                        ha="center", va="center", fontsize=_STRIP_PT, color="white", fontweight="bold",
                        zorder=6, clip_on=True)
                break


def _step_marks(ax, lay, view, X, shown, a, b):
    """Vertical lines between steps and the step numbers above the axes."""
    bounds = sorted({st.start_event for st in shown if st.start_event > a} | {st.end_event + 1 for st in shown})
    # A line every few pixels is a grey wall that hides the curve; the strip still shows the steps' rhythm.
    xs = [X[e] for e in bounds if a < e < b] if _step_px(view, X, shown, a, b).mean() >= _MIN_STEP_LINE_PX else []
    if xs:
        ax.vlines(xs, 0, 1, transform=ax.get_xaxis_transform(), colors="#222222", lw=0.8, alpha=0.6, zorder=4)
    placed = _Boxes()
    top_px = (view.box[1] + view.box[3]) * view.height
    for st in shown:
        x0, x1 = X[max(st.start_event, a)], X[min(st.end_event + 1, b)]
        cx = float(view.x_px((x0 + x1) / 2))
        span = float(view.x_px(x1) - view.x_px(x0))
        tag = "" if st.complete else "*"
        for label in (f"step {st.number}{tag}", f"{st.number}{tag}"):
            if not lay.fits(label, _STEP_PT, span):
                continue
            w, h = lay.text_size(label, _STEP_PT)
            if placed.free(cx - w / 2, cx + w / 2, top_px, top_px + h):
                placed.add(cx - w / 2, cx + w / 2, top_px, top_px + h)
                ax.annotate(label, xy=((x0 + x1) / 2, 1), xycoords=ax.get_xaxis_transform(), xytext=(0, 3),
                            textcoords="offset points", ha="center", va="bottom", fontsize=_STEP_PT,
                            color="#222222" if st.complete else "#777777", annotation_clip=False)
                break


def _step_px(view, X, shown, a, b) -> np.ndarray:
    """How many pixels wide each shown step is drawn."""
    first = np.array([max(st.start_event, a) for st in shown], dtype=np.int64)
    stop = np.array([min(st.end_event + 1, b) for st in shown], dtype=np.int64)
    return view.x_px(X[stop]) - view.x_px(X[first]) if len(shown) else np.zeros(1)


def _peaks(ax, lay, view, X, report, shown, runs, unit_div, a, b):
    """A dot at every phase's peak in every step, with its size where there is room; the overall peak in red."""
    # Dots for steps too narrow to tell them apart would only draw a dotted line across the picture.
    wide = _step_px(view, X, shown, a, b) >= _MIN_STEP_DOTS_PX
    pts = [(ph.peak_event, ph.peak_bytes, name) for st, ok in zip(shown, wide) if ok
           for name, ph in st.phases.items() if name in PHASE_COLORS and ph.peak_event is not None]
    if pts:
        ev = np.array([p[0] for p in pts])
        ax.scatter(X[ev], np.array([p[1] for p in pts]) / unit_div, s=16, c=[PHASE_COLORS[p[2]] for p in pts],
                   edgecolors="#1b1b1b", linewidths=0.6, zorder=7)

    placed = _Boxes()
    lo_x, hi_x = view.box[0] * view.width, (view.box[0] + view.box[2]) * view.width
    top_px = (view.box[1] + view.box[3]) * view.height
    lift = lay.px(3)  # text sits 3 pt above its dot
    # The overall peak first: it is drawn whatever else must give way.
    pe = report.peak_event
    if a <= pe < b:
        ax.scatter([X[pe]], [report.peak_bytes / unit_div], s=70, facecolors="none", edgecolors=_PEAK,
                   linewidths=1.6, zorder=8)
        ax.scatter([X[pe]], [report.peak_bytes / unit_div], s=18, c=_PEAK, zorder=8)
        label = f"peak {format_bytes(report.peak_bytes)}"
        w, h = lay.text_size(label, _PEAK_PT + 1, "bold")
        cx = float(np.clip(view.x_px(X[pe]), lo_x + w / 2 + 2, hi_x - w / 2 - 2))
        y0 = float(view.y_px(report.peak_bytes / unit_div)) + lift + 4  # clear of the ring
        placed.add(cx - w / 2, cx + w / 2, y0, y0 + h)
        _label(ax, view, cx, report.peak_bytes / unit_div, label, _PEAK_PT + 1, lift + 4, color=_PEAK, weight="bold")

    if not pts:
        return
    # Which run holds each peak: its text must fit inside that run.
    for e, size, name in sorted(pts, key=lambda p: -p[1]):
        if e == pe:
            continue
        k = int(np.searchsorted(runs.first, e, "right")) - 1
        if k < 0:
            continue
        x0, x1 = float(view.x_px(X[max(runs.first[k], a)])), float(view.x_px(X[min(runs.last[k] + 1, b)]))
        label = format_bytes(size)
        if not lay.fits(label, _PEAK_PT, x1 - x0):
            continue
        w, h = lay.text_size(label, _PEAK_PT)
        cx = float(np.clip(view.x_px(X[e]), x0 + w / 2 + 2, x1 - w / 2 - 2))
        y0 = float(view.y_px(size / unit_div)) + lift
        if y0 + h > top_px or not placed.free(cx - w / 2, cx + w / 2, y0, y0 + h):
            continue
        placed.add(cx - w / 2, cx + w / 2, y0, y0 + h)
        _label(ax, view, cx, size / unit_div, label, _PEAK_PT, lift)


def _label(ax, view, cx_px, y, text, pt, lift_px, color="#1b1b1b", weight="normal"):
    # x is given in figure pixels (the text was clamped into its span there), y in data units.
    x = view.x0 + (cx_px / view.width - view.box[0]) / view.box[2] * (view.x1 - view.x0)
    ax.text(x, y, text, ha="center", va="bottom", fontsize=pt, color=color, fontweight=weight, zorder=9,
            transform=transforms.offset_copy(ax.transData, fig=ax.figure, y=lift_px, units="dots"),
            bbox=dict(boxstyle="square,pad=0.12", fc="white", ec="none", alpha=0.75))


def _axes_style(ax, by, unit):
    ax.set_ylabel(f"allocated memory ({unit})", fontsize=_LABEL_PT)
    ax.set_xlabel("event (position in the allocator trace)" if by == "event" else "time since the first event (s)",
                  fontsize=_LABEL_PT)
    ax.tick_params(labelsize=_TICK_PT)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=10, integer=by == "event"))
    if by == "event":
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{int(v):,}"))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=8))
    ax.grid(axis="y", color="#dddddd", lw=0.6, zorder=-1)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _title(fig, lay, report, shown, width, height):
    where = ""
    if report.step_of is not None and report.step_of[report.peak_event] >= 0:
        st = report.steps[int(report.step_of[report.peak_event])]
        from .segment import PHASES

        where = f" in step {st.number} {PHASES[int(report.label_codes[report.peak_event])]}"
    left = f"{report.device} — peak {format_bytes(report.peak_bytes)} allocated{where}"
    right = f"{report.n_events:,} events · {len(report.steps)} step{'s' * (len(report.steps) != 1)}"
    if len(shown) != len(report.steps):
        right += f" (showing {len(shown)})"
    y = 1 - lay.px(_TITLE_PT) * 0.5 / height
    margin = lay.px(_TICK_PT) * 1.5
    wl, _ = lay.text_size(left, _TITLE_PT, "bold")
    wr, _ = lay.text_size(right, _TITLE_PT)
    fig.text(margin / width, y, left, ha="left", va="top", fontsize=_TITLE_PT, fontweight="bold")
    # The right part gives way on narrow pictures rather than run into the left one.
    if wl + wr + 3 * margin <= width:
        fig.text(1 - margin / width, y, right, ha="right", va="top", fontsize=_TITLE_PT, color="#444444")


def _legend_handles(present, report, show_reserved):
    handles = [Patch(facecolor=PHASE_COLORS[p], edgecolor="none", label=p) for p in present]
    handles.append(Patch(facecolor=_FILL, edgecolor=_CURVE, alpha=0.8, label="allocated"))
    if show_reserved:
        handles.append(Line2D([], [], color=_RESERVED, lw=1.2,
                              label=f"reserved (peak {format_bytes(report.reserved_peak_bytes)})"))
    handles += [
        Line2D([], [], marker="o", color="none", markerfacecolor="#dddddd", markeredgecolor="#1b1b1b",
               markersize=5, label="phase peak"),
        Line2D([], [], marker="o", color="none", markerfacecolor=_PEAK, markeredgecolor=_PEAK,
               markersize=6, label="overall peak"),
    ]
    return handles
