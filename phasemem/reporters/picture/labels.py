"""Text on the picture: measured before it is placed, and placed only where it overlaps nothing.

Everything here works in figure pixels, which are known before drawing because the axes box is
fixed from ``size`` and ``dpi``: a label is drawn only if its box fits its span and is clear of
every box already placed, so no two texts ever overlap whatever the number of steps.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from matplotlib import transforms
from matplotlib.font_manager import FontProperties

from ...analysis.patterns import BY_NAME
from ...units import format_bytes
from . import layout
from .textcache import metrics as _metrics
from .textcache import share_font_heights

# Font sizes in points; pixel sizes follow from the dpi.
TITLE_PT, STEP_PT, STRIP_PT, PEAK_PT, TICK_PT, LABEL_PT, LEGEND_PT, CALLOUT_PT = 11.5, 8.5, 7.5, 7.5, 8.5, 9.5, 8.5, 8.0

PEAK = "#c0392b"
_CALLOUT_INK = "#1b1b1b"

#: ``Layout.fits``: no glyph is narrower than this share of an em (a cheap no before measuring), and a
#: text fits a span with this many pixels to spare.
GLYPH_EM_MIN, FIT_AIR_PX = 0.3, 4
#: Pixels under the x axis' label, before the legends.
AXIS_AIR_PX = 6
#: Room left of the axes for the y axis' label, in label font sizes, and pixels of air beside it.
Y_LABEL_EM, LEFT_AIR_PX = 2.2, 8
#: Above the axes: the title's row (title font sizes) and the step numbers' row (step font sizes).
TITLE_ROW_EM, STEP_ROW_EM = 1.9, 1.9
#: A small picture drops legends (the lowest first) before its plot gets less than this share of the
#: height under the title.
MIN_PLOT_SHARE = 0.45
#: Text boxes' opacity: the phase peaks' sizes (the bands show through a little), the callouts' (less).
TEXT_BOX_ALPHA, CALLOUT_BOX_ALPHA = 0.75, 0.85
#: A kind's occurrences tried for its named callout: the largest this many.
CALLOUT_TRIES = 8
#: Where a callout is tried, nearest first: pixels above its peak; then beside it (half its height
#: down, centred on the peak's height) and below it, these many pixels under.
CALLOUT_LIFTS_PX = (18, 34, 52, 72, 96, 124, 156, 192, 236)
CALLOUT_DROPS_PX = (24, 56)
#: A callout's sideways offsets tried: its half width plus this, then its whole width plus that.
CALLOUT_NUDGE_PX, CALLOUT_SHIFT_PX = 10, 24
#: The callout's arrow: its width, and the points it stops short of the peak's marker.
CALLOUT_ARROW_LW, CALLOUT_ARROW_SHORT = 0.7, 4
#: Pattern markers' area in points² (an optimizer state's first creation, rare and large, twice as
#: big), and their edge's width.
MARKER_AREA, INIT_MARKER_AREA, MARKER_LW = 30, 60, 0.9
#: The phase peaks' dots: area in points², edge width.
PHASE_DOT_AREA, PHASE_DOT_LW = 16, 0.6
#: The overall peak: its red ring's area and width, the dot inside it, and the ring's half size in
#: pixels (kept clear of text).
PEAK_RING_AREA, PEAK_RING_LW, PEAK_DOT_AREA, PEAK_RING_PX = 70, 1.6, 18, 6
#: Peak sizes sit this many points above their dot; the overall peak's this many pixels more (its ring).
PEAK_LIFT_PT, RING_LIFT_PX = 3, 4



class Layout:
    """Pixel geometry of the figure and text measurement with the figure's own renderer."""

    def __init__(self, canvas, width, height, dpi):
        self.width, self.height, self.dpi = width, height, dpi
        self.renderer = canvas.get_renderer()
        share_font_heights(self.renderer)
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
            w, h, _ = _metrics(self.renderer, s, font, False, self.dpi)
            size = self._sizes[key] = (w, h)
        return size

    def fits(self, s: str, pt: float, room: float, weight: str = "normal") -> bool:
        """Whether ``s`` is narrower than ``room`` pixels (with a little air)."""
        # No glyph of this font is narrower than about a third of an em: a cheap no for
        # hundreds of narrow spans, before any measuring.
        if len(s) * self.px(pt) * GLYPH_EM_MIN + FIT_AIR_PX > room:
            return False
        return self.text_size(s, pt, weight)[0] + FIT_AIR_PX <= room

    def axis_px(self) -> float:
        """The room under the axes for the x axis' ticks and label (the legends go under it)."""
        return self.px(TICK_PT) * layout.AXIS_TICKS_EM + self.px(LABEL_PT) * layout.AXIS_LABEL_EM + AXIS_AIR_PX

    def axes_box(self, groups, right_px: float = 0.0) -> tuple[tuple[float, float, float, float], list[int]]:
        """The axes rectangle in figure fractions, and how many rows each legend group below it needs;
        ``right_px`` more pixels are kept free right of it (the peak's bar)."""
        W, H = self.width, self.height
        left = self.text_size(layout.Y_TICK_SAMPLE, TICK_PT)[0] + self.px(LABEL_PT) * Y_LABEL_EM + LEFT_AIR_PX
        right = self.px(TICK_PT) * layout.MARGIN_EM + right_px
        top = self.px(TITLE_PT) * TITLE_ROW_EM + self.px(STEP_PT) * STEP_ROW_EM
        rows = []
        for handles in groups:
            # handle + gap + text + column spacing, in font sizes as fig.legend lays them out
            item = [self.text_size(h.get_label(), LEGEND_PT)[0] + self.px(LEGEND_PT) * layout.LEGEND_ENTRY_EM
                    for h in handles]
            r = 1
            while r < len(handles) and legend_width(item, r) > W - layout.LEGEND_MARGIN_PX:
                r += 1
            rows.append(r if handles else 0)
        axis = self.axis_px()
        # A small picture keeps its plot: legends give way (the lowest first) rather than squash it.
        while sum(rows) and (H - top - axis - sum(rows) * self.px(LEGEND_PT) * layout.LEGEND_ROW_EM
               < MIN_PLOT_SHARE * (H - top - axis)):
            rows[max(k for k, r in enumerate(rows) if r)] = 0
        bottom = axis + sum(rows) * self.px(LEGEND_PT) * layout.LEGEND_ROW_EM
        w = max(W - left - right, layout.MIN_AXES_PX)
        h = max(H - top - bottom, layout.MIN_AXES_PX)
        return (left / W, bottom / H, w / W, h / H), rows


