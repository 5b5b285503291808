"""Phase markers: ``record_function("phasemem::<phase>")`` ranges around the training loop's calls.

Every installer here returns an *undo* callable; ``instrument()`` runs them in reverse on exit.
An undo never assumes it is the last one to have touched an attribute: when someone wrapped the
same attribute after us (an LR scheduler wrapping ``optimizer.step``, a nested ``instrument()``),
our wrapper is switched to pass-through instead of being pulled out from under theirs.
"""

from __future__ import annotations

import functools
import threading
import types
from typing import Any, Callable

import torch

PREFIX = "phasemem::"

Undo = Callable[[], None]


class Markers:
    """The marker ranges currently open, so ``close_all`` can end whatever an exception left open."""

    def __init__(self, prefix: str = PREFIX) -> None:
        self.prefix = prefix
        self._open: list[Any] = []
        self._lock = threading.Lock()

    def start(self, phase: str) -> Any:
        rf = torch.profiler.record_function(self.prefix + phase)
        rf.__enter__()
        with self._lock:
            self._open.append(rf)
        return rf

    def end(self, rf: Any) -> None:
        with self._lock:
            # Search from the innermost: ranges normally close LIFO, but a range closed out of order
            # (a hook raising between two others) must not take a neighbour with it.
            for i in range(len(self._open) - 1, -1, -1):
                if self._open[i] is rf:
                    del self._open[i]
                    break
            else:
                return
        rf.__exit__(None, None, None)

    def close_all(self) -> None:
        with self._lock:
            left, self._open = self._open, []
        for rf in reversed(left):
            rf.__exit__(None, None, None)

    @property
    def open_count(self) -> int:
        return len(self._open)


def _maybe_uncompiled(fn: Callable, module: torch.nn.Module) -> Callable:
    # ``module.compile()`` compiles ``_call_impl`` itself, hooks included; a hook traced into the graph
    # would lose its record_function, so it is kept out of dynamo (a graph break at the frame's edges).
    if getattr(module, "_compiled_call_impl", None) is None:
        return fn
    return torch.compiler.disable(fn)


def hook_forward(module: torch.nn.Module, markers: Markers) -> Undo:
    """``forward`` range around every call of ``module`` (only this module, not its children).

    For a ``torch.compile``d ``OptimizedModule`` pass the wrapper: its hooks run in eager before and
    after the compiled frame, so the range encloses the compiled forward.
    """
    stack: list[Any] = []
    # A copy.deepcopy of the module made inside the block (an EMA copy, say) copies these hooks too;
    # the flag makes such strays inert after exit.
    active = [True]

    def pre(mod, args):
        if active[0]:
            stack.append(markers.start("forward"))

    def post(mod, args, output):
        # always_call=True runs this also when forward raised; the stack keeps re-entrant calls
        # of the same module (recursion, a module called inside its own forward) paired.
        if stack:
            markers.end(stack.pop())

    pre, post = _maybe_uncompiled(pre, module), _maybe_uncompiled(post, module)
    # Prepended, so that no other pre-hook can raise before ours has opened the range that
    # our always_call post-hook will close.
    h_pre = module.register_forward_pre_hook(pre, prepend=True)
    try:
        h_post = module.register_forward_hook(post, always_call=True)
    except TypeError:  # torch < 2.1: no always_call; an exception leaves the range to close_all
        h_post = module.register_forward_hook(post)

    def undo() -> None:
        active[0] = False
        h_pre.remove()
        h_post.remove()
        while stack:
            markers.end(stack.pop())

    return undo


def wrap_method(obj: Any, name: str, phase: str, markers: Markers) -> Undo:
    """Replace ``obj.<name>`` by a bound wrapper that runs the call inside a ``phase`` range.

    A bound method (not a plain function) on the instance, because ``LRScheduler`` re-wraps
    ``optimizer.step`` through ``opt.step.__func__``; and wrapping the instance (not hooks) closes
    the range in ``finally`` when the call raises, which ``register_step_post_hook`` would not.
    """
    had_own = name in obj.__dict__
    own_before = obj.__dict__.get(name)
    inner = getattr(obj, name)
    active = [True]
    if isinstance(inner, types.MethodType) and inner.__self__ is obj:
        # Called on ``self``, not on ``obj``: a deepcopy of ``obj`` carries this wrapper bound to the
        # copy, and its zero_grad must clear the copy's grads.
        func = inner.__func__

        def call(self, args, kwargs):
            return func(self, *args, **kwargs)
    else:  # an instance-level function (an LRScheduler's wrapper) already knows its object

        def call(self, args, kwargs):
            return inner(*args, **kwargs)

    def wrapper(self, *args, **kwargs):
        if not active[0]:
            return call(self, args, kwargs)
        rf = markers.start(phase)
        try:
            return call(self, args, kwargs)
        finally:
            markers.end(rf)

    # Copies the inner function's attributes too: LRScheduler checks ``_wrapped_by_lr_sched`` on
    # ``opt.step`` and warns when a scheduler's wrapper seems to have been replaced.
    functools.update_wrapper(wrapper, getattr(inner, "__func__", inner))
    bound = types.MethodType(wrapper, obj)
    obj.__dict__[name] = bound

    def undo() -> None:
        active[0] = False
        if obj.__dict__.get(name) is bound:
            if had_own:
                obj.__dict__[name] = own_before
            else:
                del obj.__dict__[name]

    return undo


def hook_optimizer(opt: torch.optim.Optimizer, markers: Markers) -> Undo:
    """``zero_grad`` and ``optimizer`` ranges.

    ``GradScaler.step`` and Lightning's ``optimizer.step(closure)`` both call the instance's ``step``,
    so they are covered; with a closure, forward/zero_grad/backward nest inside ``optimizer``.
    """
    undo_zero = wrap_method(opt, "zero_grad", "zero_grad", markers)
    undo_step = wrap_method(opt, "step", "optimizer", markers)

    def undo() -> None:
        undo_step()
        undo_zero()

    return undo


def patch_backward(markers: Markers) -> Undo:
    """``backward`` range around ``Tensor.backward``, ``torch.autograd.backward`` and ``torch.autograd.grad``.

    ``Tensor.backward`` calls ``torch.autograd.backward``, and reentrant checkpointing calls it again
    from the autograd thread; a process-wide depth counter keeps that to one range per outer call.
    """
    lock = threading.Lock()
    depth = [0]
    active = [True]

    def make(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with lock:
                outer = active[0] and depth[0] == 0
                depth[0] += 1
            rf = markers.start("backward") if outer else None
            try:
                return fn(*args, **kwargs)
            finally:
                with lock:
                    depth[0] -= 1
                if rf is not None:
                    markers.end(rf)

        return wrapped

    targets = [
        (torch.Tensor, "backward"),
        (torch.autograd, "backward"),
        (torch.autograd, "grad"),
    ]
    saved = []
    for owner, name in targets:
        orig = getattr(owner, name)
        new = make(orig)
        setattr(owner, name, new)
        saved.append((owner, name, orig, new))

    def undo() -> None:
        active[0] = False
        for owner, name, orig, new in reversed(saved):
            if getattr(owner, name) is new:
                setattr(owner, name, orig)

    return undo
