"""The labels a program gave its allocations through torch (the trace floor), as torch writes them into
every trace entry (``user_metadata``): one naming a phase is a mark, one naming a category is set
beside phasemem's, the rest are kept for the page's hover (docs/torch_labels.md).

Example:
    >>> labels = from_values([e.get("user_metadata", "") for e in snapshot["device_traces"][0]])
    >>> phase_runs(labels)[:2]
    [('forward', 0, 180), ('backward', 181, 735)]
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ..vocab import CATEGORIES, PHASES

#: Phases a label can name, as phasemem names them (``vocab.PHASES`` but "other"), and the other
#: spellings taken for them. A label names a phase only when it is exactly one of these (case,
#: spaces, hyphens and underscores aside): ``"phase=backward"`` (the shared gpu-snapshots' sticky
#: label, docs/trace.md) names none.
PHASE_LABELS = {"forward": "forward", "loss": "loss", "zero_grad": "zero_grad", "backward": "backward",
                "optimizer": "optimizer", "optimizer_step": "optimizer"}

#: Categories a label can name (``vocab.CATEGORIES`` but "other", which claims nothing), by every
#: spelling taken for them.
CATEGORY_LABELS = {
    **dict.fromkeys(("parameter", "parameters", "params", "param", "weights"), "parameter"),
    **dict.fromkeys(("gradient", "gradients", "grads"), "gradient"),
    **dict.fromkeys(("optimizer_state", "optimizer_states", "optim_state", "opt_state"), "optimizer_state"),
    **dict.fromkeys(("activation", "activations"), "activation"),
    **dict.fromkeys(("temporary", "temporaries", "temp", "scratch"), "temporary"),
    **dict.fromkeys(("input", "inputs", "batch"), "input"),
}
#: Labels that name phases are marks only where at least this many phases are named: a label is
#: sticky (it stays on its thread until the next call), so one phase named alone says where that
#: phase began, never where it ended. The real torch 2.11 snapshot (../shared/torch-labels) names
#: four; the shared gpu-snapshots carry one sticky label ("phase=backward", no phase name) on the
#: next step's forward.
MIN_PHASES_NAMED = 2

#: What ``phasemem annotate`` writes into ``user_metadata`` (annotate.py): phasemem's own words,
#: never read back as a label (analysing a labelled copy gives the original's report).
OWN_PREFIX = "phasemem:"


def normal(text: str) -> str:
    """A label as the tables above key it: lower case, words joined by '_'."""
    return "_".join(text.strip().lower().replace("-", " ").replace("_", " ").split())


def phase_of(text: str) -> str | None:
    """The phase a label names, else None.

    >>> phase_of("Forward"), phase_of("zero-grad"), phase_of("phase=backward")
    ('forward', 'zero_grad', None)
    """
    return PHASE_LABELS.get(normal(text))


def category_of(text: str) -> str | None:
    """The category a label names, else None.

    >>> category_of("Optimizer state"), category_of("params"), category_of("kv cache")
    ('optimizer_state', 'parameter', None)
    """
    return CATEGORY_LABELS.get(normal(text))


def as_text(value) -> str:
    """A ``user_metadata`` value as text: a string as it is, anything else (a newer torch may keep a
    dict) as JSON; None and "" are no label."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(value)


class Interner(dict):
    """Label text → its number among a trace's labels (-1: no label). ``map(interner.__getitem__,
    values)`` numbers a column at C speed; a text is looked at once, when first met."""

    def __init__(self):
        super().__init__({"": -1})
        self.texts: list[str] = []
        self._by_text: dict[str, int] = {}

    def __missing__(self, key):
        text = as_text(key)
        if not text or text.startswith(OWN_PREFIX):
            code = -1
        else:
            code = self._by_text.setdefault(text, len(self.texts))
            if code == len(self.texts):
                self.texts.append(text)
        if isinstance(key, str):  # a dict is no key; it is looked at again each time (rare)
            self[key] = code
        return code

    def codes(self, values) -> np.ndarray:
        """The number of each of ``values``."""
        values = list(values)
        try:
            return np.fromiter(map(self.__getitem__, values), np.int32, len(values))
        except TypeError:  # an unhashable value (a dict): one at a time
            return np.array([self[v] if isinstance(v, str) or v is None else self.__missing__(v) for v in values],
                            np.int32).reshape(-1)


