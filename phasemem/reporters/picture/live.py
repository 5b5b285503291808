"""The picture of a snapshot with no allocation history: the sites holding the most live memory.

Without a trace there is no timeline to draw, only what was alive when the snapshot was taken
(``phasemem.read.live``), so this is a horizontal bar per allocation site, split by category, largest
at the top. As in the timeline picture, the figure has an Agg canvas of its own, everything is
laid out in pixels from ``size`` and ``dpi`` (the output is exactly ``size`` pixels), and text is
measured before it is placed: rows that would not fit the height are summed into "other sites"
rather than drawn on top of each other.
"""
from __future__ import annotations

import os
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator

from ...errors import PhasememError
from ...output import atomic_write, check_picture_size
from ...read.live import CATEGORIES, LiveMemory
from ...units import axis_unit, format_bytes
from ...vocab import CATEGORY_COLORS
from . import layout
from .labels import LABEL_PT, LEGEND_PT, TICK_PT, TITLE_PT, Layout, legend_width

TITLE = "no allocation history in this snapshot: live memory at the moment it was taken"
#: At most this many sites get a bar of their own; the rest are summed into one more.
TOP_SITES = 15
#: Pixels under the x axis' label, before the legend.
AXIS_AIR_PX = 8
#: Height of one bar's row, in tick font sizes (as many rows are drawn as fit).
ROW_EM = 1.6
#: A bar's thickness, as a share of its row; at most this many pixels of row per bar (a lone site is
#: not a slab filling the plot); the rows' ends this share of a row beyond the outer bars' centres.
BAR_HEIGHT, ROW_MAX_PX, ROW_END = 0.72, 40, 0.4
#: Points between a bar's end and its value label.
VALUE_GAP_PT = 4
#: Pixels right of the widest value label; the value labels drop their block counts when they would take
#: more than this share of the width.
VALUES_AIR_PX, VALUES_MAX_SHARE = 16, 0.25
#: A site's label is cut to this share of the width (less the values' room), never under this many
#: pixels.
SITES_MAX_SHARE, SITES_MIN_PX = 0.62, 60
#: Left of the bars: room for labels at least this many pixels wide, and this many pixels of air.
LEFT_MIN_PX, LEFT_AIR_PX = 40, 14
#: A cut site label keeps at least this many characters.
CUT_MIN_CHARS = 8
#: Pixels of width per x tick, and the most x ticks.
X_TICK_PX, X_TICKS_MAX = 90, 8
#: The title lines: pixels of their top below the figure's top and of their left end from its left
#: edge (and its right end from the right), and their spacing in their font sizes.
TITLE_TOP_PX, TITLE_LEFT_PX, TITLE_LINE_EM = 8.0, 12, 1.45
#: With no bars, the message's lines: the pixels of width they leave free, their spacing in label font
#: sizes.
MESSAGE_AIR_PX, MESSAGE_LINE_EM = 40, 1.5
_COLORS = {"parameter": CATEGORY_COLORS["parameter"], "optimizer_state": CATEGORY_COLORS["optimizer_state"],
           "unknown": CATEGORY_COLORS["other"]}
_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}


def draw_live(live: LiveMemory, path, size=(1600, 900), dpi=100) -> None:
    """Draw ``live``'s largest allocation sites to ``path`` (PNG, SVG or PDF by extension), written
    atomically; the picture is exactly ``size`` pixels.

    Example:
        >>> draw_live(phasemem.read.live.live_memory(snapshot), "live.png", size=(1200, 700))
    """
    fmt = _FORMATS.get(os.path.splitext(os.fspath(path))[1].lower())
    if fmt is None:
        raise PhasememError(f"{os.fspath(path)}: give a .png, .svg or .pdf file name")
    fig = plot_live(live, size=size, dpi=dpi)
    # savefig's dpi default comes from rcParams: pinned, so the pixel size is the one asked for.
    atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=fig.dpi, facecolor="white"))


