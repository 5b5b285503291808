"""Whether an optional module is there, without importing it (torch takes seconds to import)."""
from __future__ import annotations

import importlib.util


def have(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package missing, or an import hook refusing it
        return False
