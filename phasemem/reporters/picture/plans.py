"""The plan picture: what each rank would hold under DDP, ZeRO-1, ZeRO-2 and FSDP2 at each rank count,
stacked by category beside the trace as recorded, with the card's budget as a line and the largest
batch per rank that fits written over each bar (``phasemem plan``, and a section of the HTML page).

The numbers are ``plans.plan_grid``'s (the plans replayed on the trace, ``report.fits`` per rank);
this module only lays them out, in pixels from ``size`` and ``dpi`` like the other pictures, and
tags what it draws (``fig.phasemem_bars``) so tests read the bars back from the artists.

Example:
    >>> pic = PlanPicture.of(report, 24 << 30, batch=4)
    >>> print(pic.text()); picture_writer(pic, "plan.png")("plan.png")
"""
from __future__ import annotations

import io
import math
import os
import re
import textwrap
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from matplotlib import rc_context
from matplotlib import transforms as mtransforms
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from ...errors import PhasememError
from ...output import check_picture_size
from ...predictions.plans import GRID_RANKS, PLANS, ROLE_CATEGORY, PlanBar, plan_grid
from ...units import axis_unit, format_bytes
from ...vocab import CATEGORIES, CATEGORY_COLORS, CATEGORY_NAMES, ROLE_NAMES
from .labels import LABEL_PT, LEGEND_PT, PEAK, TICK_PT, TITLE_PT, Layout

_SVG_NS = "{http://www.w3.org/2000/svg}"
_XLINK_HREF = "{http://www.w3.org/1999/xlink}href"
_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
_INK, _GREY, _GRID, _REF = "#22313f", "#666666", "#e6e6e6", "#f1f1f1"
#: How the plans are named on the picture.
PLAN_TITLES = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "fsdp2": "FSDP2"}
#: The wrapper's own buffers are drawn inside their category (plans.ROLE_CATEGORY), hatched so a reader
#: sees "DDP buckets" inside the gradients and "unsharded parameters" inside the parameters.
ROLE_HATCHES = {"ddp_buckets": "////", "unsharded_parameters": "////", "all_gather_buffers": "\\\\\\\\",
                "reduce_scatter_buffers": "xxx", "sharded_gradients": "...."}
#: A budget more than this many times the tallest bar is drawn above a break of the y axis: on one
#: scale the gpt fixture's bars (3.3 GiB) under a 24 GiB card were a seventh of the plot, their
#: categories a few pixels each.
BREAK_RATIO = 1.6
#: The share of the plot's height the band above the break (the budget's line) takes.
BREAK_SHARE = 0.09
#: White laid over a bar's part above its lower reading (``Plan.predicted_peak_bytes_low``): lighter.
LIGHTER = 0.55
#: Bar width, and the gap between two plans' groups, in slots.
BAR_WIDTH, GROUP_GAP = 0.72, 0.9
#: At most this many rank counts a picture draws (4 plans x 10 bars still leave each bar ~30 px at 1600 px).
MAX_RANK_COUNTS = 10


