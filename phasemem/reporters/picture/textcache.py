"""Text measured once a picture: the sizes used to place labels are the ones matplotlib finds when it
draws them, and each font's line heights are read from its tables once, not once per text drawn."""
from __future__ import annotations

import functools

from matplotlib.font_manager import fontManager, get_font

try:
    # matplotlib's own cache of text sizes, per renderer: a text measured here to place it is not laid
    # out again when it is drawn (the title, callouts, legend entries: ~60 of a picture's ~100).
    from matplotlib.text import _get_text_metrics_with_cache as metrics  # type: ignore[attr-defined]  # private
except ImportError:  # private to matplotlib: where it is gone, measure without it
    def metrics(renderer, s, font, ismath, dpi):
        return renderer.get_text_width_height_descent(s, font, ismath=ismath)


def share_font_heights(renderer) -> None:
    """Give an Agg renderer the font line heights matplotlib's text layout asks a PDF or PS renderer
    for (``_get_font_height_metrics``): without it every text laid out (~220 a picture) finds its
    font and reads two of its tables again. The values are matplotlib's own, computed as it does."""
    dpi = renderer.dpi
    renderer._get_font_height_metrics = lambda prop: _font_heights(prop.copy(), dpi)


@functools.lru_cache(maxsize=256)
def _font_heights(prop, dpi):
    # matplotlib.text.Text._get_layout's reading of the tables, in its order of operations (same floats).
    font = get_font(fontManager._find_fonts_by_props(prop))
    for table_name, linegap_key, ascent_key, descent_key in (
            ("OS/2", "sTypoLineGap", "sTypoAscender", "sTypoDescender"), ("hhea", "lineGap", "ascent", "descent")):
        table = font.get_sfnt_table(table_name)
        if table is None:
            continue
        fontsize = prop.get_size_in_points()
        units_per_em = font.get_sfnt_table("head")["unitsPerEm"]
        scale = 1 / units_per_em * fontsize * dpi / 72
        return table[ascent_key] * scale, -table[descent_key] * scale, table[linegap_key] * scale
    return None, None, None
