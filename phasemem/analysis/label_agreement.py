"""What the program's own labels of its allocations say (``phasemem.read.torch_labels``), set beside
phasemem's reading: how far the categories agree and which is right where not, the phases the labels
marked, and the labels that name neither (the rules: docs/torch_labels.md).

Example:
    >>> la = agreement(report.analysis)
    >>> la is None or la.agreed_bytes <= la.labelled_bytes
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from ..read.torch_labels import phase_runs
from ..vocab import CATEGORIES, PHASES
from .core import Analysis


@dataclass(frozen=True)
class Disagreement:
    label: str  # the category the program's label names
    phasemem: str  # phasemem's category
    allocations: int
    bytes: int
    right: str  # "phasemem", "label", or "unknown"
    why: str


@dataclass(frozen=True)
class LabelAgreement:
    """The program's labels (``user_metadata``) against phasemem's reading of the same allocations."""

    labelled: int  # allocations whose label names a category
    labelled_bytes: int
    agreed_bytes: int  # of them, where phasemem's category is the one the label names
    #: bytes the labels give each category, over the allocations labelled so
    label_bytes: dict = field(default_factory=dict)
    disagreements: list = field(default_factory=list)  # Disagreement, most bytes first
    #: the phases the labels name, read as marks (none where fewer than MIN_PHASES_NAMED are named)
    phases: list = field(default_factory=list)
    #: label → {"allocations", "bytes"} for labels that name neither a phase nor a category (shown on
    #: the page's hover), most bytes first
    kept: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def _verdict(label: str, ours: str) -> tuple[str, str]:
    if ours == "temporary":
        return "phasemem", ("freed soon after it was made: scratch of the work the label named (a label stays on "
                            "its thread, and every block made meanwhile carries it)")
    if ours == "other":
        return "label", "phasemem's rules make no claim on it; the program named it"
    return "unknown", "the label names what its thread was doing, phasemem what the block did; nothing decides"


def agreement(an: Analysis) -> LabelAgreement | None:
    """The program's labels of the trace's allocations against phasemem's reading; None where no
    entry carries a label."""
    labels = an.trace.torch_labels
    if labels is None or not len(labels):
        return None
    curves = an.categories
    own = np.flatnonzero(curves.alloc >= 0)
    order = own[np.argsort(curves.alloc[own], kind="stable")]
    # the label of each allocation's alloc entry (the thread that made it)
    pos = np.searchsorted(curves.alloc[order], labels.event)
    found = (pos < len(order)) & (curves.alloc[order[np.minimum(pos, len(order) - 1)]] == labels.event)
    idx = order[pos[found]]
    text = labels.text[found]
    size = curves.size[idx].astype(np.int64)
    cat = labels.category_codes()[text]
    named = cat >= 0
    ours, theirs, nsize = curves.codes[idx][named], cat[named], size[named]
    agree = ours == theirs
    rows = []
    for t, o in sorted({(int(a), int(b)) for a, b in zip(theirs[~agree], ours[~agree])}):
        m = ~agree & (theirs == t) & (ours == o)
        right, why = _verdict(CATEGORIES[t], CATEGORIES[o])
        rows.append(Disagreement(CATEGORIES[t], CATEGORIES[o], int(m.sum()), int(nsize[m].sum()), right, why))
    rows.sort(key=lambda r: -r.bytes)
    plain = ~named & (labels.phase_codes()[text] == 0)
    kept: dict[str, dict] = {}
    for k in np.unique(text[plain]).tolist():
        m = plain & (text == k)
        kept[labels.texts[k]] = {"allocations": int(m.sum()), "bytes": int(size[m].sum())}
    return LabelAgreement(
        labelled=int(named.sum()), labelled_bytes=int(nsize.sum()), agreed_bytes=int(nsize[agree].sum()),
        label_bytes={CATEGORIES[c]: int(nsize[theirs == c].sum()) for c in np.unique(theirs).tolist()},
        disagreements=rows, phases=sorted({p for p, _, _ in phase_runs(labels)}, key=PHASES.index),
        kept=dict(sorted(kept.items(), key=lambda kv: -kv[1]["bytes"])))