@dataclass
class PlanPicture:
    """What the plan picture shows: the trace as recorded (its peak by category and what fits on one
    GPU) and a ``PlanBar`` per plan and rank count, under one budget.

    Example:
        >>> pic = PlanPicture.of(report, parse_size("80GiB"), ranks=(1, 2, 4, 8), batch=16, param_dtype="bf16")
        >>> [(b.plan.plan, b.plan.ranks, pic.largest_batch(b.largest_factor)) for b in pic.bars]
    """

    name: str
    budget_bytes: int
    batch: int | None
    ranks: tuple
    plans: tuple
    settings: dict
    peak_bytes: int
    by_category: dict
    reference_factor: float | None
    reference_why: str
    bars: list[PlanBar] = field(default_factory=list)

    @classmethod
    def of(cls, report, budget: int, ranks: tuple = GRID_RANKS, plans: tuple = PLANS, batch: int | None = None,
           name: str = "", **settings) -> "PlanPicture":
        """Every plan at every rank count (``plan_grid``), with the one-GPU answer beside them."""
        if not 1 <= len(ranks) <= MAX_RANK_COUNTS:
            raise PhasememError(f"give 1 to {MAX_RANK_COUNTS} rank counts (the picture has a bar for each "
                                f"plan at each), not {len(ranks)}")
        factor, why = None, ""
        try:
            fit = report.fits(budget).batch
            factor, why = (fit.largest_factor, "") if fit.applies else (None, fit.why[0] if fit.why else "")
        except PhasememError as e:
            why = str(e)
        return cls(name, int(budget), batch, tuple(ranks), tuple(plans), dict(settings), int(report.peak_bytes),
                   {k: int(v) for k, v in report.by_category.items()}, factor, why,
                   plan_grid(report, budget, tuple(plans), tuple(ranks), **settings))

    def largest_batch(self, factor: float | None) -> int | None:
        """The largest batch per rank for a batch factor: the trace's batch x the factor, rounded down
        (None without ``batch`` or factor)."""
        if factor is None or self.batch is None:
            return None
        return int(math.floor(factor * self.batch + 1e-9))

    def fit_label(self, factor: float | None, times: str = "×") -> str:
        """What is written over a bar: the largest batch per rank (``46``; ``none`` where not even one
        sample fits), or with no batch given the factor (``x11.7``); ``?`` where it was not solved."""
        if factor is None:
            return "?"
        if self.batch is not None:
            n = self.largest_batch(factor)
            return str(n) if n is not None and n >= 1 else "none"
        return f"{times}{factor:.3g}"

    def to_dict(self) -> dict:
        return {"trace": self.name, "budget_bytes": self.budget_bytes, "batch": self.batch, "ranks": list(self.ranks),
                "plans": list(self.plans), "settings": self.settings,
                "reference": {"peak_bytes": self.peak_bytes, "by_category": self.by_category,
                              "largest_factor": self.reference_factor,
                              "largest_batch": self.largest_batch(self.reference_factor),
                              "fits_why": self.reference_why},
                "bars": [dict(b.to_dict(), largest_batch=self.largest_batch(b.largest_factor)) for b in self.bars]}

    def text(self) -> str:
        """The grid as a compact table: a row per plan, a column per rank count, each cell the peak per
        rank and, in brackets, the largest batch per rank that fits (or the factor)."""
        what = "largest batch per rank" if self.batch is not None else "largest batch factor per rank"
        head = (f"per-rank peak under each plan, replayed on {self.name or 'the trace'}; in brackets the {what} "
                f"that fits {format_bytes(self.budget_bytes)}" + (f" (the trace's batch {self.batch} x the "
                                                                  "factor, rounded down)" if self.batch else ""))
        ref = f"{format_bytes(self.peak_bytes)} ({self.fit_label(self.reference_factor, 'x')})"
        rows = [["", *(f"{n} rank" + ("s" if n > 1 else "") for n in self.ranks)]]
        off: dict[str, list[str]] = {}  # reason -> where
        unsolved: dict[str, list[str]] = {}
        for name in self.plans:
            row, mine = [name], self._bars_of(name)
            for b in mine:
                p = b.plan
                if not p.applies:
                    row.append("n/a")
                    off.setdefault(p.why[0] if p.why else "unknown", []).append(f"{name}:{p.ranks}")
                    continue
                peak = format_bytes(p.predicted_peak_bytes)  # type: ignore[arg-type]  # applies: it has one
                if p.predicted_peak_bytes_low is not None:
                    low = format_bytes(p.predicted_peak_bytes_low)
                    same = low.split()[-1] == peak.split()[-1]  # one unit: said once
                    peak = f"{low.split()[0] if same else low}-{peak}"
                row.append(f"{peak} ({self.fit_label(b.largest_factor, 'x')})")
                if b.largest_factor is None:
                    unsolved.setdefault(b.fits_why or "unknown", []).append(f"{name}:{p.ranks}")
            rows.append(row)
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        lines = [head]
        tags = [f"{n}{_settings_tag(self._settings_of(n))}" for n in self.plans if _settings_tag(self._settings_of(n))]
        if tags:
            lines.append(f"  settings: {', '.join(tags)}")
        lines.append(f"  the trace as recorded (1 GPU): {ref}")
        lines += ["  " + "  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(r, widths)))
                  .rstrip() for r in rows]
        if any(b.plan.predicted_peak_bytes_low is not None for b in self.bars):
            lines.append("  a-b: the trace cannot tell between two readings (docs/plans.md); the peak is one of them")
        lines += [f"  n/a ({self._where(w)}): {why}" for why, w in off.items()]
        lines += [f"  ? ({self._where(w)}): what fits cannot be told: {why}" for why, w in unsolved.items()]
        if self.reference_factor is None:
            lines.append(f"  ? (the trace): what fits cannot be told: {self.reference_why or 'unknown'}")
        return "\n".join(lines)

    def _where(self, items: list[str]) -> str:
        """``ddp:2, ddp:4`` said as ``ddp at 2, 4 ranks``, a plan at every rank count as its name."""
        by: dict[str, list[str]] = {}
        for item in items:
            name, n = item.split(":")
            by.setdefault(name, []).append(n)
        return "; ".join(name if len(ns) == len(self.ranks) else f"{name} at {', '.join(ns)} ranks"
                         for name, ns in by.items())

    def _bars_of(self, name: str) -> list[PlanBar]:
        return [b for b in self.bars if b.plan.plan == name]

    def _settings_of(self, name: str) -> dict:
        bars = self._bars_of(name)
        return bars[0].plan.settings if bars else {}


