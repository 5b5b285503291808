"""The peak decomposed, drawn beside the curve: one stacked bar of the categories alive at the
overall peak (report.peak), on the curve's own y scale, with the largest shapes named above it.

Every slice is named: beside it where it is tall enough, else under the bar (thin slices summed
into "n more" where the room there runs out). ``lines`` builds every text the bar shows, with the
figure each one says, and ``draw`` draws those: tests read the figures from ``lines``."""
from __future__ import annotations

from dataclasses import dataclass

from matplotlib.patches import Rectangle

from ...units import format_bytes
from ...vocab import AT_PEAK, CATEGORY_COLORS, CATEGORY_NAMES
from . import layout
from .labels import TICK_PT

#: The bar's column, in pixels, taken from the curve's width: wide enough for "activations 8.44 GiB"
#: at the tick font, never more than this share of the picture (small pictures keep their curve).
BAR_PX = 150
#: The column's most, as a share of the picture's width.
MAX_SHARE = 0.14
#: A column narrower than this many pixels draws no bar at all.
MIN_COLUMN_PX = 60
#: Pixels between the axes and the bar's own axes; the column's width less the bar's axes' width.
BAR_GAP_PX, COLUMN_AIR_PX = 8, 12
#: Segments lower than this many pixels, or than their name, get no name beside them (it would
#: overprint their neighbours'): they are named under the bar.
MIN_LABEL_PX = 13
#: The shapes named above the bar: the largest few.
SHAPES_SHOWN = 3
#: The bar's x extent in its axes (0..1), and where the names beside it start.
BAR_W, NAME_X = 0.28, 0.33
#: Under the bar, a name starts this many font sizes right of its slice's colour swatch.
SWATCH = 1.15
#: The slices' names (beside and under the bar) and the shapes above it, in shares of the tick font size.
NAME_SCALE, SHAPE_SCALE = 0.85, 0.8
#: Line spacing, in font sizes: of the names under the bar, of the texts above it.
UNDER_LINE_EM, ABOVE_LINE_EM = 1.2, 1.25
#: Pixels between the bar and the first text under it or above it.
TEXT_AIR_PX = 2.0
#: Width of the white edge between two slices.
SLICE_EDGE_LW = 0.5


@dataclass
class Line:
    """One text of the bar: what it says, the figure it shows and what that figure sums."""

    text: str
    #: "slice" (beside its slice), "under" (a thin slice, named under the bar), "more" (thin slices
    #: summed under the bar), "shape" (above the bar), "heading"
    kind: str
    nbytes: int | None = None  # the figure the text shows (None: a heading)
    names: tuple = ()  # the categories (or the shape) it is the bytes of
    y: float = 0.0  # a slice's middle, in bytes from the bar's foot ("slice" only)


def width_px(lay, report, a: int, b: int) -> float:
    """The column the bar needs, 0 when there is nothing to draw (no peak, or it is outside the view)."""
    peak = getattr(report, "peak", None)
    if peak is None or not (a <= peak.event < b) or lay.width * MAX_SHARE < MIN_COLUMN_PX:
        return 0.0
    return min(BAR_PX, lay.width * MAX_SHARE)


def lines(lay, peak, top_bytes: float, h_px: float, px: float, under_px: float) -> list[Line]:
    """Every text the bar shows, bottom to top for the slices, then the thin slices under it, then the
    headings and shapes above it (read top down), given the bar's scale (``top_bytes`` at ``h_px``
    pixels), its column's width ``px`` and the room under it.

    Example:
        >>> [ln.text for ln in lines(lay, report.peak, 1.1 * report.peak_bytes, 700, 150, 53)]
        ['parameters\\n9.58 MiB', ..., 'at the peak']
    """
    out, thin, y = [], [], 0
    pt = TICK_PT * NAME_SCALE
    for name, nbytes in peak.by_category.items():
        if not nbytes:
            continue
        tall = nbytes / top_bytes * h_px
        what, size = CATEGORY_NAMES.get(name, name), format_bytes(nbytes)
        # a name stays within its slice, so never over the next one's: on two lines, else on one where
        # it fits beside the bar, else under the bar
        two, one = f"{what}\n{size}", f"{what} {size}"
        line = lay.text_size(one, pt)[1]
        if tall >= max(MIN_LABEL_PX, 2 * line):
            out.append(Line(two, "slice", int(nbytes), (name,), y + nbytes / 2))
        elif tall >= max(MIN_LABEL_PX, line) and lay.fits(one, pt, (px - COLUMN_AIR_PX) * (1 - NAME_X)):
            out.append(Line(one, "slice", int(nbytes), (name,), y + nbytes / 2))
        else:
            thin.append((name, int(nbytes)))
        y += nbytes
    out += _under(lay, thin[::-1], px, under_px)  # read top down, as the bar is stacked
    # Above the bar, read top down: its title, then the largest shapes, as many as fit the room left
    # under the axes' top and the column's width (the smallest go first).
    room = (1 - y / top_bytes) * h_px
    small = TICK_PT * SHAPE_SCALE
    shapes = [(k, int(v)) for k, v in sorted(peak.by_shape.items(), key=lambda kv: -kv[1])[:SHAPES_SHOWN]]
    shapes = [(k, v) for k, v in shapes if lay.fits(_shape_text(k, v), small, px - COLUMN_AIR_PX)]
    heading = f"of which shapes, {AT_PEAK}"  # what the shapes' figures above the bar are (vocab)
    if not lay.fits(heading, small, px - COLUMN_AIR_PX):
        heading = f"shapes {AT_PEAK}"
    while shapes and ((len(shapes) + 1) * lay.px(small) * ABOVE_LINE_EM + lay.px(TICK_PT) * ABOVE_LINE_EM
                      + TEXT_AIR_PX > room):
        shapes.pop()
    out += [Line(_shape_text(k, v), "shape", v, (k,)) for k, v in reversed(shapes)]  # drawn upward
    if shapes:
        out.append(Line(heading, "heading"))
    out.append(Line("at the peak", "heading"))
    return out


