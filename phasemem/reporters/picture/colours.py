"""The picture's colours: palettes keyed by the vocabularies, shades that keep neighbouring bands
apart, and each band's colour by category, call site or phase, with the legend entries saying so."""
from __future__ import annotations

import hashlib

import numpy as np
from matplotlib import colors as mcolors
from matplotlib.patches import Patch

from ...read.stacks import stack_summary
from ...vocab import CATEGORY_COLORS, PHASE_COLORS, PHASES
from . import bands as _bands

#: The strip's names where the whole one does not fit. 'other' has none: a '?' there read as an unsure
#: phase, which is what a '?' after a name says (UNSURE).
_SHORT = {"forward": "fwd", "loss": "loss", "zero_grad": "zero", "backward": "bwd", "optimizer": "opt", "other": ""}

_STRIP_OTHER = "#c8c8c8"  # the strip where no phase is known

#: An inferred phase less sure than this (its measured precision, segmentation.inferred.CONFIDENCE) is drawn
#: hatched and named with a '?': the frameless loss (0.51) is.
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
        life = report.analysis.timeline.lifetimes
        alloc = life.alloc_event[idx]
        ph = np.where(alloc >= 0, report.analysis.labels[np.maximum(alloc, 0)], -1)
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


def _stack_texts(trace, sids) -> list[str]:
    """Each stack as the text of its frames (file, line, function), innermost first: what a stack is
    whichever reader numbered it."""
    return ["\n".join(f"{fn}:{line}:{name}" for fn, line, name in (trace.frames[f] for f in trace.stacks[s]))
            for s in sids]


def _stack_hash(texts) -> np.ndarray:
    """Palette slots from a digest of the frames, not from the stack ids: ids number the stacks in the
    order a reader meets them (the batched reader and ``pickle.load`` number one trace differently),
    and Python's own string hash changes with every process."""
    return np.array([int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "little")
                     % len(STACK_PALETTE) for t in texts], dtype=np.int64)


def _stack_colors(report, st):
    trace = report.analysis.trace
    life = report.analysis.timeline.lifetimes
    alloc = life.alloc_event[st.index]
    sid = np.where(alloc >= 0, trace.stack[np.maximum(alloc, 0)], -1).astype(np.int64)
    has = sid >= 0
    uniq, inverse = np.unique(sid[has], return_inverse=True)
    texts = _stack_texts(trace, uniq.tolist())
    slots = _stack_hash(texts)
    # The sites holding the most bytes get named in the legend (ties by their frames, not their ids);
    # the rest share the palette, unnamed.
    totals = np.bincount(inverse.reshape(-1), weights=st.size[has].astype(np.float64), minlength=len(uniq))
    named = sorted((k for k in range(len(uniq)) if totals[k] > 0), key=lambda k: (-totals[k], texts[k]))[:6]
    # Two named sites must not share a colour: a collision moves the smaller one to the next free slot.
    taken = set()
    for k in named:
        c = int(slots[k])
        while c in taken and len(taken) < len(STACK_PALETTE):
            c = (c + 1) % len(STACK_PALETTE)
        taken.add(c)
        slots[k] = c
    slot = np.zeros(len(sid), np.int64)
    slot[has] = slots[inverse.reshape(-1)]
    palette = np.array([mcolors.to_rgb(c) for c in STACK_PALETTE])
    rgb = np.where(has[:, None], palette[slot], np.array(mcolors.to_rgb(_NO_FRAMES)))
    handles = [Patch(facecolor=STACK_PALETTE[slots[k]], edgecolor="none", label=_site(trace, int(uniq[k])))
               for k in named]
    if len(uniq) > len(named):
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