def _settings_tag(settings: dict, short: bool = False) -> str:
    """What differs from the plan's defaults, for its name: `` (bf16 params)``."""
    said = []
    if settings.get("param_dtype"):
        said.append(f"{settings['param_dtype']} params")
    if settings.get("reshard_after_forward") is False:
        said.append("kept unsharded" if not short else "no reshard")
    if settings.get("bucket_view"):
        said.append("bucket view")
    return f" ({', '.join(said)})" if said else ""


# -- the figure ------------------------------------------------------------------------------------
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
    top = _title(fig, lay, pic)
    slots = _slots(pic)
    n_slots = slots[-1][0] + 0.5 + 0.3
    used_cats, used_roles = _used(pic)
    entries = _legend_entries(pic, used_cats, used_roles)
    left = lay.text_size("000.0", TICK_PT)[0] + lay.px(LABEL_PT) * 2.4 + 10
    right = 16
    plot_w = width - left - right
    legend_rows = _legend_rows(lay, entries, plot_w)
    row_h = lay.px(LEGEND_PT) * 1.9
    axis_h = lay.px(TICK_PT) * 1.9 + lay.px(LABEL_PT) * 2.0 + 6
    bottom = axis_h + len(legend_rows) * row_h + lay.px(LEGEND_PT) * 2.2 + 8
    plot_h = height - top - bottom
    if plot_h < 80:
        raise PhasememError(f"size={size!r}: too small for the plan picture; give a larger size (640x360 or more)")

    tallest: int = max([pic.peak_bytes] + [b.plan.predicted_peak_bytes for b in pic.bars if b.plan.applies])  # type: ignore[type-var, assignment]  # those that apply have one
    broken = pic.budget_bytes > BREAK_RATIO * tallest
    div, unit = axis_unit(max(tallest, pic.budget_bytes if not broken else 0, 1))
    main_h = plot_h * (1 - BREAK_SHARE) - 10 if broken else plot_h
    label_px = lay.px(LABEL_PT) * 3.0 + 6
    y_top = tallest / div * main_h / max(main_h - label_px, 1)
    if not broken:
        y_top = max(y_top, pic.budget_bytes / div * 1.06)
    ax = fig.add_axes((left / width, bottom / height, plot_w / width, main_h / height))
    ax.set_xlim(-0.6, n_slots)
    ax.set_ylim(0, y_top)
    ax.set_xticks([])
    ax.tick_params(labelsize=TICK_PT, length=3, pad=2, colors=_INK)
    ax.yaxis.grid(True, color=_GRID, lw=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ylabel = next((t for t in (f"per-rank peak, allocated ({unit})", f"per-rank peak ({unit})", unit)
                   if lay.fits(t, LABEL_PT, main_h)), unit)
    ax.set_ylabel(ylabel, fontsize=LABEL_PT, color=_INK)
    ax.axvspan(-0.5, 0.5, color=_REF, lw=0, zorder=0)
    slot_px = plot_w / (n_slots + 0.6)
    fig.phasemem_unit = div  # type: ignore[attr-defined]  # phasemem's own attribute
    fig.phasemem_axes = ax  # type: ignore[attr-defined]  # phasemem's own attribute
    fig.phasemem_broken = broken  # type: ignore[attr-defined]  # phasemem's own attribute
    fig.phasemem_bars = []  # type: ignore[attr-defined]  # phasemem's own attribute
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
            ax.add_patch(Rectangle((x - BAR_WIDTH / 2, 0), BAR_WIDTH, peak / div, fill=False, ec=_INK, lw=1.1, zorder=4))
        else:
            assert item is not None  # a plan's slot has its bar
            p = item.plan
            if not p.applies:
                drawn = {"plan": p.plan, "ranks": p.ranks, "x": x, "segments": [], "low": None, "label": None,
                         "peak": None, "why": None}
            else:
                drawn = _bar(ax, x, p.categories, p.wrapper, div, p.predicted_peak_bytes_low, p.predicted_peak_bytes)
                drawn.update(plan=p.plan, ranks=p.ranks, x=x)
                drawn["peak"], drawn["label"] = _over(ax, lay, x, p.predicted_peak_bytes, p.predicted_peak_bytes_low,
                                                      div, pic.fit_label(item.largest_factor), slot_px, pic)
        fig.phasemem_bars.append(drawn)  # type: ignore[attr-defined]  # phasemem's own attribute
    _not_applying(fig, ax, lay, pic, slots, slot_px, main_h)
    _budget(fig, ax, lay, pic, broken, div, left, bottom, main_h, plot_w, plot_h, width, height, tallest)
    _x_labels(fig, ax, lay, pic, slots, bottom, height, slot_px)
    _legend(fig, lay, entries, legend_rows, left, bottom - axis_h, row_h, width, height)
    return fig


def _slots(pic: PlanPicture) -> list[tuple[float, str, PlanBar | None]]:
    """(x, "trace" or "plan", bar) per slot: the trace at 0, then each plan's rank counts side by side."""
    out: list = [(0.0, "trace", None)]
    x = 0.5 + GROUP_GAP
    for name in pic.plans:
        for b in pic._bars_of(name):
            out.append((x + 0.5, "plan", b))
            x += 1
        x += GROUP_GAP
    return out


def _used(pic: PlanPicture) -> tuple[list[str], list[str]]:
    cats = {k for k, v in pic.by_category.items() if v > 0}
    roles = set()
    for b in pic.bars:
        if b.plan.applies:
            cats |= {k for k, v in b.plan.categories.items() if v > 0}
            roles |= {k for k, v in b.plan.wrapper.items() if v > 0}
    return [c for c in CATEGORIES if c in cats], [r for r in ROLE_HATCHES if r in roles]


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
                             lw=0.6, hatch=ROLE_HATCHES.get(role) if role else None, zorder=2)
            ax.add_patch(rect)
            segs.append((cat, role, rect))
            y += nbytes / div
    low_rect = None
    if low is not None and peak is not None and low < peak:
        low_rect = Rectangle((x0, low / div), BAR_WIDTH, (peak - low) / div, facecolor="white", alpha=LIGHTER, lw=0,
                             zorder=3)
        ax.add_patch(low_rect)
        ax.plot([x0, x0 + BAR_WIDTH], [low / div] * 2, color=_INK, lw=1.0, zorder=4)
    return {"segments": segs, "low": low_rect, "why": None}