def _shape_text(kind: str, nbytes: int) -> str:
    return f"{kind.replace('_', ' ')} {format_bytes(nbytes)}"


def _under(lay, thin: list, px: float, under_px: float) -> list[Line]:
    """The thin slices' names under the bar, one a line, top down; where the room runs out, the
    rest summed on the last line as "n more"."""
    if not thin:
        return []
    pt = TICK_PT * NAME_SCALE
    fit = max(int((under_px - TEXT_AIR_PX) // (lay.px(pt) * UNDER_LINE_EM)), 1)
    named = thin if len(thin) <= fit else thin[:fit - 1]
    # from the swatch to the picture's edge; a name that does not fit leaves its size beside the swatch
    # (the legend names the colour)
    # the column, then the margin (Layout.axes_box)
    room = px - BAR_GAP_PX + lay.px(TICK_PT) * layout.MARGIN_EM - lay.px(pt) * SWATCH
    out = [Line(text if lay.fits(text, pt, room) else format_bytes(b), "under", b, (n,))
           for n, b in named for text in [f"{CATEGORY_NAMES.get(n, n)} {format_bytes(b)}"]]
    rest = thin[len(named):]
    if rest:
        out.append(Line(f"{len(rest)} more {format_bytes(sum(b for _, b in rest))}", "more",
                        sum(b for _, b in rest), tuple(n for n, _ in rest)))
    return out


def draw(fig, lay, report, ax_box, y_top: float, unit_div: float, px: float) -> list[Line]:
    """The bar in the column right of the axes ``ax_box`` (figure fractions), ``px`` pixels wide;
    returns its texts (``lines``)."""
    peak = report.peak
    W = lay.width
    left = ax_box[0] + ax_box[2] + BAR_GAP_PX / W
    bar = fig.add_axes([left, ax_box[1], (px - COLUMN_AIR_PX) / W, ax_box[3]])
    bar.set_xlim(0, 1)
    bar.set_ylim(0, y_top)
    bar.set_axis_off()
    h_px = ax_box[3] * lay.height
    got = lines(lay, peak, y_top * unit_div, h_px, px, lay.axis_px())
    y = 0.0
    for name, nbytes in peak.by_category.items():
        if not nbytes:
            continue
        height = nbytes / unit_div
        bar.add_patch(Rectangle((0, y), BAR_W, height, facecolor=CATEGORY_COLORS[name], edgecolor="white",
                                lw=SLICE_EDGE_LW))
        y += height
    small = TICK_PT * SHAPE_SCALE
    down = TEXT_AIR_PX
    up = TEXT_AIR_PX
    for ln in got:
        if ln.kind == "slice":
            bar.text(NAME_X, ln.y / unit_div, ln.text, va="center", ha="left", fontsize=TICK_PT * NAME_SCALE,
                     linespacing=1.0)
        elif ln.kind in ("under", "more"):
            # under the bar, a swatch of the slice's colour before its name ("n more": none)
            pt = TICK_PT * NAME_SCALE
            if ln.kind == "under":
                bar.annotate("■", xy=(0, 0), xytext=(0, -down * 72 / lay.dpi), textcoords="offset points",
                             va="top", ha="left", fontsize=pt, color=CATEGORY_COLORS[ln.names[0]],
                             annotation_clip=False)
            bar.annotate(ln.text, xy=(0, 0), xytext=(lay.px(pt) * SWATCH * 72 / lay.dpi, -down * 72 / lay.dpi),
                         textcoords="offset points", va="top", ha="left", fontsize=pt, color="#444444",
                         annotation_clip=False)
            down += lay.px(pt) * UNDER_LINE_EM
        else:
            pt, weight = (TICK_PT, "bold") if ln.text == "at the peak" else (small, "normal")
            bar.annotate(ln.text, xy=(0, y), xytext=(0, up * 72 / lay.dpi), textcoords="offset points", va="bottom",
                         ha="left", fontsize=pt, weight=weight, color="black" if weight == "bold" else "#444444")
            up += lay.px(pt) * ABOVE_LINE_EM
    return got
