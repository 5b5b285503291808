"""PyTorch's own labels of what an allocation is, where a snapshot carries them (the trace floor).

Recent PyTorch can say what an allocation is itself, two ways (docs/trace.md has the sources):

- **component tracking** (PyTorch PRs 182387 and 182388, ``torch.accelerator.memory.component_tracking``):
  a thread-local component type (parameter, buffer, gradient, activation, optimizer state, temp,
  other) is set by global module and optimizer hooks and stamped on every allocation the allocator
  makes; ``memory_stats()`` sums it as ``component_bytes.<component>.<metric>``. Its rule
  (``torch/cuda/memory_component_tracker.py``): ACTIVATION for whatever a module's forward allocates,
  TEMP for whatever a module's backward allocates, OPTIMIZER_STATE for whatever ``Optimizer.step``
  allocates, OTHER elsewhere; parameters, buffers and gradients are retagged afterwards by address.
  A trace entry carries the stamp as ``"component"``, the name as ``memory_stats`` writes it.
- **post-facto annotation** (PR 190575, ``torch.cuda.memory._annotate_memory(ptr, metadata)`` /
  ``_annotate_tensor(t, metadata)``): an ``"annotate"`` trace entry at the live allocation's base
  address, with the metadata in ``"user_metadata"``; annotations accumulate, the allocation's own
  entry is never changed. Metadata that names a component (``"gradient"``, or JSON with a
  ``"component"`` key, as ``_set_memory_metadata`` accepts dicts since PR 193432) is a label.

``read`` turns them into columns: which allocation event each label belongs to, and the label.

Example:
    >>> labels = read(snapshot["device_traces"][0])
    >>> labels is None or COMPONENTS[labels.code[0]]
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import repeat

import numpy as np

#: Component names, as ``memory_stats`` writes them (``component_bytes.<name>.current``), in code order.
COMPONENTS = ("parameter", "buffer", "gradient", "activation", "optimizer_state", "temp", "other")
#: The other spellings met: the enum's member names and ``str(ComponentType.X)``.
_ALIASES = {"temporary": "temp", "optimizer state": "optimizer_state", "optimizer": "optimizer_state"}
#: Where a label came from.
STAMPED, ANNOTATED = 0, 1
#: Trace-entry field of the component stamp.
FIELD = "component"


@dataclass(frozen=True)
class TorchLabels:
    """One row per label: the allocation event it belongs to, its component code (``COMPONENTS``), and
    whether the allocator stamped it (STAMPED) or code annotated the allocation later (ANNOTATED)."""

    event: np.ndarray  # int64: the alloc event of the labelled allocation
    code: np.ndarray  # int8 into COMPONENTS
    source: np.ndarray  # int8: STAMPED or ANNOTATED

    def __len__(self) -> int:
        return len(self.event)


def component(value) -> int | None:
    """The COMPONENTS code a stamp or an annotation's metadata names, else None.

    >>> component("ComponentType.OPTIMIZER_STATE"), component('{"component": "gradient"}'), component("layer.3")
    (4, 2, None)
    """
    if isinstance(value, dict):
        value = value.get(FIELD)
    if not isinstance(value, str) or not value:
        return None
    text = value.strip()
    if text.startswith("{"):
        try:
            return component(json.loads(text))
        except ValueError:
            return None
    name = text.rsplit(".", 1)[-1].lower() if text.startswith("ComponentType.") else text.lower()
    name = _ALIASES.get(name, name)
    return COMPONENTS.index(name) if name in COMPONENTS else None


def read(events: list) -> TorchLabels | None:
    """The labels in one device's trace entries (``snapshot["device_traces"][d]``), None where there are
    none (every snapshot torch 2.13 or older writes)."""
    n = len(events)
    stamped = np.flatnonzero(np.fromiter(map(dict.__contains__, events, repeat(FIELD)), bool, n)) if n else []
    annotated = [i for i in range(n) if events[i].get("action") == "annotate"] if _has_annotations(events) else []
    if not len(stamped) and not annotated:
        return None
    ev, code, src = [], [], []
    for i in np.asarray(stamped).tolist():
        c = component(events[i].get(FIELD))
        if c is not None and events[i].get("action") == "alloc":
            ev.append(i), code.append(c), src.append(STAMPED)
    if annotated:
        # an annotation names the allocation alive at its address: the latest alloc there before it
        born: dict[int, int] = {}
        todo = set(annotated)
        for i, e in enumerate(events):
            act = e.get("action")
            if act == "alloc":
                born[e.get("addr")] = i
            elif i in todo:
                c = component(e.get("user_metadata"))
                a = born.get(e.get("addr"))
                if c is not None and a is not None:
                    ev.append(a), code.append(c), src.append(ANNOTATED)
            elif act in ("free_completed", "free"):
                born.pop(e.get("addr"), None)
    if not ev:
        return None
    order = np.argsort(np.asarray(ev, np.int64), kind="stable")
    return TorchLabels(np.asarray(ev, np.int64)[order], np.asarray(code, np.int8)[order],
                       np.asarray(src, np.int8)[order])


def _has_annotations(events: list) -> bool:
    return any(map("annotate".__eq__, map(dict.get, events, repeat("action"))))
