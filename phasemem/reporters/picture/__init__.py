"""The reporter of pictures: a report's labelled memory picture (draw.py), a comparison's (compare.py),
a run's lanes of ranks (ranks.py), as PNG, SVG or PDF. matplotlib is imported by those modules, and
they are imported here only when a picture is asked for, so that ``import phasemem`` loads none of it.

Example:
    >>> png = Picture().render(report, size=(1200, 600))     # the PNG's bytes
    >>> fig = Picture().figure(report, steps="2-4")           # report.plot(steps="2-4")
"""
from __future__ import annotations

import os
import tempfile
from typing import Callable

from ...distributed.run_report import RunReport
from ...output import Writer
from ...report.comparison import Comparison
from ...report.report import Report


class Picture:
    """``report.save_png`` / ``picture_writer`` for .png, .svg and .pdf, and ``report.plot()``."""

    name = "picture"
    suffixes = (".png", ".svg", ".pdf")
    takes = (Report, Comparison, RunReport)

    def figure(self, report, **options):
        """The picture as a matplotlib Figure; ``options`` are draw.plot's, compare.plot_comparison's
        or ranks.plot_ranks'."""
        if isinstance(report, Report):
            from .draw import plot  # matplotlib only when a picture is asked for
        elif isinstance(report, Comparison):
            from .compare import plot_comparison as plot
        else:
            from .ranks import plot_ranks as plot
        return plot(report, **options)

    def writer(self, report, path, **options) -> Writer:
        picture_writer: Callable[..., Writer]  # each kind of report takes its own options
        if isinstance(report, Report):
            from .draw import picture_writer  # matplotlib only when a picture is asked for
        elif isinstance(report, Comparison):
            from .compare import picture_writer
        else:
            from .ranks import picture_writer
        return picture_writer(report, path, **options)

    def render(self, report, format: str = "png", **options) -> bytes:
        """The picture file's bytes, in ``format`` (png, svg or pdf)."""
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "picture." + format)
            self.writer(report, path, **options)(path)
            with open(path, "rb") as f:
                return f.read()
