"""The plan picture's frame around its bars: the title, the budget's line (over a break of the y axis
where it is far above them), the rank counts and plan names under the bars, and the legend.
"""
from __future__ import annotations

from matplotlib import transforms as mtransforms
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from ...predictions.plans import ROLE_CATEGORY
from ...units import format_bytes
from ...vocab import CATEGORY_COLORS, CATEGORY_NAMES, ROLE_NAMES
from . import layout
from .labels import LABEL_PT, LEGEND_PT, PEAK, TICK_PT, TITLE_PT
from .plan_bars import GREY, GROUP_GAP, INK, ROLE_HATCHES
from .plan_data import settings_tag

#: How the plans are named on the picture.
PLAN_TITLES = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "fsdp2": "FSDP2"}
#: A budget more than this many times the tallest bar is drawn above a break of the y axis: on one
#: scale the gpt fixture's bars (3.3 GiB) under a 24 GiB card were a seventh of the plot, their
#: categories a few pixels each.
BREAK_RATIO = 1.6
#: The share of the plot's height the band above the break (the budget's line) takes.
BREAK_SHARE = 0.09
#: Pixels between the bars' axes and the band above the break; the break's two strokes this many pixels
#: above the bars' axes, each this many pixels to either side of the spine and up or down.
BREAK_GAP_PX, BREAK_STROKES_PX, BREAK_STROKE_DX_PX, BREAK_STROKE_DY_PX = 10, (1, 9), 5, 3
#: The break's strokes' width.
BREAK_LW = 1.0
#: The band above the break reaches this share of the budget above and below its line.
BAND_REACH = 0.04
#: The band's tick at the budget: its length and its gap to the (empty) label, in points.
BAND_TICK_LEN, BAND_TICK_PAD = 3, 2
#: The budget's dashed line: its width and its dash (on, off, in points).
BUDGET_LW, BUDGET_DASH = 1.4, (6, 3)
#: The budget's label: its box's padding (points) and opacity, and its offset from the axes' right end
#: (points, left and up).
BUDGET_BOX_PAD, BUDGET_BOX_ALPHA, BUDGET_LABEL_OFFSET_PT = 1.5, 0.85, (-2, 3)
#: Under the bars: the rank counts' row (tick font sizes below the axes) and the plan names' row (tick
#: font sizes, then label font sizes, below the axes).
RANKS_ROW_EM, NAMES_ROW_TICK_EM, NAMES_ROW_EM = 1.2, 1.9, 0.9
#: The trace's bar's name ("as recorded"): pixels it keeps from the figure's left edge, and the share of
#: the gap after it that it may take.
TRACE_NAME_AIR_PX, TRACE_NAME_GAP_SHARE = 4, 0.6
#: A plan's name may take this share of the gaps beside its group.
PLAN_NAME_GAP_SHARE = 0.8
#: The trace's name in the title: at most this many characters, cut this many at a time, never under
#: this many.
NAME_KEEP_CHARS, NAME_KEEP_STEP, NAME_KEEP_MIN = 70, 6, 12
#: The title's lines may take this share of the figure's width.
TITLE_WIDTH_SHARE = 0.98
#: From the title's line to the headline under it, in title font sizes (tighter than layout.SUBTITLE_EM).
HEADLINE_EM = 1.5
#: From the headline to the settings' line, and from the last line to the axes, in label font sizes.
SETTINGS_LINE_EM, HEADER_AIR_EM = 1.45, 1.6
#: A legend swatch's width and height, in legend font sizes.
SWATCH_W_EM, SWATCH_H_EM = 1.6, 0.9
#: A legend swatch's edge width; the "lighter top" swatch's.
SWATCH_LW, LOW_SWATCH_LW = 0.6, 0.8
#: Pixels in a legend row: between a swatch and its name, after the name.
SWATCH_GAP_PX, ENTRY_GAP_PX = 6, 18
#: The legend's first row is centred this many row heights under its top.
FIRST_ROW_SHARE = 0.6
#: Pixels the note under the legend keeps free at the figure's right edge.
NOTE_AIR_PX = 8


