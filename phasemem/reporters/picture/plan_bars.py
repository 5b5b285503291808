"""The plan picture's bars: where each sits, each stacked by category with the wrapper's own buffers
hatched inside theirs, the peak and the largest batch written over it, and why an empty slot is empty.

Everything is drawn on the plot's axes, in slots (a bar per slot, a gap between plans' groups).
"""
from __future__ import annotations

import textwrap

from matplotlib import transforms as mtransforms
from matplotlib.patches import Rectangle

from ...predictions.plans import ROLE_CATEGORY, PlanBar
from ...units import format_bytes
from ...vocab import CATEGORIES, CATEGORY_COLORS
from .labels import LABEL_PT, LEGEND_PT, PEAK

INK, GREY = "#22313f", "#666666"
#: The wrapper's own buffers are drawn inside their category (plans.ROLE_CATEGORY), hatched so a reader
#: sees "DDP buckets" inside the gradients and "unsharded parameters" inside the parameters.
ROLE_HATCHES = {"ddp_buckets": "////", "unsharded_parameters": "////", "all_gather_buffers": "\\\\\\\\",
                "reduce_scatter_buffers": "xxx", "sharded_gradients": "...."}
#: White laid over a bar's part above its lower reading (``Plan.predicted_peak_bytes_low``): lighter.
LIGHTER = 0.55
#: Bar width, and the gap between two plans' groups, in slots.
BAR_WIDTH, GROUP_GAP = 0.72, 0.9
#: Line widths: between a bar's slices, the trace's outline, the lower reading's line.
SLICE_EDGE_LW, TRACE_OUTLINE_LW, LOW_LINE_LW = 0.6, 1.1, 1.0
#: The texts over a bar may take this share of its slot's width.
TEXT_ROOM = 0.98
#: Points between a bar's top and the text over it; the largest batch's line over the peak's, in font sizes.
TEXT_AIR_PT, OVER_LINE_EM = 2, 1.35
#: "does not apply" across a group: a character's width in font sizes, the fewest characters a line, the most lines.
CHAR_EM, MIN_LINE_CHARS, MAX_WHY_LINES = 0.55, 12, 6
#: "n/a" up a slot: the share of the plot's height it may take, and where it starts (in axes' heights).
WHY_ROOM, WHY_Y = 0.92, 0.02
#: The shortest "n/a" text a slot is cut down to.
MIN_WHY_CHARS = 8


def bar_slots(pic) -> list[tuple[float, str, PlanBar | None]]:
    """(x, "trace" or "plan", bar) per slot: the trace at 0, then each plan's rank counts side by side."""
    out: list = [(0.0, "trace", None)]
    x = 0.5 + GROUP_GAP
    for name in pic.plans:
        for b in pic._bars_of(name):
            out.append((x + 0.5, "plan", b))
            x += 1
        x += GROUP_GAP
    return out


def used_parts(pic) -> tuple[list[str], list[str]]:
    cats = {k for k, v in pic.by_category.items() if v > 0}
    roles = set()
    for b in pic.bars:
        if b.plan.applies:
            cats |= {k for k, v in b.plan.categories.items() if v > 0}
            roles |= {k for k, v in b.plan.wrapper.items() if v > 0}
    return [c for c in CATEGORIES if c in cats], [r for r in ROLE_HATCHES if r in roles]


def draw_bars(ax, lay, pic, slots, div: float, slot_px: float) -> list[dict]:
    """Every slot's bar, the trace's outlined, with what is written over it: ``fig.phasemem_bars``'s entries."""
    out = []
    wrapper: dict[str, int]
    for x, kind, item in slots:
        if kind == "trace":
            cats, wrapper, peak, low = pic.by_category, {}, pic.peak_bytes, None
            drawn = _bar(ax, x, cats, wrapper, div, low, peak)
            drawn.update(plan="trace", ranks=1, x=x)
            drawn["peak"], drawn["label"] = _over(ax, lay, x, peak, low, div, pic.fit_label(pic.reference_factor),
                                                  slot_px, pic)
            for r in drawn["segments"]:
                r[2].set_edgecolor("white")
            ax.add_patch(Rectangle((x - BAR_WIDTH / 2, 0), BAR_WIDTH, peak / div, fill=False, ec=INK, lw=TRACE_OUTLINE_LW,
                                   zorder=4))
        else:
            p = item.plan
            if not p.applies:
                drawn = {"plan": p.plan, "ranks": p.ranks, "x": x, "segments": [], "low": None, "label": None,
                         "peak": None, "why": None}
            else:
                drawn = _bar(ax, x, p.categories, p.wrapper, div, p.predicted_peak_bytes_low, p.predicted_peak_bytes)
                drawn.update(plan=p.plan, ranks=p.ranks, x=x)
                drawn["peak"], drawn["label"] = _over(ax, lay, x, p.predicted_peak_bytes, p.predicted_peak_bytes_low,
                                                      div, pic.fit_label(item.largest_factor), slot_px, pic)
        out.append(drawn)
    return out


