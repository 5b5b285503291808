"""Where PyTorch's own labels of an allocation (``phasemem.torch_labels``) and phasemem's category of it
(``phasemem.categories``) disagree, and which is right.

The two read different evidence. torch stamps what code was running when the block was made (a
module's forward: activation; a module's backward: temp; ``Optimizer.step``: optimizer state), and
retags parameters, buffers and gradients by address. phasemem reads what the block did: when it was
freed, and by whom. They part where a block's making and its use differ (docs/categories.md):

- made in backward and kept for the optimizer: torch's "temp" (everything a module's backward makes),
  phasemem's "gradient". phasemem: a block that outlives backward is no temporary.
- made in forward and freed before forward ends (a dequantised weight, attention scratch): torch's
  "activation", phasemem's "temporary". phasemem: it holds nothing for backward.
- made in the optimizer step and freed within it (foreach scratch): torch's "optimizer_state",
  phasemem's "temporary". phasemem: state outlives the step.
- a weight no gradient pairs with (a frozen base, a teacher): torch's "parameter", phasemem's
  "other" (its rule pairs weights with gradients). torch: it is a weight.
- a label the program wrote itself (``_annotate_memory``): the program knows; torch's label.

Example:
    >>> la = agreement(report.analysis)
    >>> la is None or la.agreed_bytes <= la.labelled_bytes
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from .analysis import Analysis
from .torch_labels import ANNOTATED, COMPONENTS
from .vocab import CATEGORIES

#: The phasemem category each torch component means (a buffer is "other" to phasemem, as are weights
#: no gradient pairs with).
MEANS = {"parameter": "parameter", "buffer": "other", "gradient": "gradient", "activation": "activation",
         "optimizer_state": "optimizer_state", "temp": "temporary", "other": "other"}

#: (torch's component, phasemem's category) → (who is right, why), for the disagreements a rule decides.
VERDICTS = {
    ("temp", "gradient"): ("phasemem", "made in backward and kept past it for the optimizer: a gradient; torch "
                                       "calls whatever a module's backward makes a temporary"),
    ("other", "gradient"): ("phasemem", "made in backward and kept past it for the optimizer: a gradient; torch's "
                                        "hooks had reset the component between two modules' backward"),
    ("activation", "temporary"): ("phasemem", "made in forward and freed before forward ended: it holds nothing "
                                              "for backward; torch calls whatever a module's forward makes an "
                                              "activation"),
    ("optimizer_state", "temporary"): ("phasemem", "made in the optimizer step and freed within it: scratch, not "
                                                   "state; torch calls whatever the step makes optimizer state"),
    ("temp", "activation"): ("phasemem", "kept from one phase run to a later one: not a temporary"),
    ("other", "activation"): ("phasemem", "made in forward or the loss (outside any module) and kept for "
                                          "backward: an activation"),
    ("other", "parameter"): ("phasemem", "alive from before recording to the end and paired with a gradient of "
                                         "its size: a parameter torch had not retagged"),
    ("activation", "other"): ("phasemem", "made in the first forward and never freed: a math library's workspace "
                                          "or a cache made once, no activation"),
    ("temp", "other"): ("phasemem", "made in backward and never freed: the autograd thread's math-library "
                                    "workspace, kept for good, no temporary"),
    ("parameter", "other"): ("torch", "a weight that no gradient pairs with (a frozen base, a teacher, an EMA): "
                                      "phasemem files those under other by its pairing rule"),
}


@dataclass(frozen=True)
class Disagreement:
    torch: str  # torch's component
    phasemem: str  # phasemem's category
    allocations: int
    bytes: int
    right: str  # "phasemem", "torch", or "unknown"
    why: str


@dataclass(frozen=True)
class LabelAgreement:
    """How far torch's labels and phasemem's categories agree, over the allocations torch labelled."""

    labelled: int  # allocations torch labelled
    labelled_bytes: int
    agreed_bytes: int
    annotated: int  # of them, labelled by the program itself (_annotate_memory)
    #: bytes torch gives each component, over the labelled allocations
    torch_bytes: dict = field(default_factory=dict)
    disagreements: list = field(default_factory=list)  # Disagreement, most bytes first

    def to_dict(self) -> dict:
        return asdict(self)


def agreement(an: Analysis) -> LabelAgreement | None:
    """torch's labels of the trace's allocations against phasemem's categories of the same allocations;
    None where the snapshot carries no labels."""
    labels = an.trace.torch_labels
    if labels is None or not len(labels):
        return None
    # the last label of each allocation wins: an annotation is written after the allocation's stamp
    last = np.flatnonzero(np.r_[labels.event[1:] != labels.event[:-1], True])
    ev, code, src = labels.event[last], labels.code[last], labels.source[last]
    curves = an.categories
    own = np.flatnonzero(curves.alloc >= 0)
    order = own[np.argsort(curves.alloc[own], kind="stable")]
    pos = np.searchsorted(curves.alloc[order], ev)
    found = (pos < len(order)) & (curves.alloc[order[np.minimum(pos, len(order) - 1)]] == ev)
    idx = order[pos[found]]
    ev, code, src = ev[found], code[found], src[found]
    size = curves.size[idx].astype(np.int64)
    ours = curves.codes[idx]
    theirs = np.array([CATEGORIES.index(MEANS[c]) for c in COMPONENTS], np.int8)[code]
    agree = ours == theirs
    rows = []
    for c, o in sorted({(int(a), int(b)) for a, b in zip(code[~agree], ours[~agree])}):
        m = ~agree & (code == c) & (ours == o)
        t, p = COMPONENTS[c], CATEGORIES[o]
        right, why = VERDICTS.get((t, p), ("phasemem", "torch's 'other' is no claim (made outside every module, "
                                                      "backward hook and optimizer step); phasemem reads the lifetime")
                                  if t == "other" else ("unknown", "no rule decides"))
        if (src[m] == ANNOTATED).all():
            right, why = "torch", "the program labelled it itself (_annotate_memory): it knows what it made"
        rows.append(Disagreement(t, p, int(m.sum()), int(size[m].sum()), right, why))
    rows.sort(key=lambda r: -r.bytes)
    return LabelAgreement(
        labelled=len(ev), labelled_bytes=int(size.sum()), agreed_bytes=int(size[agree].sum()),
        annotated=int((src == ANNOTATED).sum()),
        torch_bytes={COMPONENTS[c]: int(size[code == c].sum()) for c in np.unique(code).tolist()},
        disagreements=rows)
