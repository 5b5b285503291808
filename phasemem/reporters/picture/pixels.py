"""Layers drawn as images of the canvas' own pixels: the allocation bands (``bands.raster``) and the
phase shading, where thousands of polygons would cost matplotlib a path each. Each image covers the
whole pixels the axes touch and is copied onto a canvas of the size it was made for as it is."""
from __future__ import annotations

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.image import AxesImage
from PIL import Image

#: zlib's level for the PNG: 3 encodes a 1600×900 picture (a 1M-event trace's, or gpt_adamw_foreach's)
#: in ~27 ms against ~38 ms at Pillow's default 6, for files ~4 % larger (144 against 139 KB).
PNG_COMPRESS_LEVEL = 3


def grid(view) -> tuple[int, int, int, int]:
    """The canvas pixels the axes touch: columns [i0, i1), rows [k0, k1) (rows counted from the bottom)."""
    return (int(np.floor(view.left_px)), int(np.ceil(view.right_px)),
            int(np.floor(view.bottom_px)), int(np.ceil(view.top_px)))


def to_bytes(values) -> np.ndarray:
    """Colour channels in [0, 1] as Agg writes them: floor(c * 255 + 0.5) (halves up, not to even)."""
    return np.floor(np.asarray(values, dtype=np.float64) * 255 + 0.5).astype(np.uint8)


def add(ax, view, rgba: np.ndarray, i0: int, k0: int, zorder: float, gid: str) -> AxesImage:
    """Put ``rgba`` (rows bottom first) on the axes with its lower left pixel at canvas pixel (i0, k0)."""
    h, w = rgba.shape[:2]
    im = PixelImage(ax, interpolation="nearest", origin="lower", zorder=zorder, gid=gid)
    im.set_data(rgba)
    im.set_extent((float(view.x_data(i0)), float(view.x_data(i0 + w)), float(view.y_data(k0)),
                   float(view.y_data(k0 + h))))
    im.set_clip_on(False)  # whole pixels: clipping at the axes' fractional edge would shift the copy
    im.pixels_at = (i0, k0, view.width, view.height)
    ax.add_image(im)
    return im


class PixelImage(AxesImage):
    """An image made pixel for pixel for the canvas it is drawn on: there it is copied as it is (the
    resampling, which gives the same pixels, took ~50 ms of a 1600×900 picture); any other canvas
    (another dpi, a vector format's own resolution) resamples it as any image."""

    pixels_at: tuple[int, int, int, int] | None = None  # (left, bottom, canvas width, canvas height) in pixels

    def make_image(self, renderer, magnification=1.0, unsampled=False):
        x, y, w, h = self.pixels_at
        if not unsampled and magnification == 1.0 and renderer.get_canvas_width_height() == (w, h):
            return np.ascontiguousarray(self.get_array()), x, y, None
        return super().make_image(renderer, magnification, unsampled)


def spans(view, x0, x1, rgb, alpha: float, y0: float, y1: float):
    """Full-height spans [x0, x1) (data, in x order, not overlapping) of colours ``rgb`` (N, 3) at
    opacity ``alpha``, from axes fraction ``y0`` to ``y1``, as polygons of them fill: matplotlib
    snaps a rectangle's edges to whole pixels, so a pixel takes the one span that holds its centre
    (x0 < centre <= x1; a span between two centres takes none), wholly, laid over what is below at
    ``alpha``. Returns the RGBA image (rows bottom first) and its lower left canvas pixel.

    Example:
        >>> rgba, i0, k0 = spans(view, X[first], X[last + 1], colours, 0.14, 0, 0.95)
    """
    i0, i1, _, _ = grid(view)
    centre = np.arange(i0, i1) + 0.5
    a, b = view.x_px(x0), view.x_px(x1)
    k = np.searchsorted(a, centre, "left") - 1
    inside = k >= 0
    inside[inside] = centre[inside] <= b[k[inside]]
    ya = view.bottom_px + y0 * (view.top_px - view.bottom_px)
    yb = view.bottom_px + y1 * (view.top_px - view.bottom_px)
    k0, k1 = int(np.floor(ya)), int(np.ceil(yb))
    rows = np.arange(k0, k1) + 0.5
    row_in = (ya <= rows) & (rows < yb)
    line = np.zeros((i1 - i0, 4), np.uint8)
    line[inside, :3] = to_bytes(rgb[k[inside]])
    line[inside, 3] = to_bytes(alpha)
    out = np.zeros((k1 - k0, i1 - i0, 4), np.uint8)
    out[row_in] = line
    return out, i0, k0