def plot_live(live: LiveMemory, size=(1600, 900), dpi=100) -> Figure:
    """The bar chart of ``draw_live`` as a matplotlib Figure; ``fig.phasemem_rows`` keeps what each
    bar shows: (label, bytes, blocks, {category: bytes}), top bar first.

    Example:
        >>> fig = plot_live(live); [r[0] for r in fig.phasemem_rows][:2]
        ['lcm_diffusion_step (ptp_utils.py:258)', '(no stack recorded)']
    """
    width, height = check_picture_size(size, dpi)
    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, facecolor="white")
    lay = Layout(FigureCanvasAgg(fig), width, height, dpi)
    top = _title(fig, lay, live)
    legend = _legend_handles(live)
    item = [lay.text_size(h.get_label(), LEGEND_PT)[0] + lay.px(LEGEND_PT) * layout.LEGEND_ENTRY_EM for h in legend]
    legend_rows = next((r for r in range(1, len(item) + 1)
                        if legend_width(item, r) <= width - layout.LEGEND_MARGIN_PX), len(item))
    bottom = (lay.px(TICK_PT) * layout.AXIS_TICKS_EM + lay.px(LABEL_PT) * layout.AXIS_LABEL_EM + AXIS_AIR_PX
              + legend_rows * lay.px(LEGEND_PT) * layout.LEGEND_ROW_EM)
    fit = max(int((height - top - bottom) // (lay.px(TICK_PT) * ROW_EM)), 1)
    rows = _rows(live, min(TOP_SITES + 1, fit))
    fig.phasemem_rows = rows  # type: ignore[attr-defined]  # phasemem's own attribute
    labels, values, left, right = _margins(lay, rows, width)
    ax = fig.add_axes((left / width, bottom / height, max(width - left - right, layout.MIN_AXES_PX) / width,
                       max(height - top - bottom, layout.MIN_AXES_PX) / height))
    if rows:
        _bars(ax, rows, labels, values, width - left - right, height - top - bottom)
    else:
        ax.set_axis_off()
        for k, line in enumerate(_wrap(lay, _nothing(live), LABEL_PT, width - MESSAGE_AIR_PX)):
            fig.text(0.5, 0.5 - k * lay.px(LABEL_PT) * MESSAGE_LINE_EM / height, line, ha="center", va="center",
                     fontsize=LABEL_PT)
    if legend:
        fig.legend(handles=legend, loc="lower center", ncol=-(-len(legend) // legend_rows), frameon=False,
                   fontsize=LEGEND_PT, handlelength=layout.LEGEND_HANDLE_EM, columnspacing=layout.LEGEND_COLUMN_EM,
                   borderaxespad=layout.LEGEND_EDGE_EM, labelspacing=layout.LEGEND_ROW_GAP_EM)
    return fig


def _margins(lay, rows, width):
    """Site labels (cut to fit), value labels, and the pixels left of and right of the bars."""
    values = [f"{format_bytes(n)} · {c:,} block{'s' * (c != 1)}" for _, n, c, _ in rows]
    right = max([lay.text_size(s, TICK_PT)[0] for s in values] + [0]) + VALUES_AIR_PX
    if right > VALUES_MAX_SHARE * width:  # a narrow picture keeps its bars: the sizes alone, not the block counts
        values = [format_bytes(n) for _, n, _, _ in rows]
        right = max([lay.text_size(s, TICK_PT)[0] for s in values] + [0]) + VALUES_AIR_PX
    labels = [_ellipsize(lay, r[0], max(SITES_MAX_SHARE * width - right, SITES_MIN_PX)) for r in rows]
    left = max([lay.text_size(s, TICK_PT)[0] for s in labels] + [LEFT_MIN_PX]) + LEFT_AIR_PX
    return labels, values, left, right


def _rows(live: LiveMemory, n: int) -> list:
    """(label, bytes, blocks, {category: bytes}) for the n - 1 largest sites and the rest summed."""
    if not live.blocks:
        return []
    if live.has_frames:
        keys = [s for s, _, _ in live.by_site]
        key_of = lambda b: b.site  # noqa: E731
    else:
        # No stack anywhere: one "(no stack recorded)" bar would say nothing; the largest blocks do.
        keys = [b.address for b in live.blocks]
        key_of = lambda b: b.address  # noqa: E731
    shown = keys if len(keys) <= n else keys[:n - 1]
    index = {k: i for i, k in enumerate(shown)}
    rows: list[list[Any]] = [[_label(k, live.has_frames), 0, 0, {}] for k in shown]
    if len(shown) < len(keys):
        rows.append([f"other sites ({len(keys) - len(shown):,})" if live.has_frames
                     else f"other blocks ({len(keys) - len(shown):,})", 0, 0, {}])
    for b in live.blocks:
        r = rows[index.get(key_of(b), len(rows) - 1)]
        r[1] += b.requested_size
        r[2] += 1
        # The no-stack row is drawn apart: its category is unknown for want of any frame at all.
        cat = "no stack" if b.site is None and live.has_frames else b.category
        r[3][cat] = r[3].get(cat, 0) + b.requested_size
    return [tuple(r) for r in rows]


def _label(key, has_frames: bool) -> str:
    if not has_frames:
        return f"block at 0x{key:x}"
    return "(no stack recorded)" if key is None else key


def _bars(ax, rows, labels, values, axes_w_px, axes_h_px):
    top = max(r[1] for r in rows)
    div, unit = axis_unit(top)
    ys = list(range(len(rows)))[::-1]  # the largest at the top
    for y, (_, _, _, cats) in zip(ys, rows):
        x = 0.0
        for cat in list(CATEGORIES) + ["no stack"]:
            if cats.get(cat):
                w = cats[cat] / div
                ax.barh(y, w, left=x, height=BAR_HEIGHT, zorder=2, **_style(cat))
                x += w
    for y, (_, n, _, _), text in zip(ys, rows, values):
        ax.annotate(text, xy=(n / div, y), xytext=(VALUE_GAP_PT, 0), textcoords="offset points", va="center",
                    fontsize=TICK_PT, color="#333333", annotation_clip=False)
    ax.set_yticks(ys, labels, fontsize=TICK_PT)
    # A bar is at most ROW_MAX_PX thick: one site alone would otherwise be a slab filling the plot.
    slots = max(len(rows), axes_h_px / ROW_MAX_PX)
    ax.set_ylim(len(rows) - ROW_END - slots, len(rows) - ROW_END)
    ax.set_xlim(0, top / div)
    ax.set_xlabel(f"allocated ({unit}, requested sizes)", fontsize=LABEL_PT)
    # Tick labels like "12.5" need room: fewer of them on a narrow picture.
    ax.xaxis.set_major_locator(MaxNLocator(nbins=int(min(max(axes_w_px / X_TICK_PX, 2), X_TICKS_MAX))))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.6g}"))
    ax.tick_params(axis="x", labelsize=TICK_PT)
    ax.tick_params(axis="y", length=0)
    ax.grid(axis="x", color="#dddddd", lw=layout.GRID_LW, zorder=-1)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _title(fig, lay, live: LiveMemory) -> float:
    """Write the title lines (wrapped to the width); return the pixels they take from the top."""
    W, H = lay.width, lay.height
    others = [f"cuda:{d} {format_bytes(a)}" for d, (a, _) in live.devices.items() if d != live.device]
    facts = (f"cuda:{live.device}: {format_bytes(live.allocated_bytes)} allocated in {live.n_blocks:,} "
             f"block{'s' * (live.n_blocks != 1)} · {format_bytes(live.reserved_bytes)} reserved "
             f"({format_bytes(live.cached_free_bytes)} cached free)")
    if others:
        facts += " · other devices: " + ", ".join(others)
    lines = [(t, TITLE_PT, "bold") for t in _wrap(lay, TITLE, TITLE_PT, W - 2 * TITLE_LEFT_PX, "bold")]
    lines += [(t, LABEL_PT, "normal") for t in _wrap(lay, facts, LABEL_PT, W - 2 * TITLE_LEFT_PX)]
    y = TITLE_TOP_PX
    for text, pt, weight in lines:
        fig.text(TITLE_LEFT_PX / W, 1 - y / H, text, ha="left", va="top", fontsize=pt, fontweight=weight,
                 color="#1b1b1b" if weight == "bold" else "#444444")
        y += lay.px(pt) * TITLE_LINE_EM
    return y + lay.px(TICK_PT)


def _legend_handles(live: LiveMemory) -> list:
    names = {"parameter": "parameter (Module.to, load_state_dict)", "optimizer_state": "optimizer state (torch.optim)",
             "unknown": "category unknown (the stack does not say)", "no stack": "no stack recorded"}
    shown = {"no stack" if b.site is None and live.has_frames else b.category for b in live.blocks}
    return [Patch(label=names[c], **_style(c)) for c in list(CATEGORIES) + ["no stack"] if c in shown]


def _style(cat: str) -> dict:
    # No stack at all is hatched light grey, as the timeline picture draws memory it cannot place;
    # a flat grey would read as one more shade of "unknown".
    if cat == "no stack":
        return dict(facecolor="#eeeeee", edgecolor="#8a8a8a", hatch="////", linewidth=0)
    return dict(facecolor=_COLORS[cat], edgecolor="none")


def _nothing(live: LiveMemory) -> str:
    text = f"nothing was allocated on cuda:{live.device} when the snapshot was taken"
    held = [f"cuda:{d}" for d, (a, _) in live.devices.items() if a and d != live.device]
    if not live.devices:
        return text + " (the snapshot holds no segments)"
    return text + (f" (memory is on {', '.join(held)})" if held else "")


def _wrap(lay, text: str, pt: float, room: float, weight: str = "normal") -> list:
    lines, cur = [], ""
    for word in text.split(" "):
        trial = f"{cur} {word}" if cur else word
        if cur and lay.text_size(trial, pt, weight)[0] > room:
            lines.append(cur)
            trial = word
        cur = trial
    return lines + [cur]


def _ellipsize(lay, text: str, room: float) -> str:
    # Cut the middle: the function name leads and the file:line ends a site, both worth keeping.
    if lay.text_size(text, TICK_PT)[0] <= room:
        return text
    keep = len(text)
    while keep > CUT_MIN_CHARS:
        keep -= 2
        cut = text[:keep // 2] + "…" + text[len(text) - keep // 2:]
        if lay.text_size(cut, TICK_PT)[0] <= room:
            return cut
    return text[:CUT_MIN_CHARS] + "…"


