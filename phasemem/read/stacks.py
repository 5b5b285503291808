"""Call stacks, read as a person reads them: which frames are the user's own code, and a one-line
summary of where an allocation came from. Used by the report's top allocations, the picture's
legend and the live-memory view."""
from __future__ import annotations

from .trace import Trace


def stack_summary(trace: Trace, stack_id: int) -> str | None:
    """'innermost ← first frame outside torch' for a stack, or None when the event has no frames."""
    if stack_id < 0:
        return None
    frames = [trace.frames[f] for f in trace.stacks[stack_id]]
    # With stacks="all" the innermost frames are the allocator's own C++; the Python ones say where,
    # and without any (the autograd thread) the first C++ frame past the allocator's machinery.
    frames = ([f for f in frames if f[0].endswith(".py")]
              or [f for f in frames if not any(s in f[2] for s in _MACHINERY)] or frames)
    # C++ names carry their whole signature; the qualified name is enough to read
    frames = [(f, ln, n if f.endswith(".py") else n.split("(")[0]) for f, ln, n in frames]
    fn, line, name = frames[0]
    text = f"{name} ({short_path(fn)}:{line})"
    for fn2, line2, name2 in frames[1:]:
        if not is_library(fn2):
            if (fn2, line2, name2) != frames[0]:
                text += f" ← {name2} ({short_path(fn2)}:{line2})"
            break
    return text


#: C++ frames that every allocation passes through (as memory_viz's frameFilter drops them).
_MACHINERY = ("unwind", "CapturedTraceback", "gather_with_cpp", "CachingAllocator", "empty_", "at::detail::",
              "c10::", "at::native::empty", "at::empty", "_PyEval", "PyObject_", "wrapper_", "at::_ops::")


def short_path(fn: str) -> str:
    for cut in ("site-packages/", "dist-packages/"):
        if cut in fn:
            return fn.split(cut, 1)[1]
    return fn.rsplit("/", 2)[-1] if fn.count("/") > 2 else fn


def is_library(fn: str) -> bool:
    # phasemem's own hooks wrap optimizer.step under instrument(): not the user's code either
    fn = fn.replace("\\", "/")
    return ("site-packages/" in fn or "dist-packages/" in fn or "/torch/" in fn or fn.startswith("<")
            or "phasemem/capture" in fn)
