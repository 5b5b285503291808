"""Categories against what is known of each model: parameter bytes, gradients, optimizer state.

For every real H200 snapshot with metadata (fixtures/*.pkl.xz): phasemem's parameter bytes at the
peak, the most gradient bytes alive at any event, and the optimizer state alive at the end of the
trace, against the model's parameter bytes (from the recording script) and the optimizer's known
state size (AdamW 2×, momentum SGD 1×). Prints the table for docs/categories.md.

    python3 docs/eval_categories.py [SNAPSHOT ...]     # e.g. fixtures/heldout*/*.pkl.xz
"""
from __future__ import annotations

import lzma
import pickle
import sys
from pathlib import Path

import numpy as np

import phasemem
from phasemem.units import format_bytes

ROOT = Path(__file__).resolve().parents[1]


def state_multiple(optimizer: str | None) -> int | None:
    if not optimizer:
        return 0
    if "Adam" in optimizer:
        return 2
    if "SGD" in optimizer:
        return 1 if "momentum" in optimizer else 0
    return None


def main(paths: list[str]) -> int:
    print("| snapshot | optimizer | parameters (model) | parameter | gradient (max alive) | optimizer state (end) "
          "| expected state | worst error |")
    print("|---|---|---|---|---|---|---|---|")
    errors = []
    for path in [Path(x) for x in paths] or sorted((ROOT / "fixtures").glob("*.pkl.xz")):
        snap = pickle.loads(lzma.decompress(path.read_bytes()))
        meta = snap["phasemem"]["meta"]
        r = phasemem.analyze(snap)
        p = meta["param_bytes"]
        every = r.analysis.categories.at_level(np.arange(r.n_events), r.analysis.timeline.delta)
        cats = dict(zip(("parameter", "gradient", "optimizer_state"), range(3)))
        param = r.categories()["parameter"]
        grad = int(every[:, cats["gradient"]].max())
        state_end = int(every[-1, cats["optimizer_state"]])
        mult = state_multiple(meta.get("optimizer"))
        trained = meta.get("optimizer") is not None
        errs = [abs(param - p) / p]
        if trained:
            errs.append(abs(grad - p) / p)
        if mult:
            errs.append(abs(state_end - mult * p) / (mult * p))
        # listed, not counted: a wrapped trace lost part of the run; a CUDA-graphed model's gradients
        # and static buffers were allocated at capture, before recording
        listed_only = "wrapped" in path.name or "cudagraph" in path.name
        worst = max(errs)
        if not listed_only:
            errors.append(worst)
        exp = f"{mult}× = {format_bytes(mult * p)}" if mult else ("none" if mult == 0 else "?")
        print(f"| {path.name.split('.')[0]} | {meta.get('optimizer') or '—'} | {format_bytes(p)} | {format_bytes(param)} "
              f"| {format_bytes(grad) if trained else '—'} | {format_bytes(state_end)} | {exp} | {worst:.1%} |")
    within = sum(e <= 0.02 for e in errors)
    print(f"\nwithin 2 %: {within} of {len(errors)} (the wrapped and CUDA-graph traces are listed, not counted)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