def draw_budget(fig, ax, lay, pic, broken, div, left, bottom, main_h, plot_w, plot_h, width, height, tallest) -> None:
    """The card's budget as a dashed line: on the bars' scale, or, far above them, in a band over a
    break of the y axis (the break marked on the axis)."""
    said = f"budget {format_bytes(pic.budget_bytes)}"
    kw = dict(color=PEAK, lw=BUDGET_LW, ls=(0, BUDGET_DASH), zorder=6)
    box = dict(facecolor="white", edgecolor="none", pad=BUDGET_BOX_PAD, alpha=BUDGET_BOX_ALPHA)
    if not broken:
        ax.axhline(pic.budget_bytes / div, **kw)
        ax.annotate(said, (1.0, pic.budget_bytes / div), xycoords=("axes fraction", "data"),
                    xytext=BUDGET_LABEL_OFFSET_PT, textcoords="offset points", ha="right", va="bottom",
                    fontsize=LABEL_PT, color=PEAK, fontweight="bold", bbox=box, zorder=7)
        fig.phasemem_budget = ax
        return
    band_h = plot_h * BREAK_SHARE
    tax = fig.add_axes([left / width, (bottom + main_h + BREAK_GAP_PX) / height, plot_w / width, band_h / height])
    b = pic.budget_bytes / div
    d = b * BAND_REACH
    tax.set_xlim(ax.get_xlim())
    tax.set_ylim(b - d, b + d)
    tax.set_xticks([])
    tax.set_yticks([b])
    tax.set_yticklabels([""])  # the line's own label says the budget; the bars' unit may not suit it
    tax.tick_params(labelsize=TICK_PT, length=BAND_TICK_LEN, pad=BAND_TICK_PAD, colors=INK)
    for side in ("top", "right", "bottom"):
        tax.spines[side].set_visible(False)
    ax.spines["top"].set_visible(False)
    tax.axhline(b, **kw)
    times = pic.budget_bytes / max(tallest, 1)
    tax.annotate(f"{said}  (y axis broken: {times:.1f}× the tallest bar)", (1.0, b),
                 xycoords=("axes fraction", "data"), xytext=BUDGET_LABEL_OFFSET_PT, textcoords="offset points",
                 ha="right", va="bottom", fontsize=LABEL_PT, color=PEAK, fontweight="bold", bbox=box, zorder=7)
    # the break: two short slanted strokes across the left spine, between the two axes
    x = left / width
    for y_px in (bottom + main_h + BREAK_STROKES_PX[0], bottom + main_h + BREAK_STROKES_PX[1]):
        fig.add_artist(Line2D([x - BREAK_STROKE_DX_PX / width, x + BREAK_STROKE_DX_PX / width],
                              [(y_px - BREAK_STROKE_DY_PX) / height, (y_px + BREAK_STROKE_DY_PX) / height],
                              color=INK, lw=BREAK_LW))
    fig.phasemem_budget = tax


def draw_x_labels(fig, ax, lay, pic, slots, bottom, height, slot_px) -> None:
    """Under each bar its rank count; under each group its plan (with the settings that differ)."""
    tr = mtransforms.blended_transform_factory(ax.transData, fig.transFigure)
    y1 = (bottom - lay.px(TICK_PT) * RANKS_ROW_EM) / height
    y2 = (bottom - lay.px(TICK_PT) * NAMES_ROW_TICK_EM
          - lay.px(LABEL_PT) * NAMES_ROW_EM) / height
    for x, kind, b in slots:
        text = "1 GPU" if kind == "trace" else str(b.plan.ranks)
        fig.text(x, y1, text, transform=tr, ha="center", va="center", fontsize=TICK_PT, color=INK)
    # centred under the trace's bar, it may reach into the margin left of the axes, and not past the
    # gap before the first plan
    x0_px = ax.get_position().x0 * lay.width + (0 - ax.get_xlim()[0]) * slot_px
    half = min(x0_px - TRACE_NAME_AIR_PX, slot_px * (0.5 + GROUP_GAP * TRACE_NAME_GAP_SHARE))
    if lay.text_size("as recorded", LABEL_PT, "bold")[0] / 2 <= half:
        fig.text(0, y2, "as recorded", transform=tr, ha="center", va="center", fontsize=LABEL_PT, fontweight="bold",
                 color=INK)
    for name in pic.plans:
        xs = [x for x, kind, b in slots if kind == "plan" and b.plan.plan == name]
        if not xs:
            continue
        plain, tag = PLAN_TITLES.get(name, name), settings_tag(pic._settings_of(name))
        room = (xs[-1] - xs[0] + 1 + GROUP_GAP * PLAN_NAME_GAP_SHARE) * slot_px
        options = [f"{plain}{tag}, ranks", f"{plain}{tag}", f"{plain}, ranks", plain]
        title = next((t for t in options if lay.fits(t, LABEL_PT, room, "bold")), plain)
        fig.text((xs[0] + xs[-1]) / 2, y2, title, transform=tr, ha="center", va="center",
                 fontsize=LABEL_PT, fontweight="bold", color=INK)


