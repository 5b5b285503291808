"""Where the report types meet the reporters that write them. A reporter (text, JSON, picture, HTML
page, memory_viz labels: ``phasemem.reporters``) answers the ``Reporter`` protocol and enters itself
here when ``import phasemem`` runs; ``Written`` gives ``Report``, ``Comparison`` and ``RunReport``
the methods a user calls (``print``, ``to_json``, ``save_png``) through them. Nothing here imports a
reporter, so the report types stay plain data on a floor below the reporters.

Example:
    >>> reporter("text", report).render(report, full=True) == report.text(full=True)
    True
"""
from __future__ import annotations

import os
from typing import Any, Protocol

from ..output import Writer, atomic_write


class Reporter(Protocol):
    """One output of the report types: its ``name``, the file ``suffixes`` it writes, the report
    types it ``takes``; ``render`` gives the output, ``writer`` makes it now and returns a function that
    writes it to the (temporary) path it is given, for ``output.write_all``.

    Example:
        >>> r = reporter("json", report)
        >>> r.name, r.suffixes, r.render(report)[:1]
        ('json', ('.json',), '{')
    """

    # read-only: each reporter's are class constants
    @property
    def name(self) -> str: ...
    @property
    def suffixes(self) -> tuple[str, ...]: ...
    @property
    def takes(self) -> tuple[type, ...]: ...

    # each reporter takes its own options (``full=``, ``extra=``, ``size=``...)
    def render(self, report: Any, *args: Any, **options: Any) -> str | bytes: ...

    def writer(self, report: Any, path: str | os.PathLike | None, **options: Any) -> Writer: ...


#: Every reporter registered, the latest first (phasemem/reporters/__init__.py registers them).
_REGISTERED: list[Reporter] = []
#: The reporters that draw (a picture or a page): ``save_png`` takes the one its path's suffix names,
#: else the picture's, which says the formats it draws.
DRAWN = ("html", "picture")


def register(reporter: Reporter) -> Reporter:
    """Enter ``reporter``; it is found before any registered earlier under its name."""
    _REGISTERED.insert(0, reporter)
    return reporter


def reporter(name: str, report: Any) -> Reporter:
    """The registered reporter called ``name`` that takes ``report``'s type."""
    for r in _REGISTERED:
        if r.name == name and isinstance(report, r.takes):
            return r
    raise LookupError(f"no {name!r} reporter takes a {type(report).__name__} (phasemem.reporters registers them)")


def drawer(report: Any, path: str | os.PathLike) -> Reporter:
    """The reporter that draws ``report`` to ``path``, by its suffix (``.html``: the page)."""
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    for r in _REGISTERED:
        if r.name in DRAWN and suffix in r.suffixes and isinstance(report, r.takes):
            return r
    return reporter("picture", report)


def writes(content: str | bytes) -> Writer:
    """A function writing ``content`` (bytes, or text as UTF-8) to the path it is given."""
    def write(tmp):
        if isinstance(content, bytes):
            with open(tmp, "wb") as f:
                f.write(content)
        else:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(content)

    return write


class Written:
    """How the report types are written, through their reporters: the text (``str``), JSON and the
    picture, each file atomically. A report type gives ``to_dict()``; its reporters give the rest.

    Example:
        >>> print(report); report.to_json("report.json"); report.save_png("memory.png", size=(1200, 600))
    """

    def __str__(self) -> str:
        return reporter("text", self).render(self)  # type: ignore[return-value]  # text renders str

    def json_writer(self, extra: dict | None = None) -> Writer:
        """A function writing ``to_dict()`` (and ``extra`` keys) as JSON to the path it is given (for
        ``write_all``)."""
        return reporter("json", self).writer(self, None, extra=extra)

    def to_json(self, path) -> None:
        """Write ``to_dict()`` as JSON, atomically."""
        atomic_write(path, self.json_writer())

    def picture_writer(self, path, **options) -> Writer:
        """The picture (or page) drawn now, so that drawing errors come before any file is touched, and
        a function writing it, in the format ``path``'s extension names, to the path it is given."""
        return drawer(self, path).writer(self, path, **options)

    def save_png(self, path, **options) -> None:
        """Draw the picture to ``path`` (.png, .svg or .pdf, by its extension), atomically."""
        atomic_write(path, self.picture_writer(path, **options))