def _over(ax, lay, x, peak, low, div, label, slot_px, pic):
    """The peak (small) and the largest batch (bold) over a bar, each as long as the slot allows."""
    room = slot_px * 0.98
    options = [format_bytes(peak), _num(peak / div)]
    if low is not None:
        options = [f"{_num(low / div)}–{format_bytes(peak)}", f"{_num(low / div)}–{_num(peak / div)}"] + options
    said = next((t for t in options if lay.fits(t, LEGEND_PT, room)), None)
    peak_t = label_t = None
    if said is not None:
        peak_t = ax.annotate(said, (x, peak / div), xytext=(0, 2), textcoords="offset points", ha="center",
                             va="bottom", fontsize=LEGEND_PT, color=_GREY, zorder=5, annotation_clip=False)
    # the largest batch: bold; smaller, then without its "x", where the slot is narrow; left out (the
    # table and the JSON have it) where even that does not fit
    fit = next(((t, pt) for t, pt in ((label, LABEL_PT), (label, LEGEND_PT), (label.replace("×", ""), LEGEND_PT))
                if lay.fits(t, pt, room, "bold")), None)
    if fit is not None:
        lift = 2 + LEGEND_PT * 1.35 if peak_t is not None else 2
        label_t = ax.annotate(fit[0], (x, peak / div), xytext=(0, lift), textcoords="offset points", ha="center",
                              va="bottom", fontsize=fit[1], fontweight="bold",
                              color=PEAK if label in ("none", "?") else _INK, zorder=5, annotation_clip=False)
    return peak_t, label_t