def draw_title(fig, lay, pic) -> float:
    H = fig.get_figheight() * fig.dpi
    y1 = H - lay.px(TITLE_PT) * layout.TITLE_LINE_EM
    name, keep = pic.name or "the trace", NAME_KEEP_CHARS
    title = f"Per-rank peak under DDP, ZeRO and FSDP2: {name} replayed"
    while keep > NAME_KEEP_MIN and not lay.fits(title, TITLE_PT, lay.width * TITLE_WIDTH_SHARE, "bold"):
        keep -= NAME_KEEP_STEP
        cut = "…" + name[-keep:] if len(name) > keep else name
        title = f"Per-rank peak under DDP, ZeRO and FSDP2: {cut} replayed"
    fig.text(layout.TITLE_X, y1 / H, title, fontsize=TITLE_PT, fontweight="bold", va="center", color=INK)
    y2 = y1 - lay.px(TITLE_PT) * HEADLINE_EM
    if pic.batch is not None:
        fits = (f"in bold over each bar: the largest batch per rank predicted to fit {format_bytes(pic.budget_bytes)} "
                f"(the trace's batch {pic.batch} × the factor that fits, rounded down)")
    else:
        fits = (f"in bold over each bar: the largest batch per rank predicted to fit {format_bytes(pic.budget_bytes)}, "
                "as a factor of the trace's batch (--batch B names it)")
    budget = format_bytes(pic.budget_bytes)
    short = (f"bold: the largest batch per rank that fits {budget}" + (f" (batch {pic.batch} × the factor)"
             if pic.batch is not None else ", × the trace's batch") + "; grey: the peak")
    options = [f"{fits}; above it the peak", short]
    said = next((t for t in options if lay.fits(t, LABEL_PT, lay.width * TITLE_WIDTH_SHARE)), short)
    fig.text(layout.TITLE_X, y2 / H, said, fontsize=LABEL_PT, va="center", color=INK)
    tags = "; ".join(f"{PLAN_TITLES.get(n, n)}{settings_tag(pic._settings_of(n))}" for n in pic.plans
                     if settings_tag(pic._settings_of(n)))
    if tags:
        y2 -= lay.px(LABEL_PT) * SETTINGS_LINE_EM
        fig.text(layout.TITLE_X, y2 / H, f"settings: {tags}", fontsize=LABEL_PT, va="center", color=INK)
    return H - y2 + lay.px(LABEL_PT) * HEADER_AIR_EM


def legend_entries(pic, cats: list[str], roles: list[str]) -> list[tuple[dict, str]]:
    out: list[tuple[dict, str]] = [(dict(facecolor=CATEGORY_COLORS[c], edgecolor="white"), CATEGORY_NAMES.get(c, c))
                                   for c in cats]
    for r in roles:
        cat = ROLE_CATEGORY[r]
        out.append((dict(facecolor=CATEGORY_COLORS[cat], edgecolor="white", hatch=ROLE_HATCHES[r]),
                    f"{ROLE_NAMES.get(r, r)} (in {CATEGORY_NAMES.get(cat, cat)})"))
    if any(b.plan.predicted_peak_bytes_low is not None for b in pic.bars):
        out.append((dict(facecolor="#bbbbbb", edgecolor=INK, lw=LOW_SWATCH_LW),
                    "lighter top: from the lower to the upper of two readings the trace cannot tell apart"))
    return out


def _swatch_px(lay) -> tuple[float, float]:
    return lay.px(LEGEND_PT) * SWATCH_W_EM, lay.px(LEGEND_PT) * SWATCH_H_EM


def fit_legend_rows(lay, entries, room: float) -> list[list[int]]:
    sw, _ = _swatch_px(lay)
    cur: list[int]
    rows, cur, used = [], [], 0.0
    for k, (_, label) in enumerate(entries):
        w = sw + SWATCH_GAP_PX + lay.text_size(label, LEGEND_PT)[0] + ENTRY_GAP_PX
        if cur and used + w > room:
            rows.append(cur)
            cur, used = [], 0.0
        cur.append(k)
        used += w
    if cur:
        rows.append(cur)
    return rows


def draw_legend(fig, lay, entries, rows, left, top_px, row_h, width, height) -> None:
    """The legend, drawn in rows under the axis labels: a swatch (hatched for the wrapper's buffers) and
    its name; then where the numbers come from."""
    sw, sh = _swatch_px(lay)
    y = top_px - row_h * FIRST_ROW_SHARE
    for row in rows:
        x = left
        for k in row:
            style, label = entries[k]
            fig.add_artist(Rectangle((x / width, (y - sh / 2) / height), sw / width, sh / height,
                                     transform=fig.transFigure, lw=style.pop("lw", SWATCH_LW), **style))
            fig.text((x + sw + SWATCH_GAP_PX) / width, y / height, label, fontsize=LEGEND_PT, va="center", color=INK)
            x += sw + SWATCH_GAP_PX + lay.text_size(label, LEGEND_PT)[0] + ENTRY_GAP_PX
        y -= row_h
    options = ["replayed on the one-GPU trace: each rank's share of the parameters, gradients and optimizer state, "
               "and the wrapper's own buffers where the trace shows when they live (docs/plans.md); the budget is "
               "checked with the allocator's reserve",
               "replayed on the one-GPU trace (docs/plans.md); the budget is checked with the allocator's reserve",
               "replayed on the one-GPU trace (docs/plans.md)"]
    said = next((t for t in options if lay.fits(t, LEGEND_PT, width - left - NOTE_AIR_PX)), options[-1])
    fig.text(left / width, y / height, said, fontsize=LEGEND_PT, va="center", color=GREY)
