"""Everything around the bands: the phase strip and its shading, step lines and numbers, the
out-of-memory line, the axes, the title and the legends."""
from __future__ import annotations

import numpy as np
from matplotlib import colors as mcolors
from matplotlib.collections import PolyCollection
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator

from ...analysis.patterns import BY_NAME
from ...units import format_bytes
from ...vocab import PHASE_COLORS, PHASES
from . import labels as _labels
from . import layout
from . import pixels as _pixels
from .colours import _CURVE, _OOM, _RESERVED, _SHORT, _STRIP_OTHER, _unsure
from .labels import CALLOUT_PT, LABEL_PT, LEGEND_PT, STEP_PT, STRIP_PT, TICK_PT, TITLE_PT

#: Below these widths per step, step lines and per-phase peak dots are left out (too dense to read),
#: and pattern occurrences other than the one named in full are not marked.
_MIN_STEP_LINE_PX, _MIN_STEP_DOTS_PX = 6, 12
#: Opacity of a phase's colour: its light shading over the plot, its cell in the strip.
SHADE_ALPHA, STRIP_ALPHA = 0.14, 0.95
#: The out-of-memory line's width, and the pixels between it and its label.
OOM_LW, OOM_GAP_PX = 1.6, 4
#: The out-of-memory label's box: its opacity.
OOM_BOX_ALPHA = 0.85
#: A phase tick reaches this many strip heights down from the axes' top; its white edge's width, its own.
TICK_REACH, TICK_EDGE_LW, TICK_LW = 1.25, 4.6, 2.4
#: The lines between steps: width and opacity.
STEP_LINE_LW, STEP_LINE_ALPHA = 0.8, 0.6
#: Step numbers sit this many points above the axes.
STEP_LIFT_PT = 3
#: Pixels of width (height) per x (y) tick, and the most ticks on either axis.
X_TICK_PX, X_TICKS_MAX, Y_TICK_PX, Y_TICKS_MAX = 130, 10, 60, 8
#: The title's top below the figure's top, in title font sizes.
TITLE_TOP_EM = 0.5
#: The legend's handles: a phase's patch's opacity, the allocated and reserved curves' widths.
LEGEND_PATCH_ALPHA, CURVE_LEGEND_LW, RESERVED_LEGEND_LW = 0.5, 1.0, 1.2
#: The legend's marker sizes in points: a phase peak, the overall peak's ring, a pattern's marker.
PHASE_DOT_SIZE, PEAK_RING_SIZE, MARKER_SIZE = 5, 8, 6
#: fig.legend's air inside its (frameless) box, in legend font sizes.
LEGEND_PAD_EM = 0.2


