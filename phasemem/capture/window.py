"""Step windows: record only some steps of a long loop (``instrument(..., steps="5000-5002")``).

The recording runs only between the boundary where step ``first - 1`` has ended and the one where
step ``last`` has, as a step counter or a trainer callback reports them, so the ring buffer holds the
window's steps alone; nothing here raises into the training loop (docs/integrations.md).
"""
from __future__ import annotations

import types
import warnings
from typing import Any, Callable

from ..steps import StepsError, parse_steps
from .hooks import install_bound


class StepWindow:
    """Which steps a run records, and when its recording starts and stops.

    Example:
        >>> w = StepWindow("10-12")
        >>> (w.first, w.last), w.opens_at(10), w.closes_at(13)
        ((10, 12), True, True)
    """

    def __init__(self, spec: Any, *, count: bool = True, hooks: tuple = ()) -> None:
        rng = parse_steps(spec)
        if rng is None:
            raise StepsError("steps=None: give a step number or a range of them: 3, 2-4, 2- or -4")
        self.spec = str(spec).strip()
        self.first = rng[0] or 0
        self.last = rng[1]  # None: until the block (or training) ends
        self.count = count
        # More marker installers (each returns its undo), run when the recording starts: Lightning's
        # callback marks the forward of the LightningModule's children too.
        self.hooks = tuple(hooks)
        self.done = 0  # steps completed so far, as last reported; a callback sets it before arming
        self.state = "new"  # new -> waiting -> recording -> closed
        self.recorded: list[int] = []  # [first step recorded, last step completed in the recording]
        self._run: Any = None
        self._undo: Callable[[], None] | None = None

    # -- the rule ----------------------------------------------------------------------------
    def opens_at(self, done: int) -> bool:
        """Whether a boundary after ``done`` completed steps starts the recording."""
        return self.first <= done and (self.last is None or done <= self.last)

    def closes_at(self, done: int) -> bool:
        """Whether a boundary after ``done`` completed steps ends it (the last step has run)."""
        return self.last is not None and done > self.last

    def meta(self) -> dict:
        """What goes into ``snapshot["phasemem"]``: the window asked for and the steps it holds."""
        held = bool(self.recorded) and self.done > self.recorded[0]
        return {"steps_requested": [self.first, self.last],
                "steps": [self.recorded[0], self.done - 1] if held else None}

    # -- driving a Run -----------------------------------------------------------------------
    def arm(self, run: Any, optimizers: list, model: Any) -> None:
        """Wait for the window: with ``count``, install the step counter; open at once if the window
        starts where the loop is now (``done``)."""
        if self.state != "new":
            raise StepsError("this step window was already used; make a new one per recording")
        self._run = run
        self.state = "waiting"
        if self.count:
            if optimizers:
                self._undo = _after_each_call(optimizers[0], "step", self._counted)
            elif model is not None:
                self._undo = _after_each_call(model, "forward", self._counted)
            else:
                self.state = "closed"
                raise StepsError(f"steps={self.spec!r} counts optimizer steps (or, without an optimizer, the "
                                 "model's forward calls): pass the model or the optimizer to instrument()")
        if self.opens_at(self.done):  # at once, from the caller's own start(): its errors are the caller's
            self.state, self.recorded = "recording", [self.done]
            try:
                self._begin(run)
            except BaseException:
                self.close()
                raise

    def _counted(self) -> None:
        self.boundary(self.done + 1)

    def boundary(self, done: int) -> bool:
        """``done`` steps have completed: start or stop the recording as the window says. True when
        this call closed the window (its snapshot is then in ``run.snapshot``)."""
        self.done = done
        run = self._run
        if self.state == "waiting" and self.opens_at(done):
            self.state = "recording"
            self.recorded = [done]
            if not _attempt(lambda: self._begin(run), "could not start recording"):
                self.close()
            return False
        if self.state == "recording" and self.closes_at(done):
            _attempt(run.stop, "could not finish the recording")  # Run.stop closes the window first
            self.close()
            return True
        return False

    def _begin(self, run: Any) -> None:
        run._begin()
        try:
            for install in self.hooks:  # undone with the run's own hooks, when it stops
                run._undo.append(install())
        except BaseException:
            run._teardown(take_snapshot=False)
            raise

    def block_ended(self, run: Any) -> None:
        """The block (or training) ended before the window opened: nothing was recorded."""
        self.close()
        run._state = "done"
        run._failure = (f"the loop ended after {self.done} step(s), before steps={self.spec} "
                        f"(steps count from 0); record earlier steps")
        warnings.warn(f"phasemem: {run._failure}", RuntimeWarning, stacklevel=4)

    def close(self) -> None:
        """No more boundaries: remove the counter (the run is stopping). Idempotent."""
        self.state = "closed"
        undo, self._undo = self._undo, None
        if undo is not None:
            undo()


def _attempt(fn: Callable[[], Any], what: str) -> bool:
    # Called from inside the training loop (an optimizer step, a trainer hook): an error of the
    # recording must not stop the training, only this recording.
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        warnings.warn(f"phasemem: {what} ({type(e).__name__}: {e}); training goes on unrecorded",
                      RuntimeWarning, stacklevel=3)
        return False
    return True


def _after_each_call(obj: Any, name: str, after: Callable[[], None]) -> Callable[[], None]:
    """Replace ``obj.<name>`` by a bound wrapper that calls ``after()`` each time the call returns;
    the returned undo puts back what was there (or, if someone wrapped over us since, makes ours a
    pass-through). A bound method on the instance, as ``hooks.wrap_method`` does and for the same
    reasons: ``LRScheduler`` re-wraps ``optimizer.step`` through ``__func__``, and Lightning, GradScaler
    and accelerate all call the instance's ``step``."""
    inner = getattr(obj, name)
    active = [True]
    plain = isinstance(inner, types.MethodType) and inner.__self__ is obj
    func = inner.__func__ if plain else inner

    def wrapper(self, *args, **kwargs):
        out = func(self, *args, **kwargs) if plain else func(*args, **kwargs)
        if active[0]:
            after()
        return out

    return install_bound(obj, name, inner, wrapper, active)
