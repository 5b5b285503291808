"""phasemem: read a PyTorch memory profile the way an expert reads an X-ray.

The names in ``__all__`` are the public API (README.md, "The public API"); every other module and
name is internal and may move between versions (docs/design.md).

Example:
    >>> from phasemem import instrument
    >>> with instrument(model, opt) as run:
    ...     for _ in range(3):
    ...         train_step()
    >>> report = run.report()
    >>> report.save_png("memory.png")
    >>> report.phases["optimizer"].peak_bytes
"""
from . import reporters  # noqa: F401 - registers the text, JSON, picture and page the report types write through
from .distributed.pool import analyze_ranks
from .distributed.run_report import RunReport
from .errors import PhasememError
from .model import Allocation, OutOfMemory, Pattern, PeakBreakdown, Phase, Step, WhatIf
from .report.compare import compare
from .report.comparison import Comparison
from .report.pipeline import analyze
from .report.report import Report

__all__ = ["analyze", "analyze_ranks", "compare", "instrument",
           "Report", "Comparison", "RunReport",
           "Step", "Phase", "Allocation", "Pattern", "OutOfMemory", "PeakBreakdown", "WhatIf", "Fits", "Plan",
           "PhasememError"]
__version__ = "0.1.0"


def __getattr__(name):
    # Loaded when first asked for: ``instrument`` imports torch (analysing a saved snapshot should not
    # pay for it); ``Fits`` and ``Plan`` bring the fits and plans modules, which ``Report.fits`` and
    # ``Report.plan`` import only when called.
    if name == "instrument":
        from .run import instrument

        return instrument
    if name == "Fits":
        from .predictions.fits.answer import Fits

        return Fits
    if name == "Plan":
        from .predictions.plans.plan import Plan

        return Plan
    raise AttributeError(f"module 'phasemem' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
