"""Layout numbers more than one picture uses (the main one, the diff, the ranks, the plans, the live
one), each once here: in font sizes ("em": a multiple of a text's point size, in pixels through
``Layout.px``), in figure pixels, or in fractions of the figure. A number only one picture uses is named
at the top of that picture's module; the font sizes themselves are in labels.py (``TITLE_PT`` ...)."""
from __future__ import annotations

#: Left edge of the title lines, as a fraction of the figure's width (the diff, ranks and plan pictures).
TITLE_X = 0.01
#: Centre of the title's line below the figure's top, in title font sizes.
TITLE_LINE_EM = 1.3
#: From the title's line down to the headline under it, in title font sizes (the diff and ranks pictures;
#: the plan picture's is tighter).
SUBTITLE_EM = 1.6
#: The y tick label the left margin is measured with: the widest ``units.axis_unit`` writes.
Y_TICK_SAMPLE = "00.00"
#: Room under the axes for the x ticks (in tick font sizes) and the x axis' label (in label font sizes).
AXIS_TICKS_EM, AXIS_LABEL_EM = 2.0, 1.8
#: Height of one legend row, in legend font sizes.
LEGEND_ROW_EM = 1.9
#: A legend entry's width besides its text (handle, the gap to the text, the column spacing), in legend
#: font sizes: about what fig.legend takes with the spacing below.
LEGEND_ENTRY_EM = 3.6
#: Pixels of the figure's width a legend keeps free (air at its sides) when its rows are counted.
LEGEND_MARGIN_PX = 20
#: fig.legend's spacing in every picture, in legend font sizes: the handle's length, the gap between
#: columns, the air to the figure's edge, and (the main and live pictures) the gap between rows.
LEGEND_HANDLE_EM, LEGEND_COLUMN_EM, LEGEND_EDGE_EM, LEGEND_ROW_GAP_EM = 1.6, 1.4, 0.3, 0.35
#: Margin right of the axes and at the title's ends, in tick font sizes.
MARGIN_EM = 1.5
#: The axes are never narrower or lower than this many pixels, however small the picture.
MIN_AXES_PX = 16
#: Pixels between the plot and the phase strip above it, and under the title (with 2 more): the diff and
#: ranks pictures.
STRIPS_GAP_PX, STRIPS_ROOM_PX = 4, 6
#: A phase-strip cell within its slot and row (x, y, width, height): a hairline of white between cells.
CELL = (0.01, 0.06, 0.98, 0.88)
#: Width of the light grid's lines across the value axis' ticks (the main and live pictures).
GRID_LW = 0.6
