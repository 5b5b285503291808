"""The picture of a distributed run: one lane per rank (small multiples sharing one phase strip and one
y-scale, the rank that sets the run's peak in red), or, for many ranks, a heat strip of each rank's
peak in each step's phases.

x is phase-aligned: the steps every rank has, each phase run stretched to the same width on every
rank, so the same moment of training sits at the same x in every lane. Drawn from the ranks' summaries
alone (``RankSummary.lanes``: the highest level in each of up to 64 columns per phase run), so a
gathered ``RunReport`` draws the same picture as one read from files.
"""
from __future__ import annotations

import os

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ...errors import PhasememError
from ...output import check_picture_size
from ...units import axis_unit, format_bytes
from ...vocab import PHASE_COLORS
from . import layout
from .labels import LABEL_PT, PEAK, STRIP_PT, TICK_PT, TITLE_PT, Layout

_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
_INK, _FILL, _OTHER, _GRID = "#22313f", "#c9d3dd", "#c8c8c8", "#e3e3e3"
#: From this many ranks on, the heat strip instead of lanes (the issue's "many ranks").
HEAT_RANKS = 64
#: A lane lower than this many pixels cannot show a curve: the heat strip is drawn instead.
MIN_LANE_PX = 14
#: Curve columns per slot at most (each the highest of what falls in it).
SLOT_COLUMNS = 48
#: Pixels of air right of the rank names' tick labels, and at the figure's left and right edges.
TICK_AIR_PX, EDGE_PX = 8, 16
#: Room under the lanes (the footnotes), in label font sizes; the footnotes' baseline in the same.
BOTTOM_EM, FOOT_EM = 3.2, 0.9
#: The phase strip's height (phases, and step numbers above them), in strip font sizes; the step
#: numbers' centre in the strip's data units (0 to 2, the phases below 1).
STRIP_EM, STEP_LABEL_Y = 3.4, 1.45
#: Room right of the heat strip for its colour bar, in tick font sizes; the bar's gap and width in pixels.
COLOUR_BAR_EM, COLOUR_BAR_GAP_PX, COLOUR_BAR_PX = 9, 8, 10
#: Air under the headline before the strip, in label font sizes.
HEADLINE_AIR_EM = 1.2
#: Share of its row a lane's axes take (the rest: air between lanes).
LANE_SHARE = 0.86
#: A lane shows its y ticks when taller than this many tick font sizes, and the rank's peak under its
#: name when taller than this many label font sizes.
TICKS_EM, TWO_LINES_EM = 4, 2.8
#: The y axis of every lane reaches this many times the run's peak (air above the highest curve).
HEADROOM = 1.08
#: Curve widths: the rank with the run's peak, the others; its peak's dot in points.
HOT_LW, LANE_LW, PEAK_DOT = 1.3, 0.9, 4
#: The run's peak as a dashed line in every lane: its width and dash (on, off, in points).
PEAK_LINE_LW, PEAK_DASH = 0.7, (4, 3)
#: The heat strip: the peak rank's row outlined this wide; rank ticks at least this many tick font sizes apart.
PEAK_ROW_LW, RANK_TICK_EM = 1.4, 1.4


def picture_writer(run, path, size=(1600, 900), dpi=100, heat: bool | None = None):
    """The picture drawn now, and a function writing it to the path it is given (format from ``path``'s
    extension), for ``output.write_all``. ``heat``: None chooses (lanes unless there are many ranks).

    Example:
        >>> write = picture_writer(phasemem.analyze_ranks("mem/"), "ranks.png"); write("ranks.png")
    """
    fmt = _FORMATS.get(os.path.splitext(os.fspath(path))[1].lower())
    if fmt is None:
        raise PhasememError(f"{os.fspath(path)}: cannot draw this format; name the picture .png, .svg or .pdf")
    fig = plot_ranks(run, size=size, dpi=dpi, heat=heat)

    def write(tmp):
        fig.savefig(tmp, format=fmt, dpi=fig.dpi, facecolor="white")

    return write