def _num(v: float) -> str:
    """A size in the axis' unit as ``format_bytes`` writes it, without the unit: 2.70, 301.5."""
    return f"{v:.2f}" if v < 100 else f"{v:.1f}"


def _not_applying(fig, ax, lay, pic, slots, slot_px, main_h) -> None:
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
            chars = max(int(group_px / (lay.px(LEGEND_PT) * 0.55)), 12)
            lines = textwrap.wrap("does not apply: " + reasons.pop(), chars)[:6]
            xs = [x for x, _ in mine]
            t = ax.text((xs[0] + xs[-1]) / 2, 0.5, "\n".join(lines), transform=mtransforms.blended_transform_factory(
                ax.transData, ax.transAxes), ha="center", va="center", fontsize=LEGEND_PT, color=_GREY,
                style="italic", zorder=5)
            for d in fig.phasemem_bars:
                if d["plan"] == name:
                    d["why"] = t
            continue
        for x, b in off:
            why = "n/a: " + (b.plan.why or ["unknown"])[0]
            room = main_h * 0.92
            while len(why) > 8 and not lay.fits(why, LEGEND_PT, room):
                why = why[:-2].rstrip() + "…" if why.endswith("…") else why[:-1].rstrip() + "…"
            t = ax.text(x, 0.02, why, transform=mtransforms.blended_transform_factory(ax.transData, ax.transAxes),
                        rotation=90, ha="center", va="bottom", fontsize=LEGEND_PT, color=_GREY, style="italic", zorder=5)
            for d in fig.phasemem_bars:
                if d["plan"] == name and d["ranks"] == b.plan.ranks:
                    d["why"] = t


def _budget(fig, ax, lay, pic, broken, div, left, bottom, main_h, plot_w, plot_h, width, height, tallest) -> None:
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
    tax.tick_params(labelsize=TICK_PT, length=3, pad=2, colors=_INK)
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
                              color=_INK, lw=1.0))
    fig.phasemem_budget = tax


def _x_labels(fig, ax, lay, pic, slots, bottom, height, slot_px) -> None:
    """Under each bar its rank count; under each group its plan (with the settings that differ)."""
    tr = mtransforms.blended_transform_factory(ax.transData, fig.transFigure)
    y1 = (bottom - lay.px(TICK_PT) * 1.2) / height
    y2 = (bottom - lay.px(TICK_PT) * 1.9 - lay.px(LABEL_PT) * 0.9) / height
    for x, kind, b in slots:
        text = "1 GPU" if kind == "trace" else str(b.plan.ranks)
        fig.text(x, y1, text, transform=tr, ha="center", va="center", fontsize=TICK_PT, color=_INK)
    # centred under the trace's bar, it may reach into the margin left of the axes, and not past the
    # gap before the first plan
    x0_px = ax.get_position().x0 * lay.width + (0 - ax.get_xlim()[0]) * slot_px
    half = min(x0_px - 4, slot_px * (0.5 + GROUP_GAP * 0.6))
    if lay.text_size("as recorded", LABEL_PT, "bold")[0] / 2 <= half:
        fig.text(0, y2, "as recorded", transform=tr, ha="center", va="center", fontsize=LABEL_PT, fontweight="bold",
                 color=_INK)
    for name in pic.plans:
        xs = [x for x, kind, b in slots if kind == "plan" and b.plan.plan == name]
        if not xs:
            continue
        plain, tag = PLAN_TITLES.get(name, name), _settings_tag(pic._settings_of(name))
        room = (xs[-1] - xs[0] + 1 + GROUP_GAP * 0.8) * slot_px
        options = [f"{plain}{tag}, ranks", f"{plain}{tag}", f"{plain}, ranks", plain]
        title = next((t for t in options if lay.fits(t, LABEL_PT, room, "bold")), plain)
        fig.text((xs[0] + xs[-1]) / 2, y2, title, transform=tr, ha="center", va="center",
                 fontsize=LABEL_PT, fontweight="bold", color=_INK)


