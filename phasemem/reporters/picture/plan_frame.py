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


def draw_budget(fig, ax, lay, pic, broken, div, left, bottom, main_h, plot_w, plot_h, width, height, tallest) -> None:
    """The card's budget as a dashed line: on the bars' scale, or, far above them, in a band over a
    break of the y axis (the break marked on the axis)."""
    said = f"budget {format_bytes(pic.budget_bytes)}"
    kw = dict(color=PEAK, lw=1.4, ls=(0, (6, 3)), zorder=6)
    box = dict(facecolor="white", edgecolor="none", pad=1.5, alpha=0.85)
    if not broken:
        ax.axhline(pic.budget_bytes / div, **kw)
        ax.annotate(said, (1.0, pic.budget_bytes / div), xycoords=("axes fraction", "data"), xytext=(-2, 3),
                    textcoords="offset points", ha="right", va="bottom", fontsize=LABEL_PT, color=PEAK,
                    fontweight="bold", bbox=box, zorder=7)
        fig.phasemem_budget = ax
        return
    band_h = plot_h * BREAK_SHARE
    tax = fig.add_axes([left / width, (bottom + main_h + 10) / height, plot_w / width, band_h / height])
    b = pic.budget_bytes / div
    d = b * 0.04
    tax.set_xlim(ax.get_xlim())
    tax.set_ylim(b - d, b + d)
    tax.set_xticks([])
    tax.set_yticks([b])
    tax.set_yticklabels([""])  # the line's own label says the budget; the bars' unit may not suit it
    tax.tick_params(labelsize=TICK_PT, length=3, pad=2, colors=INK)
    for side in ("top", "right", "bottom"):
        tax.spines[side].set_visible(False)
    ax.spines["top"].set_visible(False)
    tax.axhline(b, **kw)
    times = pic.budget_bytes / max(tallest, 1)
    tax.annotate(f"{said}  (y axis broken: {times:.1f}× the tallest bar)", (1.0, b), xycoords=("axes fraction", "data"),
                 xytext=(-2, 3), textcoords="offset points", ha="right", va="bottom", fontsize=LABEL_PT, color=PEAK,
                 fontweight="bold", bbox=box, zorder=7)
    # the break: two short slanted strokes across the left spine, between the two axes
    x = left / width
    for y_px in (bottom + main_h + 1, bottom + main_h + 9):
        fig.add_artist(Line2D([x - 5 / width, x + 5 / width], [(y_px - 3) / height, (y_px + 3) / height],
                              color=INK, lw=1.0))
    fig.phasemem_budget = tax


def draw_x_labels(fig, ax, lay, pic, slots, bottom, height, slot_px) -> None:
    """Under each bar its rank count; under each group its plan (with the settings that differ)."""
    tr = mtransforms.blended_transform_factory(ax.transData, fig.transFigure)
    y1 = (bottom - lay.px(TICK_PT) * 1.2) / height
    y2 = (bottom - lay.px(TICK_PT) * 1.9 - lay.px(LABEL_PT) * 0.9) / height
    for x, kind, b in slots:
        text = "1 GPU" if kind == "trace" else str(b.plan.ranks)
        fig.text(x, y1, text, transform=tr, ha="center", va="center", fontsize=TICK_PT, color=INK)
    # centred under the trace's bar, it may reach into the margin left of the axes, and not past the
    # gap before the first plan
    x0_px = ax.get_position().x0 * lay.width + (0 - ax.get_xlim()[0]) * slot_px
    half = min(x0_px - 4, slot_px * (0.5 + GROUP_GAP * 0.6))
    if lay.text_size("as recorded", LABEL_PT, "bold")[0] / 2 <= half:
        fig.text(0, y2, "as recorded", transform=tr, ha="center", va="center", fontsize=LABEL_PT, fontweight="bold",
                 color=INK)
    for name in pic.plans:
        xs = [x for x, kind, b in slots if kind == "plan" and b.plan.plan == name]
        if not xs:
            continue
        plain, tag = PLAN_TITLES.get(name, name), settings_tag(pic._settings_of(name))
        room = (xs[-1] - xs[0] + 1 + GROUP_GAP * 0.8) * slot_px
        options = [f"{plain}{tag}, ranks", f"{plain}{tag}", f"{plain}, ranks", plain]
        title = next((t for t in options if lay.fits(t, LABEL_PT, room, "bold")), plain)
        fig.text((xs[0] + xs[-1]) / 2, y2, title, transform=tr, ha="center", va="center",
                 fontsize=LABEL_PT, fontweight="bold", color=INK)


