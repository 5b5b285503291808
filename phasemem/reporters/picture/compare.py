"""The diff picture: both runs' memory over phase-aligned time (each phase run stretched to the same
width), the two phase strips, the difference shaded, the shapes that changed called out; beside it the
peak's change by cause and the phase table.

Laid out in pixels from ``size`` and ``dpi`` like the main picture; callouts are measured before they
are placed, and one that would overlap another is left to the table. Nothing is drawn per event: each
slot is sampled into as many columns as it has pixels, each column keeping its highest event.
"""
from __future__ import annotations

import os

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from ...errors import PhasememError
from ...output import check_picture_size
from ...units import axis_unit, format_bytes, pct, signed
from ...vocab import AT_PEAK, CATEGORY_NAMES, PHASE_COLORS
from . import layout
from .labels import CALLOUT_PT, LABEL_PT, LEGEND_PT, STRIP_PT, TICK_PT, TITLE_PT, Layout

_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
_A, _B = "#8a8a8a", "#22313f"  # A (the base) grey, B (the change) ink
_MORE, _LESS = "#d62728", "#2ca02c"  # B above A / below A
_NOT_RUN = "#f2f2f2"
_OTHER = "#c8c8c8"  # the strip where no phase is known (as the main picture's)
#: At most this many callouts are stacked above the curves; more changed shapes are in the table only.
CALLOUT_ROWS = 4
#: Bars on the right: the largest causes; the rest are in the JSON.
MAX_BARS = 8
#: Share of the figure's width the curves get; the rest holds the causes and the phase table.
CURVES_SHARE = 0.64
#: Right edge of the causes' bars, as a share of the figure's width.
BARS_RIGHT = 0.985
#: Share of the height under the title that the causes' bars get; the phase table goes under them.
BARS_SHARE = 0.5
#: Height of one phase strip (A's, B's), in strip font sizes.
STRIP_EM = 2.2
#: Room left of the curves for the y axis' label, in label font sizes (the main picture's is 2.2).
Y_LABEL_EM = 2.4
#: Pixels of air: beside the y axis' label, and between the x axis' label and the legend.
EDGE_PX = 8
#: The y axis reaches this many times the higher curve's peak: the room above it holds the callout rows.
HEADROOM = 1.42
#: Air under the headline before the curves, in label font sizes.
HEADLINE_AIR_EM = 1.4
#: Run names are cut to their last this many characters in the title (paths end in what tells them apart).
NAME_KEEP = 60
#: Opacity of the shading between the curves (B above A red, below green): the curves stay readable over it.
DIFF_ALPHA = 0.28
#: Line widths of A's curve and B's: A's wider, so B drawn over it leaves A's edge showing where they agree.
A_LW, B_LW = 1.6, 1.3
#: Callouts: pixels of air around the text, the first row's top as a share of the y axis' top, the step
#: down per row (same share), and the marker's size on the curve in points.
CALLOUT_PAD_PX, CALLOUT_TOP, CALLOUT_ROW_STEP, CALLOUT_DOT = 10, 0.97, 0.065, 3.5
#: The peaks' triangle, in points, and their labels' offset from it in points (A's label under, B's over).
PEAK_MARK, PEAK_LABEL_DX, PEAK_LABEL_DY_B, PEAK_LABEL_DY_A = 7, 6, 6, -12
#: Pixels between the widest cause's name and the figure's left edge of the bars.
CAUSE_NAME_PX = 36
#: Bars' height (of a row), opacity, and the unexplained rest's lighter opacity.
BAR_HEIGHT, BAR_ALPHA, REST_ALPHA = 0.66, 0.85, 0.4
#: A bar's value this many points past its end.
VALUE_PT = 4
#: The x axis spans this many times the largest bar either side: room for the value labels.
X_ROOM = 2.1
#: The sentence under the bars: its right edge as a share of the width, and pixels kept free of it.
SAID_RIGHT, SAID_PAD_PX = 0.98, 24
#: Pixels from the bars' bottom to the text under them, and from the curves' share to that text's left edge.
UNDER_BARS_PX, TABLE_INDENT_PX = 48, 16
#: Line height of the sentence under the bars, in label font sizes, and the phase table's line spacing.
SAID_LINE_EM, TABLE_LINESPACING = 1.3, 1.35