def legend_width(item, rows) -> float:
    # fig.legend fills columns top to bottom; each column is as wide as its widest entry.
    per_col = -(-len(item) // rows)
    return sum(max(item[c * rows:(c + 1) * rows]) for c in range(per_col) if item[c * rows:(c + 1) * rows])


@dataclass
class View:
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

    def x_data(self, px):
        return self.x0 + (np.asarray(px, dtype=float) / self.width - self.box[0]) / self.box[2] * (self.x1 - self.x0)

    def y_data(self, px):
        return (np.asarray(px, dtype=float) / self.height - self.box[1]) / self.box[3] * self.y1

    @property
    def left_px(self) -> float:
        return self.box[0] * self.width

    @property
    def right_px(self) -> float:
        return (self.box[0] + self.box[2]) * self.width

    @property
    def bottom_px(self) -> float:
        return self.box[1] * self.height

    @property
    def top_px(self) -> float:
        return (self.box[1] + self.box[3]) * self.height


class Boxes:
    """Text boxes already placed, in pixels; a new text is drawn only where it overlaps none."""

    def __init__(self):
        self.boxes: list[tuple[float, float, float, float]] = []

    def free(self, x0, x1, y0, y1, pad=2.0) -> bool:
        return not any(x0 - pad < bx1 and bx0 < x1 + pad and y0 - pad < by1 and by0 < y1 + pad
                       for bx0, bx1, by0, by1 in self.boxes)

    def add(self, x0, x1, y0, y1) -> None:
        self.boxes.append((x0, x1, y0, y1))

    def crosses(self, x0, y0, x1, y1, spare=10.0) -> bool:
        """Whether the segment from (x0, y0) to (x1, y1) runs through a box, its last ``spare``
        pixels aside (an arrow may end at a marker that something else also points at)."""
        if not self.boxes:
            return False
        length = float(np.hypot(x1 - x0, y1 - y0))
        if length <= spare:
            return False
        t = np.linspace(0, 1 - spare / length, max(int(length / 2), 2))
        xs, ys = x0 + t * (x1 - x0), y0 + t * (y1 - y0)
        b = np.array(self.boxes)
        inside = ((xs[:, None] > b[:, 0] - 1) & (xs[:, None] < b[:, 1] + 1)
                  & (ys[:, None] > b[:, 2] - 1) & (ys[:, None] < b[:, 3] + 1))
        return bool(inside.any())

    def add_segment(self, x0, y0, x1, y1, half=3.0, open_end=16.0) -> None:
        """Keep text off a drawn line (a callout's arrow): small boxes along it, but for its last
        ``open_end`` pixels, where another arrow to the same peak may join it."""
        length = float(np.hypot(x1 - x0, y1 - y0))
        if length <= open_end:
            return
        for t in np.linspace(0, 1 - open_end / length, max(int(length / 4), 2)).tolist():
            x, y = x0 + t * (x1 - x0), y0 + t * (y1 - y0)
            self.boxes.append((x - half, x + half, y - half, y + half))


def text_at(ax, view, cx_px, y, text, pt, lift_px, color="#1b1b1b", weight="normal", gid=None):
    """Text centred at figure-pixel x ``cx_px`` (clamped into its span there), ``lift_px`` above data y."""
    x = float(view.x_data(cx_px))
    return ax.text(x, y, text, ha="center", va="bottom", fontsize=pt, color=color, fontweight=weight, zorder=9,
                   transform=transforms.offset_copy(ax.transData, fig=ax.figure, y=lift_px, units="dots"),
                   bbox=dict(boxstyle="square,pad=0.12", fc="white", ec="none", alpha=TEXT_BOX_ALPHA), gid=gid)


class Curve:
    """The top of the stack in pixels, per column: where text would cover the memory drawn."""

    def __init__(self, view: View, edges: np.ndarray, top: np.ndarray):
        self.view = view
        self.edges = edges
        self.top_px = view.y_px(top)

    def max_under(self, x0_px: float, x1_px: float) -> float:
        lo, hi = self.view.x_data([x0_px, x1_px])
        k0 = max(int(np.searchsorted(self.edges, lo, "right")) - 1, 0)
        k1 = min(int(np.searchsorted(self.edges, hi, "left")), len(self.top_px))
        return float(self.top_px[k0:max(k1, k0 + 1)].max()) if len(self.top_px) else self.view.bottom_px


@dataclass
class Callouts:
    """What became of each pattern in view: labelled in full, marked, or left out as too dense."""

    full: list  # the patterns with a text callout
    marked: int  # occurrences drawn as a bare marker
    skipped: int  # occurrences left out because the steps are too narrow to mark each


def callouts(ax, lay: Layout, view: View, curve: Curve, placed: Boxes, patterns, X, level, unit_div,
             ceiling_px: float, dense: bool) -> Callouts:
    """Every pattern (``patterns``, a ``PatternTable``) as a callout: one occurrence per kind named in
    full (``"<kind> <size>"``, an arrow to its peak at the height memory reaches there), the others
    marked with the kind's marker.

    The occurrence named is the largest one that finds room, tried largest first; the callout goes
    above the memory drawn where it can, else anywhere clear of other text, else nowhere (its peak
    keeps its marker). With ``dense`` (steps only a few pixels wide) only the named ones are marked.

    Example:
        >>> table = PatternTable.of(report.patterns)
        >>> done = callouts(ax, lay, view, curve, placed, table, X, tl.level, 2**30, ceiling, False)
        >>> [p.kind for p in done.full], done.marked
    """
    size, peak = patterns.size, patterns.peak
    by_kind = patterns.by_kind()
    # Larger kinds first: they get the best spots.
    order = sorted(by_kind, key=lambda k: -size[by_kind[k]].max())
    full, named = [], set()
    for kind in order:
        idx = by_kind[kind]
        # The CALLOUT_TRIES largest, ties by peak event then pattern order (lexsort is stable).
        for i in idx[np.lexsort((peak[idx], -size[idx]))[:CALLOUT_TRIES]].tolist():
            if _place_callout(ax, lay, view, curve, placed, patterns.pattern(i), X, level, unit_div, ceiling_px):
                full.append(patterns.pattern(i))
                named.add(i)
                break
    marked = skipped = 0
    for kind in order:
        idx = by_kind[kind]
        is_named = np.isin(idx, list(named))
        pts = idx if not dense else idx[is_named]
        skipped += len(idx) - len(pts)
        marked += int(len(pts) - is_named.sum()) if not dense else 0
        if not len(pts):
            continue
        ev = peak[pts]
        # each kind's own marker (its ShapeKind's), at the tip of its callout and at every other occurrence
        ax.scatter((X[ev] + X[ev + 1]) / 2, level[ev] / unit_div, marker=BY_NAME[kind].marker,
                   s=MARKER_AREA if kind != "optimizer_state_init" else INIT_MARKER_AREA, facecolors="white",
                   edgecolors=BY_NAME[kind].colour,
                   linewidths=MARKER_LW, zorder=8.5, gid="pattern-marker", label=kind)
    return Callouts(full, marked, skipped)


def callout_text(p) -> str:
    """A shape's callout: its kind and the figure the report's list of shapes gives it (the
    occurrence's whole size, ``Pattern.bytes``; what of it was alive at the peak is the peak bar's).

    Example:
        >>> callout_text(report.patterns_of("logits")[0])
        'logits 250.0 MiB'
    """
    return f"{p.kind} {format_bytes(p.bytes)}"


def _place_callout(ax, lay, view, curve, placed, p, X, level, unit_div, ceiling_px) -> bool:
    label = callout_text(p)
    w, h = lay.text_size(label, CALLOUT_PT)
    e = int(p.peak_event)
    xd, yd = (X[e] + X[e + 1]) / 2, level[e] / unit_div
    px, py = float(view.x_px(xd)), float(view.y_px(yd))
    lo_x, hi_x = view.left_px + 2, view.right_px - 2
    best = None
    # Above the peak first, nearest first; beside or below it (over the bands) only as a last resort.
    for dy in (*CALLOUT_LIFTS_PX, -h / 2, -h - CALLOUT_DROPS_PX[0], -h - CALLOUT_DROPS_PX[1]):
        for dx in (0.0, -(w / 2 + CALLOUT_NUDGE_PX), w / 2 + CALLOUT_NUDGE_PX, -(w + CALLOUT_SHIFT_PX),
                   w + CALLOUT_SHIFT_PX):
            cx = px + dx
            x0, x1 = cx - w / 2 - 2, cx + w / 2 + 2
            y0, y1 = py + dy, py + dy + h + 3
            if x0 < lo_x or x1 > hi_x or y1 > ceiling_px or y0 < view.bottom_px + 2:
                continue
            if not placed.free(x0, x1, y0, y1) or placed.crosses(cx, y0, px, py):
                continue
            if curve.max_under(x0, x1) <= y0 - 2:
                best = (cx, y0, x0, x1, y1)
                break
            if best is None:
                best = (cx, y0, x0, x1, y1)  # over the bands, readable on its white box: the fallback
        if best is not None and curve.max_under(best[2], best[3]) <= best[1] - 2:
            break
    if best is None:
        return False
    cx, y0, x0, x1, y1 = best
    placed.add(x0, x1, y0, y1)
    placed.add_segment(cx, y0, px, py)
    # The text's anchor is its bottom centre, laid out in figure pixels and given in points (the same
    # place at any dpi: SVG and PDF are drawn at 72); the arrow runs to the peak.
    pt = 72 / lay.dpi
    ax.annotate(label, xy=(xd, yd), xycoords="data", xytext=(cx * pt, (y0 + 1.5) * pt), textcoords="figure points",
                ha="center", va="bottom", fontsize=CALLOUT_PT, color=_CALLOUT_INK, zorder=9.5,
                annotation_clip=False, gid="pattern-callout",
                bbox=dict(boxstyle="square,pad=0.12", fc="white", ec="none", alpha=CALLOUT_BOX_ALPHA),
                arrowprops=dict(arrowstyle="-", color=_CALLOUT_INK, lw=CALLOUT_ARROW_LW, shrinkA=0,
                                shrinkB=CALLOUT_ARROW_SHORT,
                                relpos=(0.5, 0.0)))
    return True


def phase_dots(ax, X, shown, wide, unit_div, a, b, phase_colors) -> list:
    """A dot at every phase's peak in each wide-enough step; returns (event, bytes, phase) of each."""
    pts = [(ph.peak_event, ph.peak_bytes, name) for st, ok in zip(shown, wide) if ok
           for name, ph in st.phases.items() if name in phase_colors and ph.peak_event is not None
           and a <= ph.peak_event < b]
    if pts:
        ev = np.array([p[0] for p in pts])
        ax.scatter((X[ev] + X[ev + 1]) / 2, np.array([p[1] for p in pts]) / unit_div, s=PHASE_DOT_AREA,
                   c=[phase_colors[p[2]] for p in pts], edgecolors="#1b1b1b", linewidths=PHASE_DOT_LW, zorder=7)
    return pts


def overall_peak(ax, lay: Layout, view: View, placed: Boxes, X, report, unit_div, a, b) -> None:
    """The overall peak ringed in red and named; placed first, so everything else gives way to it."""
    pe = report.peak_event
    if not a <= pe < b:
        return
    x, y = (X[pe] + X[pe + 1]) / 2, report.peak_bytes / unit_div
    ax.scatter([x], [y], s=PEAK_RING_AREA, facecolors="none", edgecolors=PEAK, linewidths=PEAK_RING_LW, zorder=8)
    ax.scatter([x], [y], s=PEAK_DOT_AREA, c=PEAK, zorder=8)
    label = f"peak {format_bytes(report.peak_bytes)}"
    w, h = lay.text_size(label, PEAK_PT + 1, "bold")
    lift = lay.px(PEAK_LIFT_PT) + RING_LIFT_PX  # clear of the ring
    cx = float(np.clip(view.x_px(x), view.left_px + w / 2 + 2, view.right_px - w / 2 - 2))
    py = float(view.y_px(y))
    placed.add(cx - w / 2, cx + w / 2, py + lift, py + lift + h)
    placed.add(float(view.x_px(x)) - PEAK_RING_PX, float(view.x_px(x)) + PEAK_RING_PX, py - PEAK_RING_PX,
               py + PEAK_RING_PX)  # the ring itself
    text_at(ax, view, cx, y, label, PEAK_PT + 1, lift, color=PEAK, weight="bold")


def peak_labels(ax, lay: Layout, view: View, placed: Boxes, X, report, pts, runs, unit_div, a, b,
                ceiling_px: float) -> None:
    """Sizes of the phase peaks, larger first, each inside its phase run and clear of other text."""
    lift = lay.px(PEAK_LIFT_PT)  # text sits above its dot
    for e, size, name in sorted(pts, key=lambda p: -p[1]):
        if e == report.peak_event:
            continue
        k = int(np.searchsorted(runs.first, e, "right")) - 1
        if k < 0:
            continue
        x0, x1 = float(view.x_px(X[max(runs.first[k], a)])), float(view.x_px(X[min(runs.last[k] + 1, b)]))
        label = format_bytes(size)
        if not lay.fits(label, PEAK_PT, x1 - x0):
            continue
        w, h = lay.text_size(label, PEAK_PT)
        cx = float(np.clip(view.x_px((X[e] + X[e + 1]) / 2), x0 + w / 2 + 2, x1 - w / 2 - 2))
        y0 = float(view.y_px(size / unit_div)) + lift
        if y0 + h > ceiling_px or not placed.free(cx - w / 2, cx + w / 2, y0, y0 + h):
            continue
        placed.add(cx - w / 2, cx + w / 2, y0, y0 + h)
        text_at(ax, view, cx, size / unit_div, label, PEAK_PT, lift)
