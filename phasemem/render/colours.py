"""The picture's colours: palettes keyed by the vocabularies, shades that keep neighbouring bands
apart, and each band's colour by category, call site or phase, with the legend entries saying so."""
from __future__ import annotations

import numpy as np
from matplotlib import colors as mcolors
from matplotlib.patches import Patch

from ..stacks import stack_summary
from ..vocab import CATEGORY_COLORS, PHASE_COLORS, PHASES
from . import bands as _bands

_SHORT = {"forward": "fwd", "loss": "loss", "zero_grad": "zero", "backward": "bwd", "optimizer": "opt", "other": "?"}

_STRIP_OTHER = "#c8c8c8"  # the strip where no phase is known

#: An inferred phase less sure than this (its measured precision, segmentation.inferred.CONFIDENCE) is drawn
#: hatched and named with a '?': the frameless optimizer (0.66) and loss (0.69) are.
UNSURE = 0.9

_OOM = "#d62728"

#: ``color="stack"``: a call site's colour is its stack's hash into this palette: tab10 without its
#: grey (grey means no frames), then light tints of five of its hues.
STACK_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
                 "#17becf", "#a6cee3", "#fdbf6f", "#b2df8a", "#fb9a99", "#cab2d6")

COLOR_MODES = ("category", "stack", "phase")

_NO_FRAMES = "#a3a3a3"

_PHASE_OTHER = "#9d9d9d"  # color="phase": made outside every phase

_BASE = "#b5b5b5"  # memory from before recording, when not split by category

_FOLDED = "#d4d4d4"

#: ``color="category"``: the allocations summed on top are drawn per category, this far toward white,
#: dotted (``FOLDED_HATCH``): a light tint alone read as the phase strip's colours (activation as forward).
FOLDED_TINT = 0.45
FOLDED_HATCH = "...."

_CURVE = "#22313f"

_RESERVED = "#7a7a7a"

# Neighbouring bands of one colour would merge into a slab; alternating shades keep each allocation
# its own stripe (mix with white > 0, with black < 0). Call-site colours come in light and dark
# tints of a hue already, so they alternate less.
_SHADES = (0.0, 0.24, 0.1, 0.34, -0.1, 0.17)

_SHADES_STACK = (0.0, 0.1, -0.08, 0.05)


def _shade(rgb: np.ndarray, t: np.ndarray) -> np.ndarray:
    t = t[:, None]
    return np.where(t >= 0, rgb + (1 - rgb) * t, rgb * (1 + t))


def _band_colors(report, st, mode, codes, categories):
    """Face colour of every drawn band, the base and the folded band, and the legend saying so."""
    idx = st.index
    handles = []
    if mode == "category":
        names = np.array(categories)
        palette = np.array([mcolors.to_rgb(CATEGORY_COLORS[c]) for c in categories])
        rgb = palette[codes[idx]] if len(idx) else np.zeros((0, 3))
        present = sorted(set(codes[idx].tolist()) | set(st.base_keys.tolist()) | set(st.folded_keys.tolist()))
        handles = [Patch(facecolor=CATEGORY_COLORS[names[c]], edgecolor="none", label=names[c].replace("_", " "))
                   for c in present]
        base = [CATEGORY_COLORS[names[k]] for k in st.base_keys]
    elif mode == "phase":
        life = report.timeline.lifetimes
        alloc = life.alloc_event[idx]
        ph = np.where(alloc >= 0, report.label_codes[np.maximum(alloc, 0)], -1)
        table = {k: mcolors.to_rgb(PHASE_COLORS.get(p, _PHASE_OTHER)) for k, p in enumerate(PHASES)}
        table[-1] = mcolors.to_rgb(_NO_FRAMES)
        rgb = np.array([table[k] for k in ph.tolist()]).reshape(-1, 3)
        for k in sorted(set(ph.tolist()), key=lambda k: (k <= 0, abs(k))):
            label = "made before recording" if k < 0 else (f"made in {PHASES[k]}" if PHASES[k] != "other"
                                                         else "made outside phases")
            handles.append(Patch(facecolor=mcolors.to_hex(table[k]), edgecolor="none", label=label))
        base = [_BASE] * len(st.base_keys)
    else:
        rgb, handles = _stack_colors(report, st)
        base = [_BASE] * len(st.base_keys)
    shades = np.array(_SHADES_STACK if mode == "stack" else _SHADES)
    t = shades[np.arange(len(idx)) % len(shades)]
    fills = _shade(rgb, t) if len(idx) else rgb
    if len(st.base_keys) and st.base.sum() > 0:
        handles.append(Patch(facecolor="#eeeeee", edgecolor="#8a8a8a", hatch="////", lw=0,
                             label="alive from before recording to the end"))
    if mode == "category":
        # Lighter than any drawn band's shade (up to 0.34 toward white) and dotted, so a summed part is
        # told from an allocation drawn one by one, and still of its category's hue.
        folded = ([tuple(_shade(np.array([mcolors.to_rgb(CATEGORY_COLORS[names[k]])]), np.array([FOLDED_TINT]))[0])
                   for k in st.folded_keys], FOLDED_HATCH)
    else:
        folded = ([mcolors.to_rgb(_FOLDED)] * len(st.folded_keys), None)
    if st.n_folded:
        by = ", by category (dotted)" if mode == "category" else ""
        handles.append(Patch(facecolor=_FOLDED, edgecolor="#ffffff" if by else "none", lw=0,
                             hatch=FOLDED_HATCH if by else None, label=_bands.folded_label(st) + by))
    return (fills, base, folded), handles