def picture_writer(c, path, size=(1600, 900), dpi=100):
    """The diff picture drawn now, and a function writing it to the path it is given (format from
    ``path``'s extension), for ``output.write_all``.

    Example:
        >>> write = picture_writer(phasemem.compare(a, b), "diff.png"); write("diff.png")
    """
    fmt = _FORMATS.get(os.path.splitext(os.fspath(path))[1].lower())
    if fmt is None:
        raise PhasememError(f"{os.fspath(path)}: cannot draw this format; name the picture .png, .svg or .pdf")
    fig = plot_comparison(c, size=size, dpi=dpi)

    def write(tmp):
        # savefig's dpi default comes from rcParams: pinned, so the pixel size is the one asked for.
        fig.savefig(tmp, format=fmt, dpi=fig.dpi, facecolor="white")

    return write


def plot_comparison(c, size=(1600, 900), dpi=100) -> Figure:
    """The diff picture as a matplotlib Figure; ``fig.phasemem_callouts`` lists the shapes named on it.

    Example:
        >>> fig = plot_comparison(phasemem.compare("a.pickle", "b.pickle"), size=(1200, 700))
    """
    width, height = check_picture_size(size, dpi)
    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, facecolor="white")
    lay = Layout(FigureCanvasAgg(fig), width, height, dpi)
    top = _title(fig, lay, c)
    strip_h = lay.px(STRIP_PT) * STRIP_EM
    left = lay.text_size(layout.Y_TICK_SAMPLE, TICK_PT)[0] + lay.px(LABEL_PT) * Y_LABEL_EM + EDGE_PX
    bottom = (lay.px(TICK_PT) * layout.AXIS_TICKS_EM + lay.px(LABEL_PT) * layout.AXIS_LABEL_EM + EDGE_PX
              + lay.px(LEGEND_PT) * layout.LEGEND_ROW_EM)
    right_edge = CURVES_SHARE * width
    plot_h = height - top - bottom - 2 * strip_h - layout.STRIPS_ROOM_PX
    box = (left / width, bottom / height, (right_edge - left) / width, plot_h / height)
    ax = fig.add_axes(box)
    strips = fig.add_axes((box[0], (bottom + plot_h + layout.STRIPS_GAP_PX) / height, box[2], 2 * strip_h / height))
    n = max(len(c.slots), 1)
    cols = max(int((right_edge - left) / n), 2)
    xs, ya, yb, places = _curves(c, cols)
    top_bytes = max(float(ya.max(initial=0)), float(yb.max(initial=0)), 1.0)
    div, unit = axis_unit(top_bytes)
    _draw_curves(ax, c, xs, ya / div, yb / div, n)
    ax.set_ylim(0, top_bytes / div * HEADROOM)
    ax.set_ylabel(f"allocated ({unit})", fontsize=LABEL_PT)
    ax.set_xlabel("phase-aligned: each phase run stretched to the same width", fontsize=LABEL_PT)
    _strips(strips, lay, c, (right_edge - left) / n)
    callouts = _callouts(ax, lay, c, places, div, (right_edge - left), plot_h, top_bytes / div * HEADROOM)
    fig.phasemem_callouts = callouts  # type: ignore[attr-defined]  # phasemem's own attribute
    _peak_marks(ax, c, places, div)
    _legend(fig, box)
    _causes(fig, lay, c, top, bottom, width, height)
    return fig


def _title(fig, lay, c) -> float:
    H = fig.get_figheight() * fig.dpi
    y1 = H - lay.px(TITLE_PT) * layout.TITLE_LINE_EM
    fig.text(layout.TITLE_X, y1 / H,
             f"A: {_steps_of(c.a)} {_short(c.a.name)}   vs   B: {_steps_of(c.b)} {_short(c.b.name)}",
             fontsize=TITLE_PT, fontweight="bold", va="center", color=_B)
    y2 = y1 - lay.px(TITLE_PT) * layout.SUBTITLE_EM
    fig.text(layout.TITLE_X, y2 / H, c.headline(), fontsize=LABEL_PT, va="center")
    return H - y2 + lay.px(LABEL_PT) * HEADLINE_AIR_EM


def _steps_of(side) -> str:
    return f"step {side.steps[0]}" if len(side.steps) == 1 else f"{len(side.steps)} steps"