def _shade_phases(ax, lay, view, X, runs, a, b, strip_frac, unsure=frozenset(), raster=False):
    """Each phase occurrence: a light band over the plot, a solid cell in the strip, its name if it
    fits; 'other' (no phase known) a grey cell in the strip only; an unsure phase's cells hatched.
    ``raster``: the shading and the plain strip cells as images of the canvas' pixels (why:
    docs/picture.md); the hatched cells of unsure phases stay polygons."""
    colors = np.array([mcolors.to_rgba(PHASE_COLORS.get(p, _STRIP_OTHER)) for p in PHASES])
    first, last, code = runs.first, runs.last, runs.code
    x0, x1 = X[np.maximum(first, a)], X[np.minimum(last + 1, b)]
    known = np.array([p in PHASE_COLORS for p in PHASES])[code]
    hatched = np.array([p in unsure for p in PHASES])[code]
    # The strip gives a phase narrower than a pixel a column its neighbour can spare (pixels.widen);
    # the shading over the plot stays as the events fall.
    i0, i1, _, _ = _pixels.grid(view)
    wide = _pixels.widen(view.x_px(x0), view.x_px(x1), code, i0, i1)
    sx0, sx1 = (x0, x1) if wide is None else (view.x_data(wide[0]), view.x_data(wide[1]))
    # One collection per layer, not one patch per occurrence: 400 steps would be 2,000 patches.
    for y0, y1, alpha, z, m, c0, c1 in ((0, 1 - strip_frac, SHADE_ALPHA, 0, known, x0, x1),
                                        (1 - strip_frac, 1, STRIP_ALPHA, 1, known | ~known, sx0, sx1)):
        if raster:
            # The shading takes the hatched phases' cells too (its hatch is the strip's); the strip's
            # hatched cells are polygons drawn over its image.
            seq = np.flatnonzero(m if z == 0 else m & ~hatched)
            if len(seq):
                rgba, i0, k0 = _pixels.spans(view, c0[seq], c1[seq], colors[code[seq], :3], alpha, y0, y1)
                im = _pixels.add(ax, view, rgba, i0, k0, z, "phase-shading" if z == 0 else "phase-strip")
                im.phasemem_cells = len(seq)
        for h in (False, True):
            sel = m & (hatched == h)
            if not sel.any() or (raster and (z == 0 or not h)):
                continue
            verts = np.empty((int(sel.sum()), 4, 2))
            verts[:, :, 0] = np.stack([c0[sel], c0[sel], c1[sel], c1[sel]], axis=1)
            verts[:, :, 1] = [y0, y1, y1, y0]
            fc = colors[code[sel]].copy()
            fc[:, 3] = alpha
            ax.add_collection(PolyCollection(verts, facecolors=fc, edgecolors="none", linewidths=0,
                                             hatch="xx" if h and z == 1 else None, hatchcolor="#ffffff",
                                             transform=ax.get_xaxis_transform(), zorder=z,
                                             gid="phase-unsure" if h and z == 1 else None), autolim=False)
    spans = view.x_px(x1) - view.x_px(x0)
    # No name is narrower than labels.Layout.fits' first bound for one character: most cells of a
    # long trace are a fraction of a pixel, and are not measured one by one.
    wide = np.flatnonzero(spans >= lay.px(STRIP_PT) * _labels.GLYPH_EM_MIN + _labels.FIT_AIR_PX)
    for xa, xb, c, span in zip(x0[wide].tolist(), x1[wide].tolist(), code[wide].tolist(), spans[wide].tolist()):
        phase = PHASES[c]
        q = "?" if phase in unsure else ""
        for name in (phase + q, _SHORT[phase] + q):
            if name and lay.fits(name, STRIP_PT, span, "bold"):
                ax.text((xa + xb) / 2, 1 - strip_frac / 2, name, transform=ax.get_xaxis_transform(),
                        ha="center", va="center", fontsize=STRIP_PT, color="white", fontweight="bold",
                        zorder=6, clip_on=True)
                break


def _oom_marks(ax, lay, view, placed, X, report, a, b, strip_px):
    """A red line where the allocator ran out of memory on this device, with what was asked."""
    for o in report.ooms:
        if (o.device and o.device != report.device) or not a <= o.event < b:
            continue
        x = float(X[o.event])
        ax.axvline(x, color=_OOM, lw=OOM_LW, ls="--", zorder=8, gid="oom")
        label = f"OUT OF MEMORY: asked {format_bytes(o.requested_bytes)}, {format_bytes(o.device_free_bytes)} free"
        w, h = lay.text_size(label, CALLOUT_PT, "bold")
        px = view.x_px(x)
        right = px + OOM_GAP_PX + w <= view.right_px
        cx = px + OOM_GAP_PX + w / 2 if right else px - OOM_GAP_PX - w / 2
        cy = (view.top_px - strip_px + float(view.y_px(0))) / 2  # mid-height: the peak's label sits on top
        placed.add(cx - w / 2, cx + w / 2, cy - h / 2, cy + h / 2)
        ax.text(float(view.x_data(cx)), float(view.y_data(cy)), label, ha="center", va="center", fontsize=CALLOUT_PT,
                color=_OOM, fontweight="bold", zorder=9,
                bbox=dict(boxstyle="square,pad=0.15", fc="white", ec="none", alpha=OOM_BOX_ALPHA))


def _phase_ticks(ax, X, ticks, strip_frac):
    """A thin tick in the strip where a phase ran without an allocator event."""
    if not ticks:
        return
    # at_event is fractional (between two events): x is interpolated between their edges.
    xs = [_x_at(X, e) for e, _ in ticks]
    # White under the colour: the tick usually sits between two cells of other phases.
    ax.vlines(xs, 1 - strip_frac * TICK_REACH, 1, transform=ax.get_xaxis_transform(), colors="white",
              lw=TICK_EDGE_LW, zorder=5)
    ax.vlines(xs, 1 - strip_frac * TICK_REACH, 1, transform=ax.get_xaxis_transform(),
              colors=[PHASE_COLORS[p] for _, p in ticks], lw=TICK_LW, zorder=5.1, gid="phase-tick")


