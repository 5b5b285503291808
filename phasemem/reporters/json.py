"""The reporter of JSON: a report, a comparison or a run of many ranks as its ``to_dict()`` values,
indented by one space (``report.to_json``, ``phasemem analyze --json``).

Example:
    >>> Json().render(report)[:1]
    '{'
"""
from __future__ import annotations

import json

from ..distributed.run_report import RunReport
from ..output import Writer
from ..report.comparison import Comparison
from ..report.registry import writes
from ..report.report import Report


class Json:
    """``to_dict()`` (and ``extra`` keys: a command's own, such as what-ifs or budgets) as JSON text."""

    name = "json"
    suffixes = (".json",)
    takes = (Report, Comparison, RunReport)

    def render(self, report, extra: dict | None = None) -> str:
        return json.dumps(report.to_dict() | (extra or {}), indent=1)

    def writer(self, report, path=None, **options) -> Writer:
        return writes(self.render(report, **options))
