"""The console entry point; the subcommands live in ``phasemem/commands/``, one module each."""
from __future__ import annotations

from . import EXIT_ERROR, EXIT_INTERRUPTED, main

__all__ = ["main", "EXIT_ERROR", "EXIT_INTERRUPTED"]