def _short(name: str, keep: int = NAME_KEEP) -> str:
    return name if len(name) <= keep else "…" + name[-keep + 1:]


def _level(report) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # The one place this picture reads a report's memory curve: the level while each event ran, and
    # the bytes just before and just after it (what the main picture draws from).
    tl = report.analysis.timeline
    return tl.level, tl.active_before, tl.active_after


def _curves(c, cols: int):
    """Both sides sampled on one grid (``cols`` columns per slot, each its highest event), and where
    every drawn event of each side lies on it: {side: (events first..last, x)} per slot."""
    xs: list[np.ndarray] = []
    out: dict[str, list[np.ndarray]] = {"a": [], "b": []}
    places: dict[str, list[tuple[int, int, int]]] = {"a": [], "b": []}
    curves = {s: _level(getattr(c, f"{s}_report")) for s in "ab"}
    carry = {s: _first_before(c, s, curves[s][1]) for s in "ab"}
    for i, slot in enumerate(c.slots):
        xs.append(i + (np.arange(cols) + 0.5) / cols)
        for s in "ab":
            run = getattr(slot, s)
            level, _, after = curves[s]
            if run is None:
                out[s].append(np.full(cols, carry[s], dtype=float))
                continue
            f, last = run
            k = last - f + 1
            starts = f + (np.arange(cols) * k) // cols
            out[s].append(np.maximum.reduceat(level[f:last + 1], starts - f).astype(float))
            places[s].append((f, last, i))
            carry[s] = float(after[last])
    if not xs:
        return np.zeros(0), np.zeros(0), np.zeros(0), places
    return np.concatenate(xs), np.concatenate(out["a"]), np.concatenate(out["b"]), places


def _first_before(c, s: str, before: np.ndarray) -> float:
    runs = [getattr(slot, s) for slot in c.slots if getattr(slot, s) is not None]
    return float(before[runs[0][0]]) if runs else 0.0


def _x_of(places, side: str, event: int | None) -> float | None:
    for f, last, i in places[side]:
        if event is not None and f <= event <= last:
            return i + (event - f + 0.5) / (last - f + 1)
    return None


def _draw_curves(ax, c, xs, ya, yb, n):
    for i in range(1, n):
        ax.axvline(i, color="#e3e3e3", lw=0.8, zorder=0)
    ax.fill_between(xs, ya, yb, where=yb > ya, color=_MORE, alpha=DIFF_ALPHA, lw=0, interpolate=True, zorder=1)
    ax.fill_between(xs, ya, yb, where=yb < ya, color=_LESS, alpha=DIFF_ALPHA, lw=0, interpolate=True, zorder=1)
    ax.plot(xs, ya, color=_A, lw=A_LW, zorder=3)
    ax.plot(xs, yb, color=_B, lw=B_LW, zorder=4)
    ax.set_xlim(0, n)
    ax.set_xticks([])
    ax.tick_params(labelsize=TICK_PT)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _strips(ax, lay, c, slot_px: float) -> None:
    """A's phase runs over B's, one cell per slot; a blank cell where that side did not run the phase."""
    n = max(len(c.slots), 1)
    ax.set_xlim(0, n)
    ax.set_ylim(0, 2)
    ax.set_axis_off()
    for i, slot in enumerate(c.slots):
        for row, run in ((1, slot.a), (0, slot.b)):
            color = PHASE_COLORS.get(slot.phase, _OTHER) if run is not None else _NOT_RUN
            ax.add_patch(Rectangle((i + layout.CELL[0], row + layout.CELL[1]), layout.CELL[2],
                                   layout.CELL[3], facecolor=color, edgecolor="none"))
            if run is None:
                continue
            for name in (slot.phase, slot.phase[:4]):
                if lay.fits(name, STRIP_PT, slot_px, "bold"):
                    ax.text(i + 0.5, row + 0.5, name, ha="center", va="center", fontsize=STRIP_PT,
                            color="white", fontweight="bold")
                    break
    for row, name in ((1, "A"), (0, "B")):
        ax.text(-0.01, row + 0.5, name, transform=ax.get_yaxis_transform(), ha="right", va="center",
                fontsize=STRIP_PT + 1, fontweight="bold", color=_A if name == "A" else _B)


