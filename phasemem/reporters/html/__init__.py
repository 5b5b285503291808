"""The reporter of the interactive HTML page (page.py: the picture as SVG with its bands' hover and
zoom, and template.py: the page around it, the tables and the text). Its modules import matplotlib,
so they are imported here only when a page is asked for.

Example:
    >>> report.save_png("report.html")       # or Html().render(report): the page's text
"""
from __future__ import annotations

from ...output import Writer
from ...report.registry import writes
from ...report.report import Report


class Html:
    """``report.save_png("x.html")`` and ``phasemem analyze -o x.html``; ``options`` are the picture's."""

    name = "html"
    suffixes = (".html",)
    takes = (Report,)

    def render(self, report, **options) -> str:
        from ..picture.draw import figure  # matplotlib only when a page is asked for
        from .page import page_text

        return page_text(report, figure(report, "html", **options), **options)

    def writer(self, report, path=None, **options) -> Writer:
        return writes(self.render(report, **options))