def _x_at(X, e: float) -> float:
    k = int(np.floor(e))
    k = min(max(k, 0), len(X) - 2)
    return float(X[k] + (e - k) * (X[k + 1] - X[k]))


def _step_marks(ax, lay, view, X, shown, a, b, step_px):
    """Vertical lines between steps and the step numbers above the axes."""
    # A line every few pixels is a grey wall that hides the bands; the strip still shows the steps' rhythm.
    if len(step_px) and step_px.mean() >= _MIN_STEP_LINE_PX:
        bounds = sorted({st.start_event for st in shown if st.start_event > a} | {st.end_event + 1 for st in shown})
        xs = [X[e] for e in bounds if a < e < b]
        if xs:
            ax.vlines(xs, 0, 1, transform=ax.get_xaxis_transform(), colors="#222222", lw=STEP_LINE_LW,
                      alpha=STEP_LINE_ALPHA, zorder=4)
    placed = _labels.Boxes()
    # Only steps wide enough for their shorter label's first bound in labels.Layout.fits are tried
    # (21,787 steps on 1,500 pixels were measured one by one), and only those wide enough for one
    # character are asked how many they need.
    one = np.flatnonzero(step_px >= lay.px(STEP_PT) * _labels.GLYPH_EM_MIN + _labels.FIT_AIR_PX)
    chars = np.array([len(str(shown[i].number)) + (not shown[i].complete) for i in one.tolist()], dtype=np.float64)
    wide = one[step_px[one] >= chars * lay.px(STEP_PT) * _labels.GLYPH_EM_MIN + _labels.FIT_AIR_PX]
    for st in (shown[i] for i in wide.tolist()):
        x0, x1 = X[max(st.start_event, a)], X[min(st.end_event + 1, b)]
        cx = float(view.x_px((x0 + x1) / 2))
        span = float(view.x_px(x1) - view.x_px(x0))
        tag = "" if st.complete else "*"
        for label in (f"step {st.number}{tag}", f"{st.number}{tag}"):
            if not lay.fits(label, STEP_PT, span):
                continue
            w, h = lay.text_size(label, STEP_PT)
            if placed.free(cx - w / 2, cx + w / 2, view.top_px, view.top_px + h):
                placed.add(cx - w / 2, cx + w / 2, view.top_px, view.top_px + h)
                ax.annotate(label, xy=((x0 + x1) / 2, 1), xycoords=ax.get_xaxis_transform(), xytext=(0, STEP_LIFT_PT),
                            textcoords="offset points", ha="center", va="bottom", fontsize=STEP_PT,
                            color="#222222" if st.complete else "#777777", annotation_clip=False)
                break


def _step_px(view, X, shown, a, b) -> np.ndarray:
    """How many pixels wide each shown step is drawn."""
    first = np.maximum(np.fromiter((st.start_event for st in shown), np.int64, len(shown)), a)
    stop = np.minimum(np.fromiter((st.end_event for st in shown), np.int64, len(shown)) + 1, b)
    return view.x_px(X[stop]) - view.x_px(X[first]) if len(shown) else np.zeros(0)


