"""Capture: the only part of phasemem that drives torch. Produces a snapshot dict (docs/design.md)."""

from .hooks import PREFIX
from .instrument import Run, instrument

__all__ = ["PREFIX", "Run", "instrument"]
