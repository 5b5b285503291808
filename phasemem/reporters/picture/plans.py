"""The plan picture: what each rank would hold under DDP, ZeRO-1, ZeRO-2 and FSDP2 at each rank count,
stacked by category beside the trace as recorded, with the card's budget as a line and the largest
batch per rank that fits written over each bar (``phasemem plan``, and a section of the HTML page).

The numbers are ``plans.plan_grid``'s (the plans replayed on the trace, ``report.fits`` per rank),
gathered in ``plan_data.PlanPicture``; this module lays them out, in pixels from ``size`` and ``dpi``
like the other pictures (the bars: plan_bars.py; title, budget line, axis labels, legend: plan_frame.py),
and tags what it draws (``fig.phasemem_bars``) so tests read the bars back from the artists.

Example:
    >>> pic = PlanPicture.of(report, 24 << 30, batch=4)
    >>> print(pic.text()); picture_writer(pic, "plan.png")("plan.png")
"""
from __future__ import annotations

import io
import os
import re
import xml.etree.ElementTree as ET

from matplotlib import rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ...errors import PhasememError
from ...output import check_picture_size
from ...units import axis_unit
from .labels import LABEL_PT, LEGEND_PT, TICK_PT, Layout
from .plan_bars import INK, bar_slots, draw_bars, mark_not_applying, used_parts
from .plan_data import PlanPicture
from .plan_frame import (
    BREAK_RATIO,
    BREAK_SHARE,
    draw_budget,
    draw_legend,
    draw_title,
    draw_x_labels,
    fit_legend_rows,
    legend_entries,
)

_SVG_NS = "{http://www.w3.org/2000/svg}"
_XLINK_HREF = "{http://www.w3.org/1999/xlink}href"
_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
_GRID, _REF = "#e6e6e6", "#f1f1f1"
#: Slots of margin: past the last bar, and before the trace's (whose slot spans -0.5..0.5).
RIGHT_MARGIN_SLOTS, LEFT_EDGE = 0.3, -0.6
#: The plot's left margin: the widest tick label, the y label's line in its font sizes, and pixels; the right margin.
YLABEL_EM, LEFT_PAD_PX, RIGHT_PX = 2.4, 10, 16
#: A legend row, the x axis (tick and label lines in their font sizes, and pixels), and the note under the
#: legend (in legend font sizes, and pixels).
ROW_EM, TICK_LINE_EM, AXIS_LABEL_EM, AXIS_PAD_PX, NOTE_EM, NOTE_PAD_PX = 1.9, 1.9, 2.0, 6, 2.2, 8
#: The fewest pixels the bars' plot may have.
MIN_PLOT_PX = 80
#: Pixels between the broken axis' two parts.
BREAK_GAP_PX = 10
#: Room over the tallest bar for its two texts (in label font sizes, and pixels); headroom over an unbroken budget line.
OVER_BAR_EM, OVER_BAR_PX, BUDGET_HEADROOM = 3.0, 6, 1.06
#: The y axis: tick length and pad (points), the grid's width.
TICK_LEN, TICK_PAD, GRID_LW = 3, 2, 0.8


def picture_writer(pic: PlanPicture, path, size=(1600, 900), dpi=100):
    """The plan picture drawn now, and a function writing it to the path it is given (format from
    ``path``'s extension), for ``output.write_all``.

    Example:
        >>> write = picture_writer(PlanPicture.of(report, 80 << 30), "plan.png"); write("plan.png")
    """
    fmt = _FORMATS.get(os.path.splitext(os.fspath(path))[1].lower())
    if fmt is None:
        raise PhasememError(f"{os.fspath(path)}: cannot draw this format; name the picture .png, .svg or .pdf")
    fig = plot_plans(pic, size=size, dpi=dpi)

    def write(tmp):
        fig.savefig(tmp, format=fmt, dpi=fig.dpi, facecolor="white")

    return write


