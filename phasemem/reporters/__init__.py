"""The reporters: siblings that each write the report types (``Report``, ``Comparison``, ``RunReport``)
one way, behind one protocol (``phasemem.report.registry.Reporter``: a name, the suffixes it writes,
the types it takes, ``render`` and ``writer``), as memray's reporters are: text, JSON, the picture,
the HTML page, and labels inside the snapshot for memory_viz. Importing this package registers them
(``import phasemem`` does), which is how ``print(report)``, ``report.to_json`` and ``report.save_png``
reach them without the report types importing a reporter; none of them loads matplotlib until it draws.

Example:
    >>> from phasemem.report.registry import reporter
    >>> reporter("json", report).render(report) == json.dumps(report.to_dict(), indent=1)
    True
"""
from __future__ import annotations

from ..report.registry import register
from .html import Html
from .json import Json
from .memory_viz import MemoryViz
from .picture import Picture
from .text import Text

REPORTERS = tuple(register(r) for r in (Text(), Json(), Picture(), Html(), MemoryViz()))

__all__ = ["REPORTERS", "Html", "Json", "MemoryViz", "Picture", "Text"]