def _callouts(ax, lay, c, places, div, w_px, h_px, ytop) -> list[str]:
    """Each changed shape named where it is (B's occurrence, or A's when it is gone), in rows above the
    curves, the largest changes placed first; a label that fits no row is left to the table."""
    items = []
    for s in c.shapes:
        if s.change == "same":
            continue
        side, event = ("b", s.b_event) if s.b_bytes else ("a", s.a_event)
        x = _x_of(places, side, event)
        if x is None:
            continue
        level = _level(getattr(c, f"{side}_report"))[0]
        twice = sum(t.kind == s.kind and t.change != "same" for t in c.shapes) > 1
        text = f"{s.kind}{f' ({s.phase})' if twice else ''} {format_bytes(s.a_bytes) if s.a_bytes else 'none'} → " \
               f"{format_bytes(s.b_bytes) if s.b_bytes else 'gone'}"
        items.append((-abs(s.delta), x, float(level[event]) / div, text, _MORE if s.delta > 0 else _LESS))
    n = max(len(c.slots), 1)
    taken: list[list[tuple[float, float]]] = [[] for _ in range(CALLOUT_ROWS)]  # pixel spans per row
    named = []
    for _, x, y, text, color in sorted(items):
        tw = lay.text_size(text, CALLOUT_PT)[0] + CALLOUT_PAD_PX
        px = min(max(x / n * w_px - tw / 2, 0), w_px - tw)
        row = next((r for r in range(CALLOUT_ROWS) if all(px + tw < a or px > b for a, b in taken[r])), None)
        if row is None:
            continue
        taken[row].append((px, px + tw))
        ty = ytop * (CALLOUT_TOP - CALLOUT_ROW_STEP * row)
        ax.annotate(text, xy=(x, y), xytext=((px + tw / 2) / w_px * n, ty), fontsize=CALLOUT_PT, color="#1b1b1b",
                    ha="center", va="top", zorder=6,
                    bbox=dict(boxstyle="round,pad=0.2", fc="white", ec=color, lw=0.9),
                    arrowprops=dict(arrowstyle="-", color=color, lw=0.8, shrinkA=0, shrinkB=2))
        ax.plot([x], [y], marker="o", ms=CALLOUT_DOT, color=color, zorder=7)
        named.append(text)
    return named


def _peak_marks(ax, c, places, div) -> None:
    for side, color in (("a", _A), ("b", _B)):
        s = getattr(c, side)
        x = _x_of(places, side, s.peak_event)
        if x is None:
            continue
        ax.plot([x], [s.peak_bytes / div], marker="v", ms=PEAK_MARK, color=color, zorder=8, markeredgecolor="white")
        ax.annotate(f"{side.upper()} peak {format_bytes(s.peak_bytes)}", xy=(x, s.peak_bytes / div),
                    xytext=(PEAK_LABEL_DX, PEAK_LABEL_DY_B if side == "b" else PEAK_LABEL_DY_A),
                    textcoords="offset points", fontsize=CALLOUT_PT,
                    color=color, fontweight="bold", zorder=8)


def _legend(fig, box) -> None:
    handles = [Line2D([], [], color=_A, lw=A_LW, label="A"), Line2D([], [], color=_B, lw=B_LW, label="B"),
               Patch(color=_MORE, alpha=DIFF_ALPHA, label="B above A"),
               Patch(color=_LESS, alpha=DIFF_ALPHA, label="B below A")]
    fig.legend(handles=handles, loc="lower left", bbox_to_anchor=(box[0], 0.0), ncol=4, frameon=False,
               fontsize=LEGEND_PT, handlelength=layout.LEGEND_HANDLE_EM, columnspacing=layout.LEGEND_COLUMN_EM,
               borderaxespad=layout.LEGEND_EDGE_EM)


