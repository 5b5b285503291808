"""The picture's libraries imported in the background while a trace is read.

matplotlib's import is ~0.3 s, a quarter of reading a 1M-event snapshot (docs/performance.md). The
decoder spends much of its time in numpy calls on large arrays, which release the GIL, so a thread
importing matplotlib then makes progress at little cost to the reading: on 1M events, reading and the
import together took 1.36-1.41 s against 1.42-1.57 s one after the other. Only matplotlib's modules are
imported here, never phasemem's: two threads importing modules that import each other can deadlock on
the import locks, and matplotlib imports nothing of phasemem.
"""
from __future__ import annotations

import threading

#: What render/ imports from matplotlib (and Pillow, which writes the PNG): the costly part of its import.
MODULES = ("matplotlib.figure", "matplotlib.backends.backend_agg", "matplotlib.collections",
           "matplotlib.ticker", "matplotlib.patches", "matplotlib.lines", "matplotlib.image",
           "matplotlib.font_manager", "PIL.Image")


def _import_all() -> None:
    import importlib

    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # the renderer's own import says what is wrong, in the main thread
            return


def start() -> threading.Thread:
    """Begin importing the picture's libraries in a daemon thread; returns it (nothing needs to wait:
    an import the main thread reaches first, or while the thread holds it, waits on its module lock)."""
    t = threading.Thread(target=_import_all, name="phasemem-warm", daemon=True)
    t.start()
    return t
