"""The reporter of text: a report (short.py: a screen or two, ``print(report)``; full.py: every step
and shape, ``report.text(full=True)``), a comparison (compare.py) or a run of many ranks (ranks.py).

Example:
    >>> Text().render(report, full=True) == report.text(full=True)
    True
"""
from __future__ import annotations

from ...distributed.run_report import RunReport
from ...output import Writer
from ...report.comparison import Comparison
from ...report.registry import writes
from ...report.report import Report
from .compare import format_comparison
from .ranks import format_run
from .short import format_report


class Text:
    """The lines ``print`` shows; ``full`` (a Report's and a run's): every step's phases and every shape."""

    name = "text"
    suffixes = (".txt",)
    takes = (Report, Comparison, RunReport)

    def render(self, report, full: bool = False) -> str:
        if isinstance(report, Report):
            return format_report(report, full=full)
        return format_comparison(report) if isinstance(report, Comparison) else format_run(report, full=full)

    def writer(self, report, path=None, **options) -> Writer:
        return writes(self.render(report, **options))