def _title(fig, lay, pic: PlanPicture) -> float:
    H = fig.get_figheight() * fig.dpi
    y1 = H - lay.px(TITLE_PT) * 1.3
    name, keep = pic.name or "the trace", 70
    title = f"Per-rank peak under DDP, ZeRO and FSDP2: {name} replayed"
    while keep > 12 and not lay.fits(title, TITLE_PT, lay.width * 0.98, "bold"):
        keep -= 6
        title = f"Per-rank peak under DDP, ZeRO and FSDP2: {'…' + name[-keep:] if len(name) > keep else name} replayed"
    fig.text(0.01, y1 / H, title, fontsize=TITLE_PT, fontweight="bold", va="center", color=_INK)
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
    fig.text(0.01, y2 / H, said, fontsize=LABEL_PT, va="center", color=_INK)
    tags = "; ".join(f"{PLAN_TITLES.get(n, n)}{_settings_tag(pic._settings_of(n))}" for n in pic.plans
                     if _settings_tag(pic._settings_of(n)))
    if tags:
        y2 -= lay.px(LABEL_PT) * 1.45
        fig.text(0.01, y2 / H, f"settings: {tags}", fontsize=LABEL_PT, va="center", color=_INK)
    return H - y2 + lay.px(LABEL_PT) * 1.6


def _legend_entries(pic, cats: list[str], roles: list[str]) -> list[tuple[dict, str]]:
    out: list[tuple[dict, str]] = [(dict(facecolor=CATEGORY_COLORS[c], edgecolor="white"), CATEGORY_NAMES.get(c, c)) for c in cats]
    for r in roles:
        cat = ROLE_CATEGORY[r]
        out.append((dict(facecolor=CATEGORY_COLORS[cat], edgecolor="white", hatch=ROLE_HATCHES[r]),
                    f"{ROLE_NAMES.get(r, r)} (in {CATEGORY_NAMES.get(cat, cat)})"))
    if any(b.plan.predicted_peak_bytes_low is not None for b in pic.bars):
        out.append((dict(facecolor="#bbbbbb", edgecolor=_INK, lw=0.8), "lighter top: above the lower of two readings "
                    "the trace cannot tell apart"))
    return out


def _swatch_px(lay) -> tuple[float, float]:
    return lay.px(LEGEND_PT) * 1.6, lay.px(LEGEND_PT) * 0.9


def _legend_rows(lay, entries, room: float) -> list[list[int]]:
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


def _legend(fig, lay, entries, rows, left, top_px, row_h, width, height) -> None:
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
            fig.text((x + sw + 6) / width, y / height, label, fontsize=LEGEND_PT, va="center", color=_INK)
            x += sw + 6 + lay.text_size(label, LEGEND_PT)[0] + 18
        y -= row_h
    options = ["replayed on the one-GPU trace: each rank's share of the parameters, gradients and optimizer state, "
               "and the wrapper's own buffers where the trace shows when they live (docs/plans.md); the budget is "
               "checked with the allocator's reserve",
               "replayed on the one-GPU trace (docs/plans.md); the budget is checked with the allocator's reserve",
               "replayed on the one-GPU trace (docs/plans.md)"]
    said = next((t for t in options if lay.fits(t, LEGEND_PT, width - left - 8)), options[-1])
    fig.text(left / width, y / height, said, fontsize=LEGEND_PT, va="center", color=_GREY)


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