def _causes(fig, lay, c, top, bottom, width, height) -> None:
    """The peak's change by cause (bars adding up to it), and under them the phase table."""
    rows = [(_cause_label(x.cause, x.type), x.bytes) for x in c.attribution[:MAX_BARS]]
    rest = c.unexplained_bytes + sum(x.bytes for x in c.attribution[MAX_BARS:])
    rows += [("unexplained", rest), ("Δ peak", c.delta)]
    x0 = CURVES_SHARE * width + max(lay.text_size(r[0], TICK_PT)[0] for r in rows) + CAUSE_NAME_PX
    bars_h = BARS_SHARE * (height - top - bottom)
    ax = fig.add_axes([x0 / width, (height - top - bars_h) / height, (BARS_RIGHT * width - x0) / width,
                       bars_h / height])
    scale = max([abs(v) for _, v in rows] + [1])
    div, unit = axis_unit(scale)
    ys = np.arange(len(rows))[::-1]
    for y, (label, v) in zip(ys, rows):
        color = "#555555" if label == "Δ peak" else (_MORE if v > 0 else _LESS)
        ax.barh(y, v / div, color=color, alpha=BAR_ALPHA if label != "unexplained" else REST_ALPHA,
                height=BAR_HEIGHT)
        ax.annotate(signed(v), xy=(v / div, y), xytext=(VALUE_PT if v >= 0 else -VALUE_PT, 0),
                    textcoords="offset points",
                    ha="left" if v >= 0 else "right", va="center", fontsize=TICK_PT)
    ax.axvline(0, color="#333333", lw=0.8)
    ax.set_yticks(ys, [r[0] for r in rows], fontsize=TICK_PT)
    # room either side for the value labels, which are as long as the bars' own text
    ax.set_xlim(-scale / div * X_ROOM, scale / div * X_ROOM)
    ax.tick_params(axis="x", labelsize=TICK_PT)
    ax.set_title(f"the peak's change by cause ({unit}, {AT_PEAK})", fontsize=LABEL_PT, loc="left")
    main, said = c.main_cause(), ""
    if not c.moved and main is not None:  # say where the change went when the peak itself stayed
        said = _wrap(lay, f"The peak did not move; the largest change is {main['where']}'s peak "
                          f"{signed(main['phase_delta'])}, mostly {_cause_label(main['cause'], main['type'])} "
                          f"{signed(main['bytes'])}.", LABEL_PT,
                    SAID_RIGHT * width - CURVES_SHARE * width - SAID_PAD_PX)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    y = height - top - bars_h - UNDER_BARS_PX
    if said:
        fig.text((CURVES_SHARE * width + TABLE_INDENT_PX) / width, y / height, said,
                 fontsize=LABEL_PT, va="top", ha="left",
                 color="#1b1b1b", fontweight="bold")
        y -= (said.count("\n") + 2) * lay.px(LABEL_PT) * SAID_LINE_EM
    _phase_table(fig, lay, c, (CURVES_SHARE * width + TABLE_INDENT_PX) / width, y / height)


def _wrap(lay, text: str, pt: float, room: float, weight: str = "bold") -> str:
    lines, line = [], ""
    for word in text.split():
        trial = f"{line} {word}".strip()
        if line and lay.text_size(trial, pt, weight)[0] > room:
            lines.append(line)
            trial = word
        line = trial
    return "\n".join(lines + [line])


def _cause_label(cause: str, kind: str) -> str:
    return cause if kind == "shape" else f"{CATEGORY_NAMES.get(cause, cause)} outside shapes"


def _phase_table(fig, lay, c, x, y_top) -> None:
    lines = [f"{'phase':<10}{'A peak':>11}{'B peak':>11}{'Δ':>12}{'Δ %':>9}"]
    for p in c.phases.values():
        a = format_bytes(p.a_peak) if p.a_peak is not None else "—"
        b = format_bytes(p.b_peak) if p.b_peak is not None else "—"
        d = signed(p.delta) if p.delta is not None else "—"
        name = p.name + ("*" if not p.aligned else "")
        lines.append(f"{name:<10}{a:>11}{b:>11}{d:>12}{pct(p.delta, p.a_peak):>9}")
    lines.append(f"{'peak':<10}{format_bytes(c.a.peak_bytes):>11}{format_bytes(c.b.peak_bytes):>11}"
                 f"{signed(c.delta):>12}{pct(c.delta, c.a.peak_bytes):>9}")
    if not all(p.aligned for p in c.phases.values()):
        lines.append("* ran at another place of the step in B")
    fig.text(x, y_top, "\n".join(lines), family="monospace", fontsize=TICK_PT, va="top", ha="left",
             linespacing=TABLE_LINESPACING)