def _stack_hash(sid: np.ndarray) -> np.ndarray:
    # Knuth's multiplicative hash: neighbouring stack ids (sites met one after the other) land far apart.
    return ((sid.astype(np.uint64) * np.uint64(2654435761)) % np.uint64(2**32) >> np.uint64(11)) % len(STACK_PALETTE)


def _stack_colors(report, st):
    trace = report.trace
    life = report.timeline.lifetimes
    alloc = life.alloc_event[st.index]
    sid = np.where(alloc >= 0, trace.stack[np.maximum(alloc, 0)], -1).astype(np.int64)
    has = sid >= 0
    named = []
    if has.any():
        # The sites holding the most bytes get named in the legend; the rest share the palette, unnamed.
        totals = np.bincount(sid[has], weights=st.size[has].astype(np.float64))
        top = np.argsort(-totals, kind="stable")[:6]
        named = top[totals[top] > 0].tolist()
    slot = _stack_hash(np.maximum(sid, 0)).astype(np.int64)
    # Two named sites must not share a colour: a collision moves the smaller one to the next free slot.
    taken, moved = set(), {}
    for s in named:
        k = int(_stack_hash(np.array([s]))[0])
        while k in taken and len(taken) < len(STACK_PALETTE):
            k = (k + 1) % len(STACK_PALETTE)
        taken.add(k)
        moved[s] = k
    for s, k in moved.items():
        slot[sid == s] = k
    palette = np.array([mcolors.to_rgb(c) for c in STACK_PALETTE])
    rgb = np.where(has[:, None], palette[slot], np.array(mcolors.to_rgb(_NO_FRAMES)))
    handles = [Patch(facecolor=STACK_PALETTE[moved[s]], edgecolor="none", label=_site(trace, s)) for s in named]
    if has.any() and len(np.unique(sid[has])) > len(named):
        handles.append(Patch(facecolor="white", edgecolor="#8a8a8a", lw=0.6,
                             label="other call sites (colour = hash of the stack)"))
    if (~has).any():
        handles.append(Patch(facecolor=_NO_FRAMES, edgecolor="none", label="no Python frames (autograd thread)"))
    return rgb.reshape(-1, 3), handles


def _site(trace, sid: int) -> str:
    """A call stack in a few words, for the legend (the report's own summary, shortened)."""
    text = stack_summary(trace, sid) or "no frames"
    return text if len(text) <= 60 else text[:59] + "…"


def _unsure(report) -> set[str]:
    """Phases inferred with a confidence below UNSURE: drawn hatched, named with a '?'."""
    return {p.name for p in report.phases.values() if p.source == "inferred" and p.confidence < UNSURE}
