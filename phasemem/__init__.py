"""phasemem: read a PyTorch memory profile the way an expert reads an X-ray.

Example:
    >>> from phasemem import instrument
    >>> with instrument(model, opt) as run:
    ...     for _ in range(3):
    ...         train_step()
    >>> report = run.report()
    >>> report.save_png("memory.png")
    >>> report.phases["optimizer"].peak_bytes
"""
from .report.pipeline import analyze
from .report.compare import compare
from .report.comparison import Comparison
from .errors import PhasememError
from .distributed.pool import analyze_ranks
from .distributed.run_report import RunReport
from .report.report import Allocation, Phase, Report, Step
from . import reporters  # noqa: F401 - registers the text, JSON, picture and page the report types write through

__all__ = ["analyze", "analyze_ranks", "compare", "Comparison", "RunReport", "instrument", "PhasememError", "Report", "Step", "Phase", "Allocation"]
__version__ = "0.1.0"


def __getattr__(name):
    # capture imports torch; analysing a saved snapshot should not pay for that.
    if name == "instrument":
        from .run import instrument

        return instrument
    raise AttributeError(name)
