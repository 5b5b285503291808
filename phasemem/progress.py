"""A line on stderr that says what a long command is doing ("phasemem: reading big.pickle: 4.2M
events… 12 s"), only on a terminal and once the command has run ``SHOW_AFTER`` seconds: a 10M-event
read was silent for tens of seconds (issue 40). How it is drawn, and why no tqdm: docs/performance.md.

Example:
    >>> with shown():
    ...     stage("reading snapshot.pickle")
    ...     count(4_200_000)        # from the reader's batches
"""
from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from contextlib import contextmanager

#: Seconds a command runs before its line appears: a short command prints no progress at all.
#: ``PHASEMEM_PROGRESS_AFTER`` overrides it (the tests show it at once).
SHOW_AFTER = 2.0
#: Seconds between two rewrites of the line.
REFRESH = 0.25


class _Line:
    """What is shown, and the thread that shows it."""

    def __init__(self, stream, after: float):
        self.stream, self.after = stream, after
        self.words: str | None = None
        self.n: int | None = None
        self.t0 = time.monotonic()
        self.width = 0  # characters on screen now
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="phasemem-progress", daemon=True)

    def _run(self) -> None:
        while not self.done.wait(REFRESH):
            self.draw()

    def draw(self) -> None:
        with self.lock:
            elapsed = time.monotonic() - self.t0
            if self.words is None or elapsed < self.after:
                return
            text = f"phasemem: {self.words}" + (f": {_events(self.n)}" if self.n else "") + f"… {elapsed:.0f} s"
            text = text[:max(shutil.get_terminal_size().columns - 1, 20)]  # a wrapped line cannot be rewritten
            self._write("\r" + text.ljust(self.width))
            self.width = len(text)

    def clear(self) -> None:
        with self.lock:
            if self.width:
                self._write("\r" + " " * self.width + "\r")
                self.width = 0

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: nothing more to say
            self.words = None


class _Clearing:
    """Stands for stdout or stderr while a line may be shown: the line is cleared before any other
    output, and stays away until the next ``stage``."""

    def __init__(self, stream, line: _Line):
        self._stream, self._line = stream, line

    def write(self, text: str) -> int:
        pause()
        return self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


_line: _Line | None = None


def stage(words: str) -> None:
    """Say what the command is doing now ("reading x.pickle", "analysing 4,200,000 events"); shown at
    once where the line is already due."""
    if _line is not None:
        _line.words, _line.n = words, None
        _line.draw()


def count(n: int) -> None:
    """How many events the current stage has got through."""
    if _line is not None:
        _line.n = n


def pause() -> None:
    """Clear the line and show nothing until the next ``stage``."""
    if _line is not None:
        _line.words = None
        _line.clear()


@contextmanager
def shown(stream=None):
    """Show progress on ``stream`` (stderr) while the block runs, where it is a terminal."""
    global _line
    stream = stream if stream is not None else sys.stderr
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    if not tty or _line is not None:
        yield
        return
    after = float(os.environ.get("PHASEMEM_PROGRESS_AFTER", SHOW_AFTER))
    _line = line = _Line(stream, after)
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Clearing(out, line), _Clearing(err, line)
    line.thread.start()
    try:
        yield
    finally:
        line.done.set()
        line.thread.join()
        line.clear()
        sys.stdout, sys.stderr = out, err
        _line = None


def _events(n: int) -> str:
    """4.2M events, 812k events, 2,817 events."""
    if n >= 1_000_000:
        return f"{n / 1e6:.1f}M events"
    if n >= 10_000:
        return f"{n / 1e3:.0f}k events"
    return f"{n:,} events"