def _axes_style(ax, by, unit, span, w_px, h_px):
    ax.set_ylabel(f"allocated memory ({unit})", fontsize=LABEL_PT)
    ax.tick_params(labelsize=TICK_PT)
    # Tick labels like "1,200,000" need room: fewer of them on a narrow picture.
    ax.xaxis.set_major_locator(MaxNLocator(nbins=int(np.clip(w_px / X_TICK_PX, 2, X_TICKS_MAX)), integer=by == "event"))
    if by == "event":
        ax.set_xlabel("event (position in the allocator trace)", fontsize=LABEL_PT)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{int(v):,}"))
    else:
        # x is in µs; ticks are shown in the unit that keeps them short.
        div, name = (1e6, "s") if span >= 2e6 else (1e3, "ms") if span >= 2e3 else (1.0, "µs")
        ax.set_xlabel(f"time since the first event ({name})", fontsize=LABEL_PT)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / div:,.6g}"))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=int(np.clip(h_px / Y_TICK_PX, 2, Y_TICKS_MAX))))
    ax.grid(axis="y", color="#dddddd", lw=layout.GRID_LW, zorder=-1)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _title(fig, lay, report, shown, width, height):
    where = ""
    if report.analysis is not None and report.analysis.step_of[report.peak_event] >= 0:
        st = report.steps[int(report.analysis.step_of[report.peak_event])]
        where = f" in step {st.number} {PHASES[int(report.analysis.labels[report.peak_event])]}"
    left = f"{report.device} — peak {format_bytes(report.peak_bytes)} allocated{where}"
    right = f"{report.n_events:,} events · {len(report.steps)} step{'s' * (len(report.steps) != 1)}"
    inferred = sorted(ph for ph, src in report.sources.items() if src == "inferred")
    if inferred:  # a picture passed on without its report must still say its phases are guesses
        right = f"phases inferred (no markers) · {right}"
    if len(shown) != len(report.steps):
        right += f" (showing {len(shown)})"
    y = 1 - lay.px(TITLE_PT) * TITLE_TOP_EM / height
    margin = lay.px(TICK_PT) * layout.MARGIN_EM
    wl, _ = lay.text_size(left, TITLE_PT, "bold")
    wr, _ = lay.text_size(right, TITLE_PT)
    fig.text(margin / width, y, left, ha="left", va="top", fontsize=TITLE_PT, fontweight="bold")
    # The right part gives way on narrow pictures rather than run into the left one.
    if wl + wr + 3 * margin <= width:
        fig.text(1 - margin / width, y, right, ha="right", va="top", fontsize=TITLE_PT, color="#444444")


def _mark_handles(present, report, show_reserved, other_shown=False, repeated=()):
    unsure = _unsure(report)
    # an unsure phase hatched as its strip cells are, its '?' said: inferred, and how sure
    handles = [Patch(facecolor=PHASE_COLORS[p], edgecolor="none", alpha=LEGEND_PATCH_ALPHA,
                     hatch="xx" if p in unsure else None,
                     hatchcolor="#ffffff",
                     label=f"{p}? (inferred, {report.phases[p].confidence:.0%} sure)" if p in unsure else p)
               for p in present]
    if other_shown:
        handles.append(Patch(facecolor=_STRIP_OTHER, edgecolor="none", label="other: no phase known"))
    handles.append(Line2D([], [], color=_CURVE, lw=CURVE_LEGEND_LW, label="allocated"))
    if show_reserved:
        handles.append(Line2D([], [], color=_RESERVED, lw=RESERVED_LEGEND_LW,
                              label=f"reserved (peak {format_bytes(report.reserved_peak_bytes)})"))
    handles += [
        Line2D([], [], marker="o", color="none", markerfacecolor="#dddddd", markeredgecolor="#1b1b1b",
               markersize=PHASE_DOT_SIZE, label="phase peak (in its phase's colour)"),
        # a ring, as drawn: a filled red dot is what a backward phase's peak looks like
        Line2D([], [], marker="o", color="none", markerfacecolor="white", markeredgecolor=_labels.PEAK,
               markeredgewidth=_labels.PEAK_RING_LW, markersize=PEAK_RING_SIZE,
               label="overall peak"),
    ]
    # Occurrences past the one named in full carry only their kind's marker: say which is which.
    handles += [Line2D([], [], marker=BY_NAME[k].marker, color="none", markerfacecolor="white",
                       markeredgecolor=BY_NAME[k].colour, markersize=MARKER_SIZE, label=k) for k in repeated]
    return handles


def _legends(fig, lay, groups, rows, height):
    """The band colours on one legend, the phases and marks under it: each as many rows as it needs."""
    row_px = lay.px(LEGEND_PT) * layout.LEGEND_ROW_EM
    below = np.cumsum([0] + rows[::-1])[::-1][1:]  # rows under each group
    for handles, r, under in zip(groups, rows, below.tolist()):
        if handles and r:
            fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, under * row_px / height),
                       ncol=-(-len(handles) // r), frameon=False, fontsize=LEGEND_PT,
                       handlelength=layout.LEGEND_HANDLE_EM, columnspacing=layout.LEGEND_COLUMN_EM,
                       borderaxespad=layout.LEGEND_EDGE_EM, borderpad=LEGEND_PAD_EM,
                       labelspacing=layout.LEGEND_ROW_GAP_EM)