def plot_plans(pic: PlanPicture, size=(1600, 900), dpi=100) -> Figure:
    """The plan picture as a matplotlib Figure. ``fig.phasemem_bars`` lists what each bar is drawn with:
    ``{"plan", "ranks", "x", "segments": [(category, role or None, Rectangle)], "low": Rectangle or None,
    "label": Text or None, "peak": Text or None, "why": Text or None}``; the bars' heights are in
    ``fig.phasemem_unit`` bytes (the reference bar's plan is ``"trace"``).

    Example:
        >>> fig = plot_plans(PlanPicture.of(report, 80 << 30), size=(1400, 700))
    """
    width, height = check_picture_size(size, dpi)
    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, facecolor="white")
    lay = Layout(FigureCanvasAgg(fig), width, height, dpi)
    top = draw_title(fig, lay, pic)
    slots = bar_slots(pic)
    n_slots = slots[-1][0] + 0.5 + RIGHT_MARGIN_SLOTS
    used_cats, used_roles = used_parts(pic)
    entries = legend_entries(pic, used_cats, used_roles)
    left = lay.text_size("000.0", TICK_PT)[0] + lay.px(LABEL_PT) * YLABEL_EM + LEFT_PAD_PX
    right = RIGHT_PX
    plot_w = width - left - right
    legend_rows = fit_legend_rows(lay, entries, plot_w)
    row_h = lay.px(LEGEND_PT) * ROW_EM
    axis_h = lay.px(TICK_PT) * TICK_LINE_EM + lay.px(LABEL_PT) * AXIS_LABEL_EM + AXIS_PAD_PX
    bottom = axis_h + len(legend_rows) * row_h + lay.px(LEGEND_PT) * NOTE_EM + NOTE_PAD_PX
    plot_h = height - top - bottom
    if plot_h < MIN_PLOT_PX:
        raise PhasememError(f"size={size!r}: too small for the plan picture; give a larger size (640x360 or more)")

    tallest: int = max([pic.peak_bytes] + [b.plan.predicted_peak_bytes for b in pic.bars if b.plan.applies])  # type: ignore[type-var, assignment]  # those that apply have one
    broken = pic.budget_bytes > BREAK_RATIO * tallest
    div, unit = axis_unit(max(tallest, pic.budget_bytes if not broken else 0, 1))
    main_h = plot_h * (1 - BREAK_SHARE) - BREAK_GAP_PX if broken else plot_h
    label_px = lay.px(LABEL_PT) * OVER_BAR_EM + OVER_BAR_PX
    y_top = tallest / div * main_h / max(main_h - label_px, 1)
    if not broken:
        y_top = max(y_top, pic.budget_bytes / div * BUDGET_HEADROOM)
    ax = _axes(fig, lay, [left / width, bottom / height, plot_w / width, main_h / height], n_slots, y_top, unit,
               main_h)
    slot_px = plot_w / (n_slots - LEFT_EDGE)
    fig.phasemem_unit = div  # type: ignore[attr-defined]  # phasemem's own attribute
    fig.phasemem_axes = ax  # type: ignore[attr-defined]  # phasemem's own attribute
    fig.phasemem_broken = broken  # type: ignore[attr-defined]  # phasemem's own attribute
    fig.phasemem_bars = draw_bars(ax, lay, pic, slots, div, slot_px)  # type: ignore[attr-defined]  # phasemem's own attribute
    mark_not_applying(fig, ax, lay, pic, slots, slot_px, main_h)
    draw_budget(fig, ax, lay, pic, broken, div, left, bottom, main_h, plot_w, plot_h, width, height, tallest)
    draw_x_labels(fig, ax, lay, pic, slots, bottom, height, slot_px)
    draw_legend(fig, lay, entries, legend_rows, left, bottom - axis_h, row_h, width, height)
    return fig


def _axes(fig, lay, box, n_slots: float, y_top: float, unit: str, main_h: float):
    """The bars' axes at ``box`` (figure fractions): no x ticks, a y grid, the y label as long as
    ``main_h`` allows, and the trace's slot shaded."""
    ax = fig.add_axes(box)
    ax.set_xlim(LEFT_EDGE, n_slots)
    ax.set_ylim(0, y_top)
    ax.set_xticks([])
    ax.tick_params(labelsize=TICK_PT, length=TICK_LEN, pad=TICK_PAD, colors=INK)
    ax.yaxis.grid(True, color=_GRID, lw=GRID_LW)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ylabel = next((t for t in (f"per-rank peak, allocated ({unit})", f"per-rank peak ({unit})", unit)
                   if lay.fits(t, LABEL_PT, main_h)), unit)
    ax.set_ylabel(ylabel, fontsize=LABEL_PT, color=INK)
    ax.axvspan(-0.5, 0.5, color=_REF, lw=0, zorder=0)
    return ax


# -- the HTML page's section -----------------------------------------------------------------------
def svg_text(pic: PlanPicture, size=(1400, 640), dpi=100, prefix: str = "pm-plan-") -> str:
    """The plan picture as inline SVG for the HTML page: no prolog or metadata, every id prefixed so it
    cannot clash with the page's main picture (matplotlib names both figures' parts alike).

    Example:
        >>> html_section = svg_text(PlanPicture.of(report, 80 << 30))
    """
    fig = plot_plans(pic, size=size, dpi=dpi)
    buf = io.BytesIO()
    with rc_context({"svg.hashsalt": "phasemem-plan", "svg.fonttype": "path"}):
        fig.savefig(buf, format="svg", dpi=fig.dpi, facecolor="white", metadata={"Date": None})
    root = ET.fromstring(buf.getvalue())
    for el in root.iter():
        el.tag = el.tag.replace(_SVG_NS, "")
        if _XLINK_HREF in el.attrib:
            el.set("href", el.attrib.pop(_XLINK_HREF))
    for meta in root.findall("metadata"):
        root.remove(meta)
    ids = {el.get("id") for el in root.iter() if el.get("id")}
    for el in root.iter():
        for key, value in list(el.attrib.items()):
            if key == "id":
                el.set(key, prefix + value)
            elif "#" in value:
                el.set(key, re.sub(r"#([\w.-]+)", lambda m: "#" + (prefix + m.group(1) if m.group(1) in ids
                                                                     else m.group(1)), value))
    root.set("class", "pm-plans")
    return ET.tostring(root, encoding="unicode")
