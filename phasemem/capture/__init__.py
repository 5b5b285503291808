"""Capture: the only part of phasemem that drives torch. Produces a snapshot dict (docs/design.md);
``phasemem.instrument()`` (phasemem/run.py) adds its report."""

from .hooks import PREFIX
from .instrument import Recording

__all__ = ["PREFIX", "Recording"]