def _bar(ax, x, cats: dict, wrapper: dict, div: float, low, peak) -> dict:
    """One stacked bar: each category in CATEGORIES order, the wrapper's own part of it hatched on top
    of the rest of it; above the lower reading, a lighter top."""
    y, segs = 0.0, []
    x0 = x - BAR_WIDTH / 2
    for cat in CATEGORIES:
        total = int(cats.get(cat, 0))
        if total <= 0:
            continue
        own = {r: int(v) for r, v in wrapper.items() if v > 0 and ROLE_CATEGORY.get(r) == cat}
        plain = total - sum(own.values())
        parts = [(None, plain)] + list(own.items())
        for role, nbytes in parts:
            if nbytes <= 0:
                continue
            rect = Rectangle((x0, y), BAR_WIDTH, nbytes / div, facecolor=CATEGORY_COLORS[cat], edgecolor="white",
                             lw=SLICE_EDGE_LW, hatch=ROLE_HATCHES.get(role) if role else None, zorder=2)
            ax.add_patch(rect)
            segs.append((cat, role, rect))
            y += nbytes / div
    low_rect = None
    if low is not None and peak is not None and low < peak:
        low_rect = Rectangle((x0, low / div), BAR_WIDTH, (peak - low) / div, facecolor="white", alpha=LIGHTER, lw=0,
                             zorder=3)
        ax.add_patch(low_rect)
        ax.plot([x0, x0 + BAR_WIDTH], [low / div] * 2, color=INK, lw=LOW_LINE_LW, zorder=4)
    return {"segments": segs, "low": low_rect, "why": None}


def _over(ax, lay, x, peak, low, div, label, slot_px, pic):
    """The peak (small) and the largest batch (bold) over a bar, each as long as the slot allows."""
    room = slot_px * TEXT_ROOM
    options = [format_bytes(peak), _num(peak / div)]
    if low is not None:
        options = [f"{_num(low / div)}–{format_bytes(peak)}", f"{_num(low / div)}–{_num(peak / div)}"] + options
    said = next((t for t in options if lay.fits(t, LEGEND_PT, room)), None)
    peak_t = label_t = None
    if said is not None:
        peak_t = ax.annotate(said, (x, peak / div), xytext=(0, TEXT_AIR_PT), textcoords="offset points",
                             ha="center", va="bottom", fontsize=LEGEND_PT, color=GREY, zorder=5, annotation_clip=False)
    # the largest batch: bold; smaller, then without its "x", where the slot is narrow; left out (the
    # table and the JSON have it) where even that does not fit
    fit = next(((t, pt) for t, pt in ((label, LABEL_PT), (label, LEGEND_PT), (label.replace("×", ""), LEGEND_PT))
                if lay.fits(t, pt, room, "bold")), None)
    if fit is not None:
        lift = TEXT_AIR_PT + LEGEND_PT * OVER_LINE_EM if peak_t is not None else TEXT_AIR_PT
        label_t = ax.annotate(fit[0], (x, peak / div), xytext=(0, lift), textcoords="offset points", ha="center",
                              va="bottom", fontsize=fit[1], fontweight="bold",
                              color=PEAK if label in ("none", "?") else INK, zorder=5, annotation_clip=False)
    return peak_t, label_t


def _num(v: float) -> str:
    """A size in the axis' unit as ``format_bytes`` writes it, without the unit: 2.70, 301.5."""
    return f"{v:.2f}" if v < 100 else f"{v:.1f}"


def mark_not_applying(fig, ax, lay, pic, slots, slot_px, main_h) -> None:
    """An empty slot says why: once across a plan's group where every rank count has the same reason,
    else up its own slot."""
    for name in pic.plans:
        mine = [(x, b) for x, kind, b in slots if kind == "plan" and b.plan.plan == name]
        off = [(x, b) for x, b in mine if not b.plan.applies]
        if not off:
            continue
        reasons = {(b.plan.why or ["unknown"])[0] for _, b in off}
        if len(off) == len(mine) and len(reasons) == 1:
            group_px = slot_px * len(mine)
            chars = max(int(group_px / (lay.px(LEGEND_PT) * CHAR_EM)), MIN_LINE_CHARS)
            lines = textwrap.wrap("does not apply: " + reasons.pop(), chars)[:MAX_WHY_LINES]
            xs = [x for x, _ in mine]
            t = ax.text((xs[0] + xs[-1]) / 2, 0.5, "\n".join(lines), transform=mtransforms.blended_transform_factory(
                ax.transData, ax.transAxes), ha="center", va="center", fontsize=LEGEND_PT, color=GREY,
                style="italic", zorder=5)
            for d in fig.phasemem_bars:
                if d["plan"] == name:
                    d["why"] = t
            continue
        for x, b in off:
            why = "n/a: " + (b.plan.why or ["unknown"])[0]
            room = main_h * WHY_ROOM
            while len(why) > MIN_WHY_CHARS and not lay.fits(why, LEGEND_PT, room):
                why = why[:-2].rstrip() + "…" if why.endswith("…") else why[:-1].rstrip() + "…"
            t = ax.text(x, WHY_Y, why, transform=mtransforms.blended_transform_factory(ax.transData, ax.transAxes),
                        rotation=90, ha="center", va="bottom", fontsize=LEGEND_PT, color=GREY, style="italic", zorder=5)
            for d in fig.phasemem_bars:
                if d["plan"] == name and d["ranks"] == b.plan.ranks:
                    d["why"] = t
