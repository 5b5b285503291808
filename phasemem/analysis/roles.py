"""What a distributed wrapper holds in one rank's trace (FSDP2's unsharded parameters, all-gather and
reduce-scatter buffers and sharded gradients, DDP's gradient buckets), told apart only by evidence the
trace carries: stack frames, else FSDP2's own ranges; without either, nothing is claimed
(docs/distributed.md). Pure functions of the trace, its timeline and its steps.

Example:
    >>> an = report.analysis
    >>> found = roles(an.trace, an.timeline, an.labels, an.step_of, backward_ends(report.steps, report.n_events))
    >>> found.wrapper, found.evidence
    ('fsdp2', 'stack frames')
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..model import Step
from ..read.trace import Trace
from ..vocab import P
from .timeline import Timeline

#: What distributed wrappers hold (the codes are positions here; -1: none of them); their names for
#: people: vocab.ROLE_NAMES.
ROLES = ("sharded_parameters", "unsharded_parameters", "all_gather_buffers", "reduce_scatter_buffers",
         "sharded_gradients", "ddp_buckets")
R = {name: code for code, name in enumerate(ROLES)}
FSDP2_ROLES = ROLES[:5]
DDP_ROLES = ("ddp_buckets",)
_FSDP_DIR = "/distributed/fsdp/_fully_shard/"
_DDP_FILE = "/nn/parallel/distributed.py"
#: FSDP2's functions that allocate; scanning a stack from the innermost frame out, the first one named
#: here decides (torch 2.11 and 2.13 source; heldout4_gpt_fsdp2_bf16, recorded on the H200, has the
#: first five as frames). ``_to_dtype_if_needed`` and ``allocate`` serve both directions, so the
#: caller decides.
_FSDP_FUNCTIONS = {"alloc_storage": "unsharded_parameters", "init_all_gather_outputs": "unsharded_parameters",
                   "all_gather_inputs": "all_gather_buffers", "foreach_reduce": "reduce_scatter_buffers",
                   "foreach_all_gather": "all_gather_buffers", "alloc_all_gather_outputs": "unsharded_parameters",
                   "_get_param_all_gather_inputs": "all_gather_buffers",
                   "foreach_all_gather_copy_out": "all_gather_buffers"}
#: FSDP2's own ranges around the same work (torch 2.13 emits all three; torch 2.11 on the H200 only the
#: last). Every thread's allocations inside count: on a 2-rank gloo run that adds gloo's own
#: all-gather buffers (its worker thread), and 48 B of an all-reduce's scalars (docs/distributed.md).
_FSDP_RANGES = ((re.compile(r"FSDP::all_gather(?: |$)"), "all_gather_buffers"),
                (re.compile(r"FSDP::all_gather_copy_out\b"), "unsharded_parameters"),
                (re.compile(r"FSDP::post_backward_reduce\b"), "reduce_scatter_buffers"))
#: Ranges that show DDP is there without saying which bytes are its own.
_DDP_RANGES = re.compile(r"DistributedDataParallel\.forward|torch\.distributed\.ddp\.")


@dataclass
class Roles:
    """One rank's wrapper (``"ddp"``, ``"fsdp2"`` or None), what told its roles apart (``"stack
    frames"``, ``"FSDP2's ranges"``, both, or ``"none"``), and the role code of every allocation, in
    ``Lifetimes`` order (-1: no role; pre-existing allocations have none)."""

    wrapper: str | None
    evidence: str
    codes: np.ndarray

    def known(self) -> bool:
        """Whether the trace can show this wrapper's roles: FSDP2's with frames or its ranges; DDP's
        buckets only where frames show them being made (else they predate the recording, or no frame
        was recorded)."""
        if self.wrapper == "fsdp2":
            return self.evidence != "none"
        return self.wrapper == "ddp" and bool((self.codes == R["ddp_buckets"]).any())


def roles(trace: Trace, timeline: Timeline, labels: np.ndarray, step_of: np.ndarray, backward_end: np.ndarray) -> Roles:
    """The wrapper and the role of every allocation: ``labels`` and ``step_of`` are each event's phase
    code and step position (``Analysis.labels``, ``Analysis.step_of``), ``backward_end`` from
    ``backward_ends``."""
    life = timeline.lifetimes
    stack_role, fsdp_frames, ddp_frames = _stack_roles(trace)
    has = trace.stack >= 0
    role = np.append(stack_role, -1)[trace.stack]  # a stack id of -1 (no frames) picks the -1 appended
    names = set(trace.markers.name)
    fsdp_ranges = any(p.match(n) for n in names for p, _ in _FSDP_RANGES)
    for code, first, stop in _range_events(trace):
        frameless = ~has[first:stop]
        role[first:stop][frameless] = code
    wrapper = "fsdp2" if fsdp_frames or fsdp_ranges else (
        "ddp" if ddp_frames or any(_DDP_RANGES.match(n) for n in names) else None)
    codes = np.full(len(life), -1, np.int64)
    made = life.alloc_event >= 0
    codes[made] = role[life.alloc_event[made]]
    _gradients_of_reduce(life, codes, labels, step_of, backward_end)
    evidence = " and ".join(w for w, on in (("stack frames", has.any()), ("FSDP2's ranges", fsdp_ranges)) if on)
    return Roles(wrapper, evidence or "none", codes)


def backward_ends(steps: list[Step], n_events: int) -> np.ndarray:
    """Per step, its backward's last event (its last event without one), then ``n_events`` for events
    outside every step (indexed by step position, -1 last)."""
    ends = [s.phases["backward"].end_event if "backward" in s.phases and s.phases["backward"].end_event is not None
            else s.end_event for s in steps]
    return np.array(ends + [n_events], np.int64)


def role_bytes(timeline: Timeline, codes: np.ndarray, event: int) -> tuple[dict[str, int], dict[str, int]]:
    """Bytes of each role alive at the level ``event`` reaches, and the most each held at once."""
    life, n = timeline.lifetimes, len(timeline.delta)
    point = event if timeline.active_after[event] < timeline.active_before[event] else event + 1  # after an alloc, before a free: as categories
    at, most = {}, {}
    for c, r in enumerate(ROLES):
        m = codes == c
        d = np.zeros(n + 2, np.int64)
        np.add.at(d, life.alloc_event[m] + 1, life.size[m])
        np.add.at(d, life.free_event[m] + 1, -life.size[m])
        alive = np.cumsum(d)
        at[r], most[r] = int(alive[point]), int(alive.max(initial=0))
    return at, most


def _stack_roles(trace: Trace) -> tuple[np.ndarray, bool, bool]:
    """Role code per stack (-1 none), and whether any frame is FSDP2's, any DDP's."""
    out = np.full(len(trace.stacks), -1, np.int64)
    fsdp = ddp = False
    for k, ids in enumerate(trace.stacks):
        py = [f for f in (trace.frames[i] for i in ids) if f[0].endswith(".py")]
        for fn, _, name in py:
            if _FSDP_DIR in fn:
                fsdp = True
                if name in _FSDP_FUNCTIONS:
                    out[k] = R[_FSDP_FUNCTIONS[name]]
                    break
        # Made by C++ called straight from DDP's _pre_forward: the reducer's bucket (re)build.
        if py and _DDP_FILE in py[0][0] and py[0][2] == "_pre_forward":
            out[k] = R["ddp_buckets"]
        ddp = ddp or any(_DDP_FILE in f[0] for f in py)
    return out, fsdp, ddp


def _range_events(trace: Trace):
    """(role code, first event, stop event) of each FSDP2 range: START <= time_us <= END."""
    open_: dict[str, list[int]] = {}
    t = trace.time_us
    for name, start, when in zip(trace.markers.name, trace.markers.start.tolist(), trace.markers.time_us.tolist()):
        code = next((R[r] for p, r in _FSDP_RANGES if p.match(name)), None)
        if code is None:
            continue
        if start:
            open_.setdefault(name, []).append(when)
        elif open_.get(name):
            yield code, int(np.searchsorted(t, open_[name].pop(), "left")), int(np.searchsorted(t, when, "right"))


def _gradients_of_reduce(life, codes: np.ndarray, labels: np.ndarray, step_of: np.ndarray,
                         backward_end: np.ndarray) -> None:
    """What FSDP2's reduce-scatter makes and keeps past its step's backward until a zero_grad frees it is
    the sharded gradient (in the last step, one kept to the end, where the step before left one of its
    size to zero_grad); the rest stay buffers (gloo's: docs/distributed.md)."""
    mine = np.flatnonzero(codes == R["reduce_scatter_buffers"])
    n, last = len(labels), len(backward_end) - 2  # backward_end ends with the entry for "no step"
    k = step_of[life.alloc_event[mine]]
    free = life.free_event[mine]
    kept = free > backward_end[k]
    zeroed = kept & (free < n) & (labels[np.minimum(free, n - 1)] == P["zero_grad"])
    before = Counter(life.size[mine[zeroed & (k == last - 1)]].tolist())
    tail = np.flatnonzero(kept & (free >= n) & (k == last))
    for j in tail.tolist():  # the last step's few survivors, each matched to one of the step before
        size = int(life.size[mine[j]])
        if before[size] > 0:
            before[size] -= 1
            zeroed[j] = True
    codes[mine[zeroed]] = R["sharded_gradients"]
