"""What a recording lost: phase calls the hooks saw that the snapshot does not hold, so that the run
warns and the report says so rather than draw part of the loop as all of it (docs/capture.md).

Example:
    >>> lost({"external_annotations": []}, {("phasemem::backward", 7): 3}, home=7, source="cpu-profiler")
    [{'range': 'phasemem::backward', 'phase': 'backward', 'calls': 3, 'recorded': 0, 'off_thread': 0,
      'cause': 'missing'}]"""
from __future__ import annotations

import bisect
from collections import Counter

from .hooks import PREFIX, TORCH_STEP

#: Ranges whose spans must hold memory events when they ran: a backward makes gradients (of the
#: weights, or at least of the activations it passes back). Measured: in each of the 68 recordings in
#: fixtures/ with backward ranges (CPU and H200, compiled and CUDA-graphed ones included) events fall
#: inside them; only ranges older than a wrapped ring buffer's first event are empty (gpt_wrapped).
MUST_ALLOCATE = (PREFIX + "backward",)


#: Why a phase is lost, as the warning and the report's note say it.
CAUSES = {
    "thread": "ran on another thread than the one that entered instrument(), and torch's CPU profiler records "
              "only that thread, so their memory events are not in this recording (enter instrument() on the "
              "thread that runs the loop)",
    "missing": "ran more times than the recording holds ranges of them: the recorder lost events",
    "empty": "has ranges that hold no memory event, though a backward makes gradients: the recorder did not see "
             "its allocations",
}
_ORDER = ("forward", "zero_grad", "backward", "optimizer")


def _phase(name: str) -> str:
    return "optimizer" if name.startswith(TORCH_STEP) else name[len(PREFIX):] if name.startswith(PREFIX) else name


def _device_trace(snapshot: dict) -> list:
    traces = snapshot.get("device_traces") or []
    device = str((snapshot.get("phasemem") or {}).get("device") or "")
    index = int(device.split(":")[1]) if device.startswith("cuda:") else 0
    return traces[index] if index < len(traces) else []


def lost(snapshot: dict, calls: dict[tuple[str, int], int], home: int, source: str,
         max_entries: int | None = None) -> list[dict]:
    """The phases this recording lost, as ``[{"range", "phase", "calls", "recorded", "off_thread",
    "cause"}]`` ([] when it holds what the hooks saw); ``cause`` is one of ``CAUSES``.

    ``calls`` is ``{(range name, thread): n}`` opened during the recording, ``home`` the thread that
    started it, ``source`` ``"cuda"`` or ``"cpu-profiler"``. A CUDA trace that filled ``max_entries``
    dropped its oldest events and ranges by design: nothing is claimed from its counts or its ranges."""
    annotations = snapshot.get("external_annotations") or []
    starts = Counter(TORCH_STEP if a["name"].startswith(TORCH_STEP) else a["name"]
                     for a in annotations if a.get("stage") == "START")
    total: Counter[str] = Counter()
    off: Counter[str] = Counter()
    for (name, thread), n in calls.items():
        total[name] += n
        if thread != home:
            off[name] += n
    trace = _device_trace(snapshot)
    wrapped = max_entries is not None and bool(max_entries) and source == "cuda" and len(trace) >= max_entries
    # A CUDA recording without a single range may be one whose settings record none (not measured for
    # every torch and context): ranges are then no evidence either way. The CPU profiler always records
    # its own thread's.
    counted = source != "cuda" or bool(annotations)
    out = []
    for name in sorted(total):
        n, recorded = total[name], starts.get(name, 0)
        entry = {"range": name, "phase": _phase(name), "calls": n, "recorded": recorded, "off_thread": off[name]}
        if source == "cpu-profiler" and off[name]:
            out.append({**entry, "cause": "thread"})
        elif recorded < n and not wrapped and counted:
            out.append({**entry, "cause": "missing"})
        elif (name in MUST_ALLOCATE and recorded and trace and not wrapped
              and not _events_inside(trace, annotations, name)):
            out.append({**entry, "cause": "empty"})
    return out


def _events_inside(trace: list, annotations: list, name: str) -> bool:
    opened, spans = [], []
    for a in annotations:
        if a["name"] != name:
            continue
        if a["stage"] == "START":
            opened.append(a["time_us"])
        elif opened:
            spans.append((opened.pop(), a["time_us"]))
    times = sorted(e["time_us"] for e in trace if e.get("action") in ("alloc", "free_requested", "free_completed"))
    # Only ranges inside the trace's own time span can be judged (a buffer that dropped its oldest
    # events keeps ranges older than them).
    spans = [(t0, t1) for t0, t1 in spans if times and t0 >= trace[0].get("time_us", 0)]
    if not spans:
        return True
    return any(bisect.bisect_right(times, t1) > bisect.bisect_left(times, t0) for t0, t1 in spans)


def sentence(entries: list[dict]) -> str:
    """The lost phases as one line, for the warning and the report's note.

    Example:
        >>> sentence([{"phase": "backward", "calls": 3, "recorded": 0, "off_thread": 3, "cause": "thread"}])
        'this recording lost phases: backward (3 call(s), 0 recorded) ran on another thread ...'
    """
    def key(e: dict) -> tuple:
        return (_ORDER.index(e["phase"]) if e["phase"] in _ORDER else len(_ORDER), e["phase"])

    parts = []
    for cause, why in CAUSES.items():
        these = sorted((e for e in entries if e.get("cause") == cause), key=key)
        if these:
            said = ", ".join(f"{e['phase']} ({e['calls']} call(s), {e['recorded']} recorded)" for e in these)
            parts.append(f"{said} {why}")
    return "this recording lost phases: " + "; ".join(parts) + "; its report shows only part of the loop"
