"""Precision and recall of phasemem's pattern detectors on real H200 snapshots.

Ground truth is derived without the detectors: from the phase markers recorded with each
snapshot, the model dimensions in its metadata, and the stack frames of the raw events. The
detectors then run on a copy with every stack frame removed. Writes the table for
docs/patterns.md to stdout.

    python3 docs/eval_patterns.py [SNAPSHOT ...]     # default: fixtures/*.pkl.xz and ../shared/gpu-snapshots
"""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers.pattern_truth import KINDS, detected, load, truth  # noqa: E402  (the truth lives with the tests)


def main(paths: list[str]) -> int:
    files = [Path(p) for p in paths] or sorted((ROOT / "fixtures").glob("*.pkl.xz")) + sorted(
        (ROOT.parent / "shared" / "gpu-snapshots").glob("*.pkl.xz"))
    tp, fp, fn = Counter(), Counter(), Counter()
    misses = []
    for path in files:
        snap, meta, prefix = load(path)
        gt, scored = truth(snap, meta, prefix)
        det = detected(snap, prefix)
        for kind in KINDS:
            for step in scored:
                g, d = gt[kind, step], det[kind, step]
                tp[kind] += min(g, d)
                fp[kind] += max(d - g, 0)
                fn[kind] += max(g - d, 0)
                if g != d:
                    misses.append(f"{path.name}: step {step} {kind}: truth {g}, detected {d}")
    print(f"{len(files)} snapshots: {', '.join(p.name.split('.')[0] for p in files)}\n")
    print("| kind | true + | false + | missed | precision | recall |")
    print("|---|---|---|---|---|---|")
    for kind in KINDS:
        t, p_, m = tp[kind], fp[kind], fn[kind]
        prec = f"{t / (t + p_):.2f}" if t + p_ else "—"
        rec = f"{t / (t + m):.2f}" if t + m else "—"
        print(f"| `{kind}` | {t} | {p_} | {m} | {prec} | {rec} |")
    if misses:
        print("\nDisagreements:\n" + "\n".join(f"- {m}" for m in misses))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