def draw_title(fig, lay, pic) -> float:
    H = fig.get_figheight() * fig.dpi
    y1 = H - lay.px(TITLE_PT) * 1.3
    name, keep = pic.name or "the trace", 70
    title = f"Per-rank peak under DDP, ZeRO and FSDP2: {name} replayed"
    while keep > 12 and not lay.fits(title, TITLE_PT, lay.width * 0.98, "bold"):
        keep -= 6
        title = f"Per-rank peak under DDP, ZeRO and FSDP2: {'…' + name[-keep:] if len(name) > keep else name} replayed"
    fig.text(0.01, y1 / H, title, fontsize=TITLE_PT, fontweight="bold", va="center", color=INK)
    y2 = y1 - lay.px(TITLE_PT) * 1.5
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
    said = next((t for t in options if lay.fits(t, LABEL_PT, lay.width * 0.98)), short)
    fig.text(0.01, y2 / H, said, fontsize=LABEL_PT, va="center", color=INK)
    tags = "; ".join(f"{PLAN_TITLES.get(n, n)}{settings_tag(pic._settings_of(n))}" for n in pic.plans
                     if settings_tag(pic._settings_of(n)))
    if tags:
        y2 -= lay.px(LABEL_PT) * 1.45
        fig.text(0.01, y2 / H, f"settings: {tags}", fontsize=LABEL_PT, va="center", color=INK)
    return H - y2 + lay.px(LABEL_PT) * 1.6


def legend_entries(pic, cats: list[str], roles: list[str]) -> list[tuple[dict, str]]:
    out: list[tuple[dict, str]] = [(dict(facecolor=CATEGORY_COLORS[c], edgecolor="white"), CATEGORY_NAMES.get(c, c)) for c in cats]
    for r in roles:
        cat = ROLE_CATEGORY[r]
        out.append((dict(facecolor=CATEGORY_COLORS[cat], edgecolor="white", hatch=ROLE_HATCHES[r]),
                    f"{ROLE_NAMES.get(r, r)} (in {CATEGORY_NAMES.get(cat, cat)})"))
    if any(b.plan.predicted_peak_bytes_low is not None for b in pic.bars):
        out.append((dict(facecolor="#bbbbbb", edgecolor=INK, lw=0.8), "lighter top: above the lower of two readings "
                    "the trace cannot tell apart"))
    return out


def _swatch_px(lay) -> tuple[float, float]:
    return lay.px(LEGEND_PT) * 1.6, lay.px(LEGEND_PT) * 0.9


def fit_legend_rows(lay, entries, room: float) -> list[list[int]]:
    sw, _ = _swatch_px(lay)
    cur: list[int]
    rows, cur, used = [], [], 0.0
    for k, (_, label) in enumerate(entries):
        w = sw + 6 + lay.text_size(label, LEGEND_PT)[0] + 18
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
    y = top_px - row_h * 0.6
    for row in rows:
        x = left
        for k in row:
            style, label = entries[k]
            fig.add_artist(Rectangle((x / width, (y - sh / 2) / height), sw / width, sh / height,
                                     transform=fig.transFigure, lw=style.pop("lw", 0.6), **style))
            fig.text((x + sw + 6) / width, y / height, label, fontsize=LEGEND_PT, va="center", color=INK)
            x += sw + 6 + lay.text_size(label, LEGEND_PT)[0] + 18
        y -= row_h
    options = ["replayed on the one-GPU trace: each rank's share of the parameters, gradients and optimizer state, "
               "and the wrapper's own buffers where the trace shows when they live (docs/plans.md); the budget is "
               "checked with the allocator's reserve",
               "replayed on the one-GPU trace (docs/plans.md); the budget is checked with the allocator's reserve",
               "replayed on the one-GPU trace (docs/plans.md)"]
    said = next((t for t in options if lay.fits(t, LEGEND_PT, width - left - 8)), options[-1])
    fig.text(left / width, y / height, said, fontsize=LEGEND_PT, va="center", color=GREY)