def write_png(fig, path) -> None:
    """The figure drawn on its Agg canvas and written as a PNG by Pillow straight from the canvas'
    buffer: ``savefig`` draws the same pixels, then writes them as RGBA through ``imsave``; an opaque
    picture (every one drawn here: the figure is white) is written as RGB, a quarter fewer bytes to
    compress, the same pixels."""
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    buf = canvas.buffer_rgba()
    h, w = buf.shape[:2]
    img = Image.frombuffer("RGBA", (w, h), buf, "raw", "RGBA", 0, 1)
    if int(np.asarray(buf)[..., 3].min()) == 255:
        img = img.convert("RGB")
    img.save(path, format="png", compress_level=PNG_COMPRESS_LEVEL, dpi=(fig.dpi, fig.dpi),
             pnginfo=_png_info())


def _png_info():
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("Software", f"Matplotlib version{matplotlib.__version__}, https://matplotlib.org/")
    return info


def widen(a_px: np.ndarray, b_px: np.ndarray, code: np.ndarray, i0: int, i1: int):
    """Cells (x order, not overlapping, in canvas pixels) that give each phase narrower than a pixel
    the one pixel column its neighbour can spare, or None where no cell changes.

    A pixel takes the cell that holds its centre (``spans``), so a cell between two centres shows
    nowhere. Each such gap between two columns gives its left column to the widest hidden cell
    there (order kept), its right column to the next, when the column's owner keeps another column
    and the hidden cell's phase differs from both neighbours' (a sliver of the same colour is shown
    already); the rest stay hidden. Returned as (a, b) per cell: the whole columns each now holds, a
    hidden one empty (a == b) where it lies. Where nothing changes, the cells are left as they came
    (the same pixels, and an SVG's edges unsnapped)."""
    n = len(a_px)
    if not n or i1 <= i0:
        return None
    centre = np.arange(i0, i1) + 0.5
    k = np.searchsorted(a_px, centre, "left") - 1
    inside = k >= 0
    inside[inside] = centre[inside] <= b_px[k[inside]]
    owner = np.where(inside, k, -1)
    count = np.bincount(owner[inside], minlength=n)
    hidden = np.flatnonzero((count == 0) & (b_px > i0) & (a_px < i1))
    if not len(hidden):
        return None
    # the gap each hidden cell lies in: between columns g-1 and g
    gap = np.searchsorted(centre, a_px[hidden], "right")
    starts = np.flatnonzero(np.concatenate([[True], gap[1:] != gap[:-1]]))
    changed = False
    for s, e in zip(starts.tolist(), np.append(starts[1:], len(gap)).tolist()):
        g = int(gap[s])
        left = int(owner[g - 1]) if g >= 1 else -1
        right = int(owner[g]) if g < len(owner) else -1
        near = {int(code[o]) for o in (left, right) if o >= 0}
        cands = [int(c) for c in hidden[s:e] if int(code[c]) not in near]
        slots = [(g - 1, left) if left >= 0 and count[left] >= 2 else None,
                 (g, right) if right >= 0 and count[right] >= 2 else None]
        free = [x for x in slots if x is not None]
        if not cands or not free:
            continue
        picked = sorted(sorted(cands, key=lambda c: -(b_px[c] - a_px[c]))[:len(free)])
        if len(picked) == 1 and len(free) == 2:
            mid = (a_px[picked[0]] + b_px[picked[0]]) / 2  # the nearer column
            free = [free[0] if mid - centre[g - 1] <= centre[g] - mid else free[1]]
        for c, (col, was) in zip(picked, free):
            owner[col] = c
            count[was] -= 1
            count[c] += 1
        changed = True
    if not changed:
        return None
    return _cells_of_columns(owner, n, i0)


def _cells_of_columns(owner: np.ndarray, n: int, i0: int):
    """widen's (a, b) per cell from each pixel column's owner (-1: none) among the ``n`` cells, columns
    counted from ``i0``."""
    cols = np.flatnonzero(owner >= 0)
    # each cell's first and last column (contiguous: a column changes hands only at a gap's edge)
    lo = np.full(n, len(owner), np.int64)
    hi = np.full(n, -1, np.int64)
    np.minimum.at(lo, owner[cols], cols)
    np.maximum.at(hi, owner[cols], cols)
    has = hi >= 0
    b_new = np.where(has, i0 + hi + 1, -np.inf)
    # a hidden cell: empty, at the end of the cell before it (or at the view's left edge, before any)
    before = np.concatenate([[-np.inf], np.maximum.accumulate(b_new)[:-1]])
    at = np.where(np.isfinite(before), before, float(i0))
    return np.where(has, i0 + lo, at).astype(np.float64), np.where(has, b_new, at)
