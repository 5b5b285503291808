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

    pixels_at = None  # (left, bottom, canvas width, canvas height) in pixels

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