def plot_ranks(run, size=(1600, 900), dpi=100, heat: bool | None = None) -> Figure:
    """The run's picture as a matplotlib Figure; ``fig.phasemem_mode`` is ``"lanes"`` or ``"heat"``.

    Example:
        >>> plot_ranks(phasemem.analyze_ranks("mem/"), size=(1200, 800)).phasemem_mode
        'lanes'
    """
    width, height = check_picture_size(size, dpi)
    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, facecolor="white")
    lay = Layout(FigureCanvasAgg(fig), width, height, dpi)
    top = _title(fig, lay, run)
    names = [f"rank {r.rank}" for r in run.ranks] + [format_bytes(r.peak_bytes) for r in run.ranks]
    label_w = max(lay.text_size(t, LABEL_PT, "bold")[0] for t in names)
    tick_w = lay.text_size(_top_label(run), TICK_PT)[0] + TICK_AIR_PX
    left = label_w + tick_w + EDGE_PX
    bottom = lay.px(LABEL_PT) * BOTTOM_EM
    strip_h = lay.px(STRIP_PT) * STRIP_EM
    room = height - top - bottom - strip_h - layout.STRIPS_ROOM_PX
    slots = slots_of(run)
    if heat is None:
        heat = len(run.ranks) >= HEAT_RANKS or room / max(len(run.ranks), 1) < MIN_LANE_PX
    plot_w = width - left - (EDGE_PX + lay.px(TICK_PT) * COLOUR_BAR_EM if heat else EDGE_PX)  # heat: its colour bar
    strip = fig.add_axes((left / width, (bottom + room + layout.STRIPS_GAP_PX) / height,
                          plot_w / width, strip_h / height))
    _strip(strip, lay, run, slots, plot_w)
    box = [left / width, bottom / height, plot_w / width, room / height]
    fig.phasemem_mode = "heat" if heat else "lanes"  # type: ignore[attr-defined]  # phasemem's own attribute
    (_heat if heat else _lanes)(fig, lay, run, slots, box, room)
    fig.text(box[0], lay.px(LABEL_PT) * FOOT_EM / height, "phase-aligned: the steps every rank has, each phase run "
             "stretched to the same width on every rank", fontsize=LABEL_PT, color="#555555")
    return fig


def slots_of(run) -> list[tuple[int, str, dict[int, list[int]]]]:
    """``(step, phase, {rank: highest level per column})`` per slot: a phase run where every rank ran
    the same phases in the step, else the whole step (phase ``"step"``) with each rank's runs joined."""
    out: list[tuple[int, str, dict[int, list[int]]]] = []
    by_step: dict[int, dict[int, list]] = {s.number: {} for s in run.ranks}
    for s in run.ranks:  # each rank's runs by step, in one pass (a scan per step was 3.7M at 16 x 217 steps)
        for k, ph, _, env in s.lanes:
            by_step[s.number].setdefault(k, []).append((ph, env))
    for n in run.steps:
        per = {s.number: by_step[s.number].get(n, []) for s in run.ranks}
        seqs = {tuple(ph for ph, _ in runs) for runs in per.values()}
        if len(seqs) == 1:
            out += [(n, ph, {r: per[r][i][1] for r in per}) for i, ph in enumerate(next(iter(seqs)))]
        else:
            out.append((n, "step", {r: [v for _, env in runs for v in env] for r, runs in per.items()}))
    return out


def _top_label(run) -> str:
    div, unit = axis_unit(max(float(run.peak.bytes), 1.0))
    return f"{run.peak.bytes / div:.3g} {unit}"


