"""Phase markers: user-scope profiler ranges named ``phasemem::<phase>`` around the training loop's calls.

Every installer here returns an *undo* callable that never assumes it touched an attribute last;
installs are shared process-wide, one range per phase call (docs/capture.md, "Markers").
"""

from __future__ import annotations

import functools
import itertools
import threading
import types
from typing import Any, Callable

import torch

from ..vocab import MARKER_PREFIX

PREFIX = MARKER_PREFIX

Undo = Callable[[], None]
_get_ident = threading.get_ident


# -- the ranges ----------------------------------------------------------------------------------
# ``torch.profiler.record_function`` opens its range through a dispatched op
# (``profiler::_record_function_enter_new``) and a Python object per range: ~4-9 us a range. The direct
# bindings below open the same kind of range (a ``RecordFunction`` in ``USER_SCOPE``, which is what
# the allocator's annotation callback and the CPU profiler listen to) without either: ~1 us. Not
# ``torch._C._profiler._RecordFunctionFast``: it uses ``FUNCTION`` scope, only while the profiler
# runs, so it never reaches ``external_annotations``.

def _record_function_enter(name: str) -> Any:
    rf = torch.profiler.record_function(name)
    rf.__enter__()
    return rf


def _record_function_exit(rf: Any) -> None:
    rf.__exit__(None, None, None)


_fast_enter = getattr(torch.autograd, "_record_function_with_args_enter", None)
_fast_exit = getattr(torch.autograd, "_record_function_with_args_exit", None)
#: How a range is opened and closed; module attributes, looked up per call (the overhead benchmark
#: swaps in the ``record_function`` pair to measure the difference).
_range_enter: Callable[[str], Any] = _fast_enter if _fast_enter and _fast_exit else _record_function_enter
_range_exit: Callable[[Any], None] = _fast_exit if _fast_enter and _fast_exit else _record_function_exit


class Markers:
    """The marker ranges currently open, so whatever an exception left open can be closed.

    ``start`` returns an int token for ``end``. Tokens grow, so ``close_since(mark())`` closes only
    what was opened after the mark: a nested run closes its own ranges, not the outer run's.
    No lock: the dict operations used are atomic under the GIL (and thread-safe without it).
    """

    def __init__(self, prefix: str = PREFIX) -> None:
        self.prefix = prefix
        self._open: dict[int, Any] = {}
        self._ids = itertools.count(1)
        # Phase calls per thread ({thread: Counter(phase)}): what a run compares with the ranges its
        # recording holds (a recorder that missed a thread or lost events must say so: capture/lost.py).
        # Each thread writes only its own Counter, so no increment is lost to a race.
        self._calls: dict[int, dict[str, int]] = {}

    def start(self, phase: str) -> int:
        name = self.prefix + phase
        handle = _range_enter(name)
        token = next(self._ids)
        self._open[token] = handle
        # Inlined count(): this runs on every phase call (a method call and a Counter cost ~1 us more).
        mine = self._calls.get(_get_ident())
        if mine is None:
            mine = self._calls.setdefault(_get_ident(), {})
        mine[name] = mine.get(name, 0) + 1
        return token

    def count(self, name: str) -> None:
        """One range named ``name`` opened on this thread (``start`` counts its own; torch's
        ``Optimizer.step#...`` ranges are counted by a step hook, under ``TORCH_STEP``)."""
        mine = self._calls.get(_get_ident())
        if mine is None:
            mine = self._calls.setdefault(_get_ident(), {})
        mine[name] = mine.get(name, 0) + 1

    def calls(self) -> dict[tuple[str, int], int]:
        """``{(range name, thread): calls}`` so far; a run subtracts what it found at its start."""
        return {(name, thread): n for thread, c in list(self._calls.items()) for name, n in list(c.items())}

    def end(self, token: int) -> None:
        handle = self._open.pop(token, None)
        if handle is not None:  # already closed by close_since (an exception path): nothing to do
            _range_exit(handle)

    def mark(self) -> int:
        return next(self._ids)

    def close_since(self, mark: int) -> None:
        """Close, innermost first, every range opened after ``mark``."""
        for token in sorted((t for t in list(self._open) if t > mark), reverse=True):
            self.end(token)

    @property
    def open_count(self) -> int:
        return len(self._open)


