"""The peak decomposed, drawn beside the curve: one stacked bar of the categories alive at the
overall peak (report.peak), on the curve's own y scale, with the largest shapes named under it."""
from __future__ import annotations

from matplotlib.patches import Rectangle

from ..units import format_bytes
from ..vocab import CATEGORY_COLORS, CATEGORY_NAMES
from .labels import TICK_PT

#: The bar's column, in pixels, taken from the curve's width: wide enough for "activations 8.44 GiB"
#: at the tick font, never more than this share of the picture (small pictures keep their curve).
BAR_PX = 150
MAX_SHARE = 0.14
#: Segments lower than this many pixels get no name (they would overprint their neighbours).
MIN_LABEL_PX = 13
#: The shapes named under the bar: the largest few.
SHAPES_SHOWN = 3


def width_px(lay, report, a: int, b: int) -> float:
    """The column the bar needs, 0 when there is nothing to draw (no peak, or it is outside the view)."""
    peak = getattr(report, "peak", None)
    if peak is None or not (a <= peak.event < b) or lay.width * MAX_SHARE < 60:
        return 0.0
    return min(BAR_PX, lay.width * MAX_SHARE)


def draw(fig, lay, report, ax_box, y_top: float, unit_div: float, px: float) -> None:
    """The bar in the column right of the axes ``ax_box`` (figure fractions), ``px`` pixels wide."""
    peak = report.peak
    W = lay.width
    left = ax_box[0] + ax_box[2] + 8 / W
    bar = fig.add_axes([left, ax_box[1], (px - 12) / W, ax_box[3]])
    bar.set_xlim(0, 1)
    bar.set_ylim(0, y_top)
    bar.set_axis_off()
    h_px = ax_box[3] * lay.height
    y = 0.0
    for name, nbytes in peak.by_category.items():
        if not nbytes:
            continue
        height = nbytes / unit_div
        bar.add_patch(Rectangle((0, y), 0.28, height, facecolor=CATEGORY_COLORS[name], edgecolor="white", lw=0.5))
        if height / y_top * h_px >= MIN_LABEL_PX:
            bar.text(0.33, y + height / 2, f"{CATEGORY_NAMES.get(name, name)}\n{format_bytes(nbytes)}",
                     va="center", ha="left", fontsize=TICK_PT * 0.85, linespacing=1.0)
        y += height
    # Above the bar, read top down: its title, then the largest shapes, as many as fit the room left
    # under the axes' top and the column's width (the smallest go first).
    room = (1 - y / y_top) * h_px
    small = TICK_PT * 0.8
    shapes = [f"{k.replace('_', ' ')} {format_bytes(v)}"
              for k, v in sorted(peak.by_shape.items(), key=lambda kv: -kv[1])[:SHAPES_SHOWN]]
    shapes = [s for s in shapes if lay.fits(s, small, px - 12)]
    while shapes and (len(shapes) + 1) * lay.px(small) * 1.25 + lay.px(TICK_PT) * 1.25 + 2 > room:
        shapes.pop()
    lines = [(s, small, "normal") for s in reversed(shapes)]
    lines += [("of which shapes", small, "normal")] if shapes else []
    lines.append(("at the peak", TICK_PT, "bold"))
    up = 2.0
    for text, pt, weight in lines:
        bar.annotate(text, xy=(0, y), xytext=(0, up * 72 / lay.dpi), textcoords="offset points", va="bottom",
                     ha="left", fontsize=pt, weight=weight, color="black" if weight == "bold" else "#444444")
        up += lay.px(pt) * 1.25