def _columns(env: list[int], cols: int) -> np.ndarray:
    a = np.asarray(env, dtype=float)
    if len(a) == 0:
        return np.zeros(cols)
    return np.maximum.reduceat(a, (np.arange(cols) * len(a)) // cols)


def _curve(slots, rank: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    xs = [i + (np.arange(cols) + 0.5) / cols for i in range(len(slots))]
    ys = [_columns(per.get(rank, []), cols) for _, _, per in slots]
    return (np.concatenate(xs), np.concatenate(ys)) if xs else (np.zeros(0), np.zeros(0))


def _title(fig, lay, run) -> float:
    H = fig.get_figheight() * fig.dpi
    p = run.peak
    where = f"step {p.step}, {p.phase}" if p.step is not None else p.phase
    y1 = H - lay.px(TITLE_PT) * layout.TITLE_LINE_EM
    fig.text(layout.TITLE_X, y1 / H,
             f"{len(run.ranks)} rank(s): run peak {format_bytes(p.bytes)} on rank {p.rank} ({where}"
             + (f", {p.shape}" if p.shape else "") + ")", fontsize=TITLE_PT, fontweight="bold", va="center",
             color=_INK)
    y2 = y1 - lay.px(TITLE_PT) * layout.SUBTITLE_EM
    lo = min(run.ranks, key=lambda s: s.peak_bytes)
    said = (f"lowest rank peak {format_bytes(lo.peak_bytes)} (rank {lo.rank}); spread {format_bytes(run.spread)}, "
            f"{run.spread / max(p.bytes, 1):.0%} of the peak") if len(run.ranks) > 1 else "one rank"
    fig.text(layout.TITLE_X, y2 / H, said, fontsize=LABEL_PT, va="center")
    return H - y2 + lay.px(LABEL_PT) * HEADLINE_AIR_EM


def _strip(ax, lay, run, slots, plot_w: float) -> None:
    """The phase of each slot, and the step each belongs to above it."""
    n = max(len(slots), 1)
    ax.set_xlim(0, n)
    ax.set_ylim(0, 2)
    ax.set_axis_off()
    slot_px = plot_w / n
    x0, y0, w, h = layout.CELL
    x1, y1 = x0 + w, y0 + h
    # One collection of the slots' rectangles (a patch each was 1,000 artists a picture at 217 steps).
    x = np.arange(len(slots), dtype=float)[:, None] + np.array([x0, x1, x1, x0])
    y = np.broadcast_to(np.array([y0, y0, y1, y1]), x.shape)
    ax.add_collection(PolyCollection(np.stack([x, y], 2),  # type: ignore[arg-type]  # (N, 4, 2): N polygons
                                     facecolors=[PHASE_COLORS.get(p, _OTHER) for _, p, _ in slots],
                                     linewidths=0), autolim=False)
    for i, (step, phase, _) in enumerate(slots):
        for name in (phase, phase[:4]):
            if lay.fits(name, STRIP_PT, slot_px, "bold"):
                ax.text(i + 0.5, 0.5, name, ha="center", va="center", fontsize=STRIP_PT, color="white",
                        fontweight="bold")
                break
    for step in run.steps:
        where = [i for i, s in enumerate(slots) if s[0] == step]
        if where and lay.fits(f"step {step}", STRIP_PT, slot_px * len(where)):
            ax.text((where[0] + where[-1] + 1) / 2, STEP_LABEL_Y, f"step {step}", ha="center", va="center",
                    fontsize=STRIP_PT, color="#333333")


def _lanes(fig, lay, run, slots, box, room: float) -> None:
    ranks, n = run.ranks, max(len(slots), 1)
    top = max(float(run.peak.bytes), 1.0)
    div, unit = axis_unit(top)
    cols = int(np.clip(box[2] * lay.width / n, 2, SLOT_COLUMNS))
    h = box[3] / len(ranks)
    lane_px = h * LANE_SHARE * lay.height
    # Two tick labels per lane only where a lane is tall enough that neighbours' do not touch.
    ticks, two_lines = lane_px > lay.px(TICK_PT) * TICKS_EM, lane_px > lay.px(LABEL_PT) * TWO_LINES_EM
    tick_w = lay.text_size(_top_label(run), TICK_PT)[0] + TICK_AIR_PX
    for k, s in enumerate(ranks):
        ax = fig.add_axes([box[0], box[1] + (len(ranks) - 1 - k) * h, box[2], h * LANE_SHARE])
        xs, ys = _curve(slots, s.rank, cols)
        hot = s.rank == run.peak.rank
        ax.fill_between(xs, ys / div, color="#f3c6c1" if hot else _FILL, lw=0, step="mid")
        ax.plot(xs, ys / div, color=PEAK if hot else _INK, lw=HOT_LW if hot else LANE_LW, drawstyle="steps-mid")
        if hot and len(ys):
            ax.plot([xs[int(ys.argmax())]], [ys.max() / div], "o", color=PEAK, ms=PEAK_DOT, zorder=5)
        ax.axhline(top / div, color=PEAK, lw=PEAK_LINE_LW, ls=(0, PEAK_DASH), zorder=0)
        ax.add_collection(_grid(ax, n), autolim=False)
        ax.set_xlim(0, n)
        ax.set_ylim(0, top / div * HEADROOM)
        ax.set_xticks([])
        ax.set_yticks([0, top / div] if ticks else [])
        ax.set_yticklabels(["0", _top_label(run)] if ticks else [])
        ax.tick_params(labelsize=TICK_PT, length=2, pad=1)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        label = f"rank {s.rank}" + (f"\n{format_bytes(s.peak_bytes)}" if two_lines else "")
        ax.text(-tick_w / (box[2] * lay.width), 0.5, label,
                transform=ax.transAxes, ha="right", va="center", fontsize=LABEL_PT,
                fontweight="bold" if hot else "normal", color=PEAK if hot else _INK)
    fig.text(box[0] + box[2], lay.px(LABEL_PT) * FOOT_EM / lay.height, f"one y-scale for every lane, 0 to "
             f"{_top_label(run)}; dashed: the run's peak", ha="right", fontsize=LABEL_PT, color="#555555")


def _grid(ax, n: int) -> LineCollection:
    """The slots' boundaries as one artist (an axvline each was 17,000 artists, 25 s, for 16 ranks of 217
    steps); x in data, y in axes fractions, as axvline draws them."""
    x = np.arange(1, n, dtype=float)
    segments = np.stack([np.stack([x, np.zeros_like(x)], 1), np.stack([x, np.ones_like(x)], 1)], 1)
    return LineCollection(segments, colors=_GRID,  # type: ignore[arg-type]  # (N, 2, 2): N segments
                          linewidths=0.6, zorder=0, capstyle="projecting", transform=ax.get_xaxis_transform())


def _heat(fig, lay, run, slots, box, room: float) -> None:
    """Rows are ranks, columns the slots; each cell the rank's highest level there, on one scale."""
    ranks = run.ranks
    cols = [[max(per.get(s.rank, []) or [0]) for _, _, per in slots] for s in ranks]
    m = np.asarray(cols, dtype=float).reshape(len(ranks), max(len(slots), 0))
    div, unit = axis_unit(max(float(m.max(initial=0)), 1.0))
    ax = fig.add_axes(box)
    img = ax.imshow(m / div, aspect="auto", cmap="magma", interpolation="nearest", origin="upper",
                    extent=(0, max(len(slots), 1), len(ranks), 0), vmin=m.min(initial=0) / div)
    peak_row = [s.rank for s in ranks].index(run.peak.rank)
    ax.add_patch(Rectangle((0, peak_row), max(len(slots), 1), 1, fill=False, edgecolor="#2ecc71", lw=PEAK_ROW_LW))
    step = max(1, int(np.ceil(len(ranks) * lay.px(TICK_PT) * RANK_TICK_EM / (box[3] * lay.height))))
    ax.set_yticks(np.arange(0, len(ranks), step) + 0.5)
    ax.set_yticklabels([str(ranks[i].rank) for i in range(0, len(ranks), step)])
    ax.set_ylabel("rank", fontsize=LABEL_PT)
    ax.set_xticks([])
    ax.tick_params(labelsize=TICK_PT)
    cax = fig.add_axes([box[0] + box[2] + COLOUR_BAR_GAP_PX / lay.width, box[1], COLOUR_BAR_PX / lay.width, box[3]])
    bar = fig.colorbar(img, cax=cax)
    bar.ax.tick_params(labelsize=TICK_PT)
    bar.set_label(f"highest allocated ({unit}); green: rank {run.peak.rank}, the run's peak", fontsize=TICK_PT)