#: What the step hook counts torch's own optimizer ranges under: every ``Optimizer.step#<Cls>.step``.
TORCH_STEP = "Optimizer.step#"

#: The one set of open ranges that every run's hooks write to (hooks are shared between nested runs).
MARKERS = Markers(PREFIX)


# -- shared installs -----------------------------------------------------------------------------
_registry_lock = threading.Lock()
_registry: dict[tuple, list] = {}  # key -> [references, undo, the object hooked (kept alive, compared)]


def _shared(key: tuple, obj: Any, install: Callable[[], Undo]) -> Undo:
    """Install once per (key, object); later callers take a reference. The returned release undoes
    the install when the last reference goes, and does nothing when called again."""
    with _registry_lock:
        entry = _registry.get(key)
        if entry is None or entry[2] is not obj:
            entry = [0, install(), obj]
            _registry[key] = entry
        entry[0] += 1
    released = [False]

    def release() -> None:
        with _registry_lock:
            if released[0]:
                return
            released[0] = True
            entry[0] -= 1
            if entry[0] > 0:
                return
            if _registry.get(key) is entry:
                del _registry[key]
        entry[1]()

    return release


def _maybe_uncompiled(fn: Callable, module: torch.nn.Module) -> Callable:
    # ``module.compile()`` compiles ``_call_impl`` itself, hooks included; a hook traced into the graph
    # would lose its range, so it is kept out of dynamo (a graph break at the frame's edges).
    if getattr(module, "_compiled_call_impl", None) is None:
        return fn
    return torch.compiler.disable(fn)


# -- installers ----------------------------------------------------------------------------------
def hook_forward(module: torch.nn.Module, markers: Markers = MARKERS) -> Undo:
    """``forward`` range around every call of ``module`` (only this module, not its children): its
    ``forward`` wrapped (the fast path), forward hooks where it is compiled in place or has hooks of its
    own (why each: docs/capture.md, "Markers").
    """
    if (getattr(module, "_compiled_call_impl", None) is not None
            or getattr(module, "_forward_pre_hooks", None) or getattr(module, "_forward_hooks", None)):
        return _shared(("forward", id(module)), module, lambda: _hook_forward(module, markers))
    return wrap_method(module, "forward", "forward", markers)


def _hook_forward(module: torch.nn.Module, markers: Markers) -> Undo:
    stack: list[int] = []
    # A copy.deepcopy of the module made inside the block (an EMA copy, say) copies these hooks too;
    # the flag makes such strays inert after exit.
    active = [True]
    start, end = markers.start, markers.end

    def pre(mod, args):
        if active[0]:
            stack.append(start("forward"))

    def post(mod, args, output):
        # always_call=True runs this also when forward raised; the stack keeps re-entrant calls
        # of the same module (recursion, a module called inside its own forward) paired.
        if stack:
            end(stack.pop())

    pre, post = _maybe_uncompiled(pre, module), _maybe_uncompiled(post, module)
    # Prepended, so that no other pre-hook can raise before ours has opened the range that
    # our always_call post-hook will close.
    h_pre = module.register_forward_pre_hook(pre, prepend=True)
    try:
        h_post = module.register_forward_hook(post, always_call=True)
    except TypeError:  # torch < 2.1: no always_call; an exception leaves the range to close_since
        h_post = module.register_forward_hook(post)

    def undo() -> None:
        active[0] = False
        h_pre.remove()
        h_post.remove()
        while stack:
            end(stack.pop())

    return undo


def wrap_method(obj: Any, name: str, phase: str, markers: Markers = MARKERS) -> Undo:
    """Replace ``obj.<name>`` by a bound wrapper that runs the call inside a ``phase`` range.

    A bound method (not a plain function) on the instance, because ``LRScheduler`` re-wraps
    ``optimizer.step`` through ``opt.step.__func__``; and wrapping the instance (not hooks) closes
    the range in ``finally`` when the call raises, which ``register_step_post_hook`` would not.
    """
    return _shared(("method", id(obj), name), obj, lambda: _wrap_method(obj, name, phase, markers))