@dataclass(frozen=True)
class TorchLabels:
    """The trace entries that carry a label, and which: ``texts[text[k]]`` is entry ``event[k]``'s."""

    event: np.ndarray  # int64, ascending: entries whose user_metadata is a label
    text: np.ndarray  # int32 into ``texts``
    texts: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.event)

    def __eq__(self, other) -> bool:
        return (isinstance(other, TorchLabels) and self.texts == other.texts and np.array_equal(self.event, other.event)
                and np.array_equal(self.text, other.text))

    def text_at(self, events: np.ndarray) -> list[str]:
        """The label of each of ``events`` ("" where it has none)."""
        events = np.asarray(events, np.int64)
        pos = np.searchsorted(self.event, events)
        hit = (pos < len(self.event)) & (self.event[np.minimum(pos, len(self.event) - 1)] == events) \
            if len(self.event) else np.zeros(len(events), bool)
        return [self.texts[int(self.text[p])] if h else "" for p, h in zip(pos.tolist(), hit.tolist())]

    def phase_codes(self) -> np.ndarray:
        """Per text, the ``PHASES`` code of the phase it names (0 where none)."""
        return np.array([PHASES.index(p) if (p := phase_of(t)) else 0 for t in self.texts], np.int8).reshape(-1)

    def category_codes(self) -> np.ndarray:
        """Per text, the ``CATEGORIES`` code of the category it names (-1 where none)."""
        return np.array([CATEGORIES.index(c) if (c := category_of(t)) else -1 for t in self.texts],
                        np.int8).reshape(-1)


def from_codes(codes: np.ndarray, texts: list[str], first: int = 0) -> TorchLabels | None:
    """The labels of a column numbered by an ``Interner`` (``codes``: one per entry, from entry
    ``first``), None where no entry carries one."""
    event = np.flatnonzero(codes >= 0)
    if not len(event):
        return None
    # texts numbered by first use, whichever order a reader met them in (the decoder: a window at a time)
    used, at, inv = np.unique(codes[event], return_index=True, return_inverse=True)
    rank = np.empty(len(used), np.int32)
    rank[np.argsort(at, kind="stable")] = np.arange(len(used), dtype=np.int32)
    order = used[np.argsort(at, kind="stable")]
    return TorchLabels((event + first).astype(np.int64), rank[inv.reshape(-1)], tuple(texts[k] for k in order.tolist()))


def from_values(values: list) -> TorchLabels | None:
    """The labels of one device's ``user_metadata`` values, one per trace entry; None where none
    carries one (every snapshot recorded without ``_set_memory_metadata``)."""
    interner = Interner()
    return from_codes(interner.codes(values), interner.texts)


def phase_runs(labels: TorchLabels | None) -> list[tuple[str, int, int]]:
    """(phase, first entry, last entry) of every run of entries whose label names one phase, in
    order, with the unlabelled entries between two of a run (why: docs/torch_labels.md). Empty where
    fewer than MIN_PHASES_NAMED phases are named.

    >>> phase_runs(from_values(["forward", "forward", "backward", "", "", "backward", "optimizer"]))
    [('forward', 0, 1), ('backward', 2, 5), ('optimizer', 6, 6)]
    """
    if labels is None or not len(labels):
        return []
    code = labels.phase_codes()[labels.text]
    named = code > 0
    if len(np.unique(code[named])) < MIN_PHASES_NAMED:
        return []
    ev, code = labels.event[named], code[named]
    cut = np.flatnonzero(np.r_[True, code[1:] != code[:-1]])
    last = np.r_[cut[1:], len(code)] - 1
    return [(PHASES[c], a, z) for c, a, z in zip(code[cut].tolist(), ev[cut].tolist(), ev[last].tolist())]