def _wrap_method(obj: Any, name: str, phase: str, markers: Markers) -> Undo:
    inner = getattr(obj, name)
    active = [True]
    start, end = markers.start, markers.end
    if isinstance(inner, types.MethodType) and inner.__self__ is obj:
        # Called on ``self``, not on ``obj``: a deepcopy of ``obj`` carries this wrapper bound to the
        # copy, and its zero_grad must clear the copy's grads.
        func = inner.__func__

        def wrapper(self, *args, **kwargs):
            if not active[0]:
                return func(self, *args, **kwargs)
            token = start(phase)
            try:
                return func(self, *args, **kwargs)
            finally:
                end(token)
    else:  # an instance-level function (an LRScheduler's wrapper) already knows its object

        def wrapper(self, *args, **kwargs):
            if not active[0]:
                return inner(*args, **kwargs)
            token = start(phase)
            try:
                return inner(*args, **kwargs)
            finally:
                end(token)

    return install_bound(obj, name, inner, wrapper, active)


def install_bound(obj: Any, name: str, inner: Any, wrapper: Callable, active: list) -> Undo:
    """Put ``wrapper`` on ``obj`` as the bound method ``name``; the returned undo puts back what was
    there, or, if someone wrapped over it since, leaves ``active[0]`` False so it passes through."""
    had_own = name in obj.__dict__
    own_before = obj.__dict__.get(name)
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


def hook_optimizer(opt: torch.optim.Optimizer, markers: Markers = MARKERS) -> Undo:
    """``zero_grad`` and ``optimizer`` ranges -- where PyTorch does not already record them (a
    ``torch.optim.Optimizer``'s own ranges reach the snapshot; a second would only cost time:
    docs/capture.md, "Markers").
    """
    noop: Undo = lambda: None  # noqa: E731
    torch_marks_step = bool(getattr(type(opt).step, "hooked", False))
    torch_marks_zero = type(opt).zero_grad is torch.optim.Optimizer.zero_grad
    undo_zero = noop if torch_marks_zero else wrap_method(opt, "zero_grad", "zero_grad", markers)
    undo_step = noop if torch_marks_step else wrap_method(opt, "step", "optimizer", markers)
    # torch's step range is not ours to count as it opens: a post-hook counts the calls, so a recording
    # that lost them can be told (capture/lost.py). Shared, as the wrappers are, so a nested run's
    # reference does not count a step twice.
    undo_count = _shared(("step_count", id(opt)), opt, lambda: _count_steps(opt, markers)) \
        if torch_marks_step and hasattr(opt, "register_step_post_hook") else noop

    def undo() -> None:
        undo_count()
        undo_step()
        undo_zero()

    return undo


def _count_steps(opt: torch.optim.Optimizer, markers: Markers) -> Undo:
    active = [True]  # a deepcopy of the optimizer made inside the block copies the hook: inert after exit

    def counted(optimizer, args, kwargs):
        if active[0]:
            markers.count(TORCH_STEP)

    handle = opt.register_step_post_hook(counted)

    def undo() -> None:
        active[0] = False
        handle.remove()

    return undo


def patch_backward(markers: Markers = MARKERS) -> Undo:
    """``backward`` range around ``torch.autograd.backward`` and ``torch.autograd.grad``.

    ``Tensor.backward`` looks ``torch.autograd.backward`` up on every call, so it is covered without a
    wrapper of its own (one Python call less per step). Reentrant checkpointing calls
    ``torch.autograd.backward`` again from the autograd thread; a process-wide depth counter keeps
    that to one range per outer call.
    """
    return _shared(("backward",), torch.autograd, lambda: _patch_backward(markers))


def _patch_backward(markers: Markers) -> Undo:
    lock = threading.Lock()
    depth = [0]
    active = [True]
    start, end = markers.start, markers.end

    def make(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with lock:
                outer = active[0] and depth[0] == 0
                depth[0] += 1
            token = start("backward") if outer else None
            try:
                return fn(*args, **kwargs)
            finally:
                with lock:
                    depth[0] -= 1
                if token is not None:
                    end(token)

        return wrapped

    targets = [
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
